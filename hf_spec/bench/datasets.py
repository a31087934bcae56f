"""Loaders for the packaged benchmark and training data sets.

Benchmark loaders (``load_mt_bench``, ``load_humaneval``, ``load_gsm8k``) return lists of
records, plain dicts with these keys:

- ``id``: a stable identifier (str)
- ``dataset``: the data-set name
- ``turns``: every user turn, in order (MT-bench has two; the others one)
- ``messages``: the first turn as a chat, ``[{"role": "user", "content": turns[0]}]``;
  a single-generation benchmark renders this with the tokenizer's chat template
- ``category`` / ``reference``: extra fields where the source has them (else ``None``)

Training loaders (``load_sharegpt``, ``load_chitchat``) return conversations, each a list
of ``{"role": "user" | "assistant" | "system", "content": str}``.

A missing data package raises :class:`hf_spec.resources.MissingPackageError` with the
pip command that installs it.
"""

from __future__ import annotations

import gzip
import json
import re
from typing import Any, Callable

from ..resources import packaged_data_path

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "BENCH_DATASETS",
    "load_mt_bench",
    "load_humaneval",
    "load_gsm8k",
    "load_sharegpt",
    "load_chitchat",
    "render_prompt",
    "bench_prompt_ids",
]

Record = dict[str, Any]
Conversation = list[dict[str, str]]


def _record(dataset: str, id_: Any, turns: list[str], category=None, reference=None) -> Record:
    return {
        "id": f"{dataset}/{id_}",
        "dataset": dataset,
        "turns": list(turns),
        "messages": [{"role": "user", "content": turns[0]}],
        "category": category,
        "reference": reference,
    }


def _read_jsonl(path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_mt_bench() -> list[Record]:
    """MT-bench: 80 questions with two user turns each (FastChat's question.jsonl)."""
    rows = _read_jsonl(packaged_data_path("mt_bench"))
    return [
        _record("mt_bench", r["question_id"], r["turns"], r.get("category"), r.get("reference"))
        for r in rows
    ]


def load_humaneval() -> list[Record]:
    """HumanEval: 164 Python function stubs; the stub is the user turn, as EAGLE evaluates it."""
    rows = _read_jsonl(packaged_data_path("humaneval"))
    return [
        _record("humaneval", r["task_id"].split("/")[-1], [r["prompt"]], reference=r["canonical_solution"])
        for r in rows
    ]


def load_gsm8k() -> list[Record]:
    """GSM8K test subset: the 100 original questions behind GSM-Symbolic's English templates."""
    directory = packaged_data_path("gsm8k")
    records = []
    for path in sorted(directory.glob("*.toml")):
        with open(path, "rb") as f:
            item = tomllib.load(f)
        records.append(_record("gsm8k", path.stem, [item["question"]], reference=item["answer"].strip()))
    return records


BENCH_DATASETS: dict[str, Callable[[], list[Record]]] = {
    "mt_bench": load_mt_bench,
    "humaneval": load_humaneval,
    "gsm8k": load_gsm8k,
}
"""The default benchmark sets (what ``hf-spec bench`` runs and ``hf-spec tune`` holds prompts aside from)."""

_BUGS = (("<=", "<"), (">=", ">"), (" + 1", " - 1"), ("==", "!="))


def load_code_edit() -> list[Record]:
    """Input-grounded code editing, built from HumanEval's reference solutions: even records ask to
    rewrite the function with type hints, odd ones to fix a bug injected into it (the first of
    ``<=``→``<``, ``>=``→``>``, ``+ 1``→``- 1``, ``==``→``!=`` that occurs; type hints if none does).
    Answers copy much of the prompt, as edits do in practice: the case context drafting is for."""
    records = []
    for i, r in enumerate(load_humaneval()):
        bug = next(((a, b) for a, b in _BUGS if a in r["reference"]), None) if i % 2 else None
        if bug is None:
            code = (r["turns"][0] + r["reference"]).strip("\n")
            turn = f"Rewrite this Python function with type hints, keeping its behaviour:\n\n```python\n{code}\n```"
        else:  # the bug goes into the solution, never into the docstring
            code = (r["turns"][0] + r["reference"].replace(bug[0], bug[1], 1)).strip("\n")
            turn = f"This Python function has a bug. Fix it and return the whole corrected function:\n\n```python\n{code}\n```"
        records.append(_record("code_edit", r["id"].split("/")[-1], [turn], reference=r["reference"]))
    return records


EXTRA_DATASETS: dict[str, Callable[[], list[Record]]] = {"code_edit": load_code_edit}
"""Opt-in benchmark sets (``hf-spec bench --datasets ... code_edit``)."""
ALL_DATASETS = {**BENCH_DATASETS, **EXTRA_DATASETS}

_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
}


def _iter_json_array_prefix(text: str):
    """Yield the complete elements of a JSON array whose text may be cut off mid-element."""
    decoder = json.JSONDecoder()
    separators = re.compile(r"[\s,]*")
    pos = separators.match(text, text.index("[") + 1).end()
    while pos < len(text) and text[pos] != "]":
        try:
            element, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated tail
        yield element
        pos = separators.match(text, pos).end()


def load_sharegpt(limit: int | None = None) -> list[Conversation]:
    """ShareGPT V3 (unfiltered, cleaned split) conversations, for drafter training.

    The packaged file is cut off mid-record; the complete prefix holds 17,671 records, of
    which those with no turns are dropped (17,545 remain). Roles are normalised to
    user/assistant/system. ``limit`` stops after that many conversations.
    """
    text = packaged_data_path("sharegpt").read_text(encoding="utf-8")
    conversations = []
    for element in _iter_json_array_prefix(text):
        turns = [
            {"role": _SHAREGPT_ROLES.get(t["from"], "user"), "content": t["value"]}
            for t in element.get("conversations", [])
        ]
        if turns:
            conversations.append(turns)
            if limit is not None and len(conversations) >= limit:
                break
    return conversations


def load_chitchat(limit: int | None = None) -> list[Conversation]:
    """Chit-Chat Challenge conversations (7,168), for drafter training.

    Each message group is one speaker's turn and groups always alternate speakers; the
    first speaker becomes ``user``, the second ``assistant``; a turn's utterances are
    joined with newlines.
    """
    with open(packaged_data_path("chitchat"), encoding="utf-8") as f:
        data = json.load(f)
    conversations = []
    for conv in data.values():
        conversations.append(
            [
                {"role": ("user", "assistant")[i % 2], "content": "\n".join(u["text"] for u in group)}
                for i, group in enumerate(conv["messages"])
            ]
        )
        if limit is not None and len(conversations) >= limit:
            break
    return conversations


def render_prompt(tokenizer, record: Record) -> list[int]:
    """Token ids of a record's first turn, rendered with the tokenizer's chat template.

    A tokenizer without a chat template (a base model) gets the raw turn text.
    """
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(record["messages"], add_generation_prompt=True, tokenize=True, return_dict=True)
        return list(out["input_ids"])
    return tokenizer(record["turns"][0])["input_ids"]


def bench_prompt_ids(tokenizer, per_set: int, skip: int = 0) -> list:
    """``per_set`` prompts of each benchmark data set as (1, n) id tensors (chat-templated),
    after skipping the first ``skip`` of each set (held-aside prompts for tuning)."""
    import torch

    return [
        torch.tensor([render_prompt(tokenizer, record)])
        for loader in BENCH_DATASETS.values()
        for record in loader()[skip : skip + per_set]
    ]
