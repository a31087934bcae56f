"""README.md's code runs: every ```python block, in order, in one shared namespace, on the packaged SmolLM2.

The blocks are a user's session: the first loads the packaged SmolLM2-135M-Instruct (float32) and a shipped drafter
from ``drafters/``, later blocks reuse its ``target``, ``tokenizer``, ``drafter``, ``input_ids`` and ``plain``. They
run from the repository root with the speed controller on, as a user gets it (the suite's conftest turns it off for
every other test), on the suite's one thread (about 30 s in all on a 2-core CPU). The model is the session's one
loaded SmolLM2 (conftest's ``smollm2``, shared with the integration tests). Each block is one test, named by
its README line; once a block fails, the later ones are skipped (they would fail on its missing names).

Skipped blocks: a ```python block whose preceding non-blank line is an HTML comment starting with
``<!-- readme-test: skip`` (invisible on GitHub; the rest of the comment says why) is not executed. The published
EAGLE-3 drafter's block is marked so: it needs the Hugging Face Hub and an 8B target. ```bash and other blocks are
never executed.

Besides, cheap checks that keep the README honest: at most 250 lines; the two fresh-machine commands CI runs
(``.ci/run``) verbatim; in the README and its guides in docs/, no "session N" history and no relative link to a
missing file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

import hf_spec
from hf_spec.demo import DEFAULT_TARGET

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SKIP_MARKER = "<!-- readme-test: skip"
INSTALL_AND_DEMO = 'pip install torch==2.13.0 && pip install -e ".[bench]" && hf-spec install-models && hf-spec demo'
INSTALL_AND_TEST = ('pip install torch==2.13.0 && pip install -e ".[dev,bench]" && hf-spec install-models && '
                    "python -m pytest -q")  # fmt: skip


@dataclass
class Block:
    line: int  # README line of the block's first code line
    code: str
    skip_reason: str | None


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of ``text``, each with the reason to skip it (None: run it)."""
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            previous = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            skip = None
            if previous.startswith(SKIP_MARKER):
                skip = previous.removeprefix(SKIP_MARKER).removesuffix("-->").strip(" :()") or "marked to skip"
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            blocks.append(Block(line=i + 2, code="\n".join(lines[i + 1 : end]) + "\n", skip_reason=skip))
            i = end
        i += 1
    return blocks


BLOCKS = python_blocks(README.read_text())


@pytest.fixture(scope="module")
def session(smollm2):
    """The README session's namespace (and the line of the first block that failed). While it runs, the README's
    ``hf_spec.load_packaged_model("smollm2-135m-instruct", dtype=torch.float32)`` returns the session's shared model
    (conftest's ``smollm2``, loaded by that same call) with a tokenizer of its own (the README changes its padding
    side); any other call loads as usual."""
    model, _ = smollm2
    load = hf_spec.load_packaged_model

    def load_shared(name, dtype=torch.bfloat16, attn_implementation="sdpa"):
        if (name, dtype, attn_implementation) != (DEFAULT_TARGET, torch.float32, "sdpa"):
            return load(name, dtype, attn_implementation)
        return model, AutoTokenizer.from_pretrained(hf_spec.packaged_model_path(name))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hf_spec, "load_packaged_model", load_shared)
        yield {"namespace": {"__name__": "readme"}, "failed": None}


@pytest.mark.integration
@pytest.mark.parametrize("block", BLOCKS, ids=[f"README.md:{b.line}" for b in BLOCKS])
def test_readme_python_block(block, session, monkeypatch):
    if block.skip_reason is not None:
        pytest.skip(f"README block at line {block.line}: {block.skip_reason}")
    if session["failed"] is not None:
        pytest.skip(f"the README block at line {session['failed']} failed")
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(hf_spec.generation, "SPEED_CONTROL_BY_DEFAULT", True)  # as users get it
    code = compile("\n" * (block.line - 1) + block.code, str(README), "exec")  # tracebacks name README lines
    try:
        exec(code, session["namespace"])
    except BaseException:
        session["failed"] = block.line
        raise


def test_readme_has_blocks_to_run():
    assert sum(b.skip_reason is None for b in BLOCKS) >= 5
    assert all(b.skip_reason for b in BLOCKS if "from_pretrained(\"yuhuili/" in b.code)  # Hub blocks are marked


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 250


def test_readme_keeps_the_fresh_machine_commands_ci_runs():
    text = README.read_text()
    assert INSTALL_AND_DEMO in text and INSTALL_AND_TEST in text
    ci = (ROOT / ".ci" / "run").read_text()
    for step in ("pip install --quiet torch==2.13.0", 'pip install --quiet -e ".[dev,bench]"', "hf-spec install-models",
                 "python -m pytest -q"):  # fmt: skip
        assert step in ci, f".ci/run no longer runs {step!r}: update the README's test command with it"


GUIDES = ("speed.md", "ngram.md", "training.md", "hub.md", "gpu.md")
"""The user guides the README links to (docs/architecture.md is checked by its owner)."""


@pytest.mark.parametrize("page", [README, *(ROOT / "docs" / g for g in GUIDES)], ids=lambda p: p.name)
def test_relative_links_exist(page):
    """Every relative link of the README and its guides points at a file that exists (benchmarks/ folders move)."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    missing = [t for t in targets if "://" not in t and not (page.parent / t).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"


@pytest.mark.parametrize("page", [README, *(ROOT / "docs" / g for g in GUIDES)], ids=lambda p: p.name)
def test_no_lab_notebook_history(page):
    """Users read current facts: no "session N" run history (dated records live in benchmarks/)."""
    assert not re.search(r"\bsession[ _]?\d+", page.read_text(), re.IGNORECASE)
