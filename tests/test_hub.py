"""Hub integration: remote code + auto_map, model cards, push_to_hub (against a loopback fake Hub),
and the legacy speculators ``eagle`` export (speculators 0.1-0.4; today's eagle3 export: test_speculators_export.py)."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import textwrap
from contextlib import contextmanager

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModel

import hf_spec
from conftest import FAMILIES, make_target, random_prompt
from hf_spec.hub import cards, export, remote_code
from hub_server import FakeHub

METHODS = ("eagle", "hass", "coral", "s2d", "parallelspec")

BENCH = {
    "schema": "hf-spec-bench/1",
    "machine": "2-core AVX512-bf16 CPU, torch 2.13",
    "date": "2026-11-20",
    "command": "hf-spec bench --drafter ./d --datasets mt_bench humaneval",
    "baseline": "plain greedy generate(), bf16",
    "results": [
        {"dataset": "mt_bench", "tau": 3.25, "speedup": 1.91, "tokens_per_s": 86.4},
        {"dataset": "humaneval", "tau": 3.8, "speedup": 2.2, "date": "2026-11-21"},
    ],
}


@contextmanager
def time_limit(seconds: int):
    """Fail instead of hanging if a network-ish test gets stuck."""

    def expire(signum, frame):
        raise TimeoutError(f"test exceeded {seconds}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def drafter_inputs(seed: int = 3, length: int = 7, hidden: int = 64, vocab: int = 128):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (1, length), generator=g), torch.randn(1, length, hidden, generator=g)


def drafter_output(drafter, ids, feats):
    with torch.no_grad():
        out = drafter(input_ids=ids, hidden_states=feats, output_logits=True)
    return out.last_hidden_state, out.logits


def front_matter(text: str) -> dict:
    assert text.startswith("---\n"), text[:80]
    end = text.index("\n---\n", 4)
    return yaml.safe_load(text[4:end])


# -- remote code + auto_map ----------------------------------------------------------------------
def test_save_writes_self_contained_remote_code(tmp_path, family):
    drafter = hf_spec.EagleDrafter.from_target(make_target(family), name_or_path=f"tiny-{family}")
    drafter.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"] == {"AutoConfig": "modeling_hf_spec.EagleDrafterConfig",
                                  "AutoModel": "modeling_hf_spec.EagleDrafter"}  # fmt: skip
    expected = remote_code.remote_code_files(hf_spec.EagleDrafter, hf_spec.EagleDrafterConfig)
    py_files = sorted(p.name for p in tmp_path.glob("*.py"))
    assert py_files == sorted(expected)
    for name in py_files:
        source = (tmp_path / name).read_text()
        assert source == expected[name]
        # flat one-dot imports of the saved set only, nothing from the installed package, no Hub hooks
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 and (node.module or "").startswith(("hf_spec_", "")), ast.unparse(node)
                names = [node.module] if node.module else [a.name for a in node.names]
                assert all(f"{n}.py" in expected for n in names), ast.unparse(node)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not any(m.split(".")[0] == "hf_spec" for m in modules), ast.unparse(node)
        assert "hf-spec:hub-begin" not in source and "after_save_pretrained" not in source
    assert {"README.md", "model.safetensors"} <= {p.name for p in tmp_path.iterdir()}


def test_auto_classes_with_hf_spec_imported_prefer_the_package(tmp_path, family):
    target = make_target(family)
    drafter = hf_spec.EagleDrafter.from_target(target)
    drafter.save_pretrained(tmp_path)
    ids, feats = drafter_inputs()
    expected = drafter_output(drafter, ids, feats)
    for trust in (None, True):  # registered hf_spec classes win over auto_map even with trust_remote_code
        assert type(AutoConfig.from_pretrained(tmp_path, trust_remote_code=trust)) is hf_spec.EagleDrafterConfig
        loaded = AutoModel.from_pretrained(tmp_path, trust_remote_code=trust)
        assert type(loaded) is hf_spec.EagleDrafter
        loaded.bind(target)
        for got, want in zip(drafter_output(loaded, ids, feats), expected):
            torch.testing.assert_close(got, want, rtol=0, atol=0)


_NO_HF_SPEC_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.modules["hf_spec"] = None  # an editable install elsewhere must not leak in
    sys.path[:] = [p for p in sys.path if not p.startswith(REPO)]
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    report = {}
    for family, drafter_dir, target_dir in CASES:
        config = AutoConfig.from_pretrained(drafter_dir, trust_remote_code=True)
        drafter = AutoModel.from_pretrained(drafter_dir, trust_remote_code=True)
        target = AutoModelForCausalLM.from_pretrained(target_dir)
        drafter.bind(target)
        inputs = load_file(f"{drafter_dir}/inputs.safetensors")
        with torch.no_grad():
            out = drafter(input_ids=inputs["ids"], hidden_states=inputs["feats"], output_logits=True)
        save_file({"hidden": out.last_hidden_state.contiguous(), "logits": out.logits.contiguous()},
                  f"{drafter_dir}/remote_out.safetensors")
        errors = []
        for call in (lambda: target.generate(inputs["ids"], assistant_model=drafter, max_new_tokens=3),
                     lambda: drafter.generate(inputs["ids"])):
            try:
                call()
                errors.append(None)
            except Exception as error:
                errors.append(f"{type(error).__name__}: {error}")
        report[family] = dict(
            config_class=f"{type(config).__module__}.{type(config).__name__}",
            model_class=f"{type(drafter).__module__}.{type(drafter).__name__}",
            same_config_class=type(drafter.config) is type(config),
            hf_spec_modules=sorted(m for m, mod in sys.modules.items()
                                   if mod is not None and (m == "hf_spec" or m.startswith("hf_spec."))),
            errors=errors,
        )
    print("REPORT" + json.dumps(report))
    """
)


def test_remote_code_loads_and_runs_without_hf_spec(tmp_path):
    cases = []
    expected = {}
    for family in FAMILIES:
        target = make_target(family)
        drafter = hf_spec.EagleDrafter.from_target(target, name_or_path=f"tiny-{family}")
        drafter_dir, target_dir = tmp_path / f"drafter-{family}", tmp_path / f"target-{family}"
        drafter.save_pretrained(drafter_dir)
        target.save_pretrained(target_dir)
        ids, feats = drafter_inputs()
        save_file({"ids": ids, "feats": feats}, str(drafter_dir / "inputs.safetensors"))
        expected[family] = drafter_output(drafter, ids, feats)
        cases.append((family, str(drafter_dir), str(target_dir)))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(hf_spec.__file__)))
    script = f"REPO = {repo!r}\nCASES = {cases!r}\n" + _NO_HF_SPEC_SCRIPT
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               TRANSFORMERS_VERBOSITY="error")  # fmt: skip
    result = subprocess.run([sys.executable, "-I", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.split("REPORT", 1)[1])
    for family, drafter_dir, _ in cases:
        info = report[family]
        assert info["hf_spec_modules"] == []
        assert info["model_class"].startswith("transformers_modules.") and info["model_class"].endswith(
            "modeling_hf_spec.EagleDrafter")
        assert info["config_class"].endswith("modeling_hf_spec.EagleDrafterConfig") and info["same_config_class"]
        remote = load_file(f"{drafter_dir}/remote_out.safetensors")
        torch.testing.assert_close(remote["hidden"], expected[family][0], rtol=0, atol=0)
        torch.testing.assert_close(remote["logits"], expected[family][1], rtol=0, atol=0)
        for error in info["errors"]:  # tree decoding says it needs hf-spec
            assert error is not None and "pip install hf-spec" in error and "import hf_spec" in error


def test_remote_code_rejects_package_imports():
    with pytest.raises(ValueError, match="hf_spec.tree.nope"):
        remote_code.module_closure(["hf_spec.tree.nope"])


@pytest.mark.parametrize("model_type", sorted(hf_spec.DRAFTER_CLASSES))
def test_remote_code_of_every_registered_family(model_type):
    """The remote-code set of each family in the registry starts from its classes' own modules (no family is
    named in remote_code), holds no hub module, and its entry module and auto_map name the registry's classes."""
    config_class, model_class = hf_spec.DRAFTER_CLASSES[model_type]
    files = remote_code.remote_code_files(model_class, config_class)
    model_file, config_file = (remote_code.flat_name(c.__module__) for c in (model_class, config_class))
    assert {f"{model_file}.py", f"{config_file}.py"} <= set(files)
    assert not any(name.startswith("hf_spec_hub") for name in files)
    entry = files[f"{remote_code.ENTRY_MODULE}.py"]
    assert f"from .{model_file} import {model_class.__name__} as _{model_class.__name__}" in entry
    assert f"from .{config_file} import {config_class.__name__} as _{config_class.__name__}" in entry
    assert remote_code.auto_map(model_class, config_class) == {
        "AutoConfig": f"modeling_hf_spec.{config_class.__name__}", "AutoModel": f"modeling_hf_spec.{model_class.__name__}"}


# -- model cards ---------------------------------------------------------------------------------
def test_templates_exist_for_every_method():
    assert set(METHODS) <= set(cards.available_methods())


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("with_results", [False, True], ids=["no-results", "results"])
def test_card_renders_with_valid_front_matter(tmp_path, method, with_results):
    drafter = hf_spec.EagleDrafter.from_target(make_target(), name_or_path="HuggingFaceTB/SmolLM2-135M-Instruct",
                                               training_method=method)  # fmt: skip
    bench_path = tmp_path / "bench.json"
    bench_path.write_text(json.dumps(BENCH))
    drafter.save_pretrained(tmp_path / "d", bench_results=bench_path if with_results else None,
                            training_info={"datasets": ["sharegpt"], "epochs": 2})  # fmt: skip
    text = (tmp_path / "d" / "README.md").read_text()
    assert not any(marker in text for marker in ("{{", "}}", "{%", "%}"))
    meta = front_matter(text)
    assert meta["library_name"] == "hf-spec"
    assert meta["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert {"speculative-decoding", method} <= set(meta["tags"])
    assert meta["license"] and meta["datasets"] == ["sharegpt"]
    assert "import hf_spec" in text and "assistant_model=drafter" in text
    assert f"training_scripts/train_{method}.py" in text and "```bibtex" in text
    if with_results:
        (index,) = meta["model-index"]
        assert index["name"] == "d"
        by_dataset = {r["dataset"]["type"]: {m["type"]: m["value"] for m in r["metrics"]} for r in index["results"]}
        assert by_dataset == {
            "mt_bench": {"acceptance_length": 3.25, "speedup": 1.91, "tokens_per_second": 86.4},
            "humaneval": {"acceptance_length": 3.8, "speedup": 2.2},
        }
        assert "not measured yet" not in text and BENCH["command"] in text and "2026-11-21" in text
    else:
        assert "model-index" not in meta and "not measured yet" in text


def test_parallelspec_card_names_its_static_tree_widths():
    drafter = hf_spec.ParallelDrafter.from_target(make_target(), tree_widths=[2, 1, 1])
    text = cards.render_model_card(drafter.config)
    assert "| default tree | static, widths 2/1/1 per depth (depth 3, 6 tokens) |" in text
    assert "top-k" not in text.split("| default tree |")[1].splitlines()[0]


def test_card_explains_the_cost_gate_only_when_the_drafter_has_it():
    target = make_target()
    for gate in (False, True):
        text = cards.render_model_card(hf_spec.EagleDrafter.from_target(target, ngram_cost_gate=gate).config)
        assert ("`ngram_cost_gate`" in text) == gate and ("drafter_skipped_cycles" in text) == gate


def test_sorted_card_names_every_served_target_with_its_thresholds():
    """An S2D drafter serves several targets; its card lists them instead of "target: not recorded"."""
    drafter = hf_spec.SortedDrafter.from_source_model(make_target(), num_layers=2, exits=[1, 2])
    drafter.config.set_target_thresholds(make_target().config, [0.8, 0.0], name_or_path="org/big-target")
    drafter.config.set_target_thresholds(make_target().config, [0.6, 0.0], name_or_path="org/small")
    text = cards.render_model_card(drafter.config)
    assert "| targets | `org/big-target` (exit thresholds 0.8/0.0), `org/small` (exit thresholds 0.6/0.0) |" in text
    assert "| target |" not in text


def test_card_citations_match_the_papers():
    titles = {
        "hass": "Learning Harmonized Representations for Speculative Sampling",
        "coral": "CORAL: Learning Consistent Representations across Multi-step Training with Lighter Speculative Drafter",
        "s2d": "S2D: Sorted Speculative Decoding For More Efficient Deployment of Nested Large Language Models",
        "parallelspec": "ParallelSpec: Parallel Drafter for Efficient Speculative Decoding",
        "eagle": "EAGLE: Speculative Sampling Requires Rethinking Feature Uncertainty",
    }
    config = hf_spec.EagleDrafterConfig.for_target(make_target().config)
    for method, title in titles.items():
        config.training_method = method
        assert title in cards.render_model_card(config)


def test_default_training_method_comes_from_the_family():
    config = hf_spec.EagleDrafterConfig.for_target(make_target().config)
    assert config.training_method is None and config.resolved_training_method == "eagle"
    config.training_method = "nope"
    with pytest.raises(ValueError, match="No model card template for training_method='nope'"):
        cards.render_model_card(config)


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda b: b["results"][0].pop("tau"), r"results\[0\].tau must be a number"),
        (lambda b: b.pop("machine"), r"results\[0\] has no 'machine'"),
        (lambda b: b.update(results=[]), "non-empty list"),
        (lambda b: b.update(schema="other/2"), "unknown schema"),
        (lambda b: b["results"][1].update(speedup=0), r"results\[1\].speedup must be a number > 0"),
    ],
)
def test_bench_results_are_validated(mutate, message):
    bench = json.loads(json.dumps(BENCH))
    mutate(bench)
    with pytest.raises(ValueError, match=message):
        cards.load_bench_results(bench)


PAPER = {"table": "benchmarks/papers/README.md", "command": "python training_scripts/compare_papers.py ...",
         "date": "2026-11-28", "machine": "AMD EPYC, 2 threads", "dtype": "float32", "drafter": "d-coral",
         "rows": [{"drafter": "d-eagle", "method": "eagle", "tf_top1": [0.6, 0.5], "tau_tree": 2.65, "tau_chain": 1.7,
                   "draft_ms": 25.2},
                  {"drafter": "d-coral", "method": "coral", "tf_top1": [0.58, 0.54], "tau_tree": 2.74,
                   "tau_chain": 1.7, "draft_ms": 28.8}],
         "claims": [{"method": "coral", "claim": "CSRA beats HASS", "verdict": "holds"}]}  # fmt: skip


def test_card_renders_its_row_of_the_paper_comparison(tmp_path):
    """training_info["paper_comparison"] becomes the card's own section (this drafter's row in bold, the claims),
    stays in training_info.json for a refresh, and is not repeated in the training-settings table."""
    drafter = hf_spec.EagleDrafter.from_target(make_target(), training_method="coral")
    drafter.save_pretrained(tmp_path, training_info={"epochs": 10, "paper_comparison": PAPER})
    card = (tmp_path / "README.md").read_text()
    section = card[card.index("## Beside its paper"):card.index("## Training")]
    assert "| **d-coral** | coral | 0.580 / 0.540 | 2.74 | 1.70 | 28.8 |" in section
    assert "| d-eagle | eagle | 0.600 / 0.500 | 2.65 |" in section and "on AMD EPYC, 2 threads" in section
    assert "- **coral: holds**: CSRA beats HASS." in section and "(greedy, float32," in section
    assert "paper_comparison" not in card and "| epochs | 10 |" in card
    assert json.loads((tmp_path / cards.TRAINING_INFO).read_text())["paper_comparison"] == PAPER
    cards.refresh_model_card(tmp_path)
    assert (tmp_path / "README.md").read_text() == card
    assert "## Beside its paper" not in cards.render_model_card(drafter.config, training_info={"epochs": 10})
    unmeasured = json.loads(json.dumps(PAPER))  # a row without τ (e.g. EAGLE-3 without its layers' inputs)
    unmeasured["rows"][0].update(tau_tree=None, tau_chain=None, draft_ms=None, tf_top1=[])
    text = cards.render_model_card(drafter.config, training_info={"paper_comparison": unmeasured})
    assert "| d-eagle | eagle |  | – | – | – |" in text


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda p: p.pop("claims"), "missing claims"),
        (lambda p: p.update(drafter="other"), "drafter 'other' is not among its rows"),
        (lambda p: p["rows"][1].update(tf_top1=[1.5]), r"rows\[1\].tf_top1 must be a list of accuracies"),
        (lambda p: p["rows"][0].pop("tau_tree"), r"rows\[0\] has no tau_tree"),
        (lambda p: p["rows"][0].update(draft_ms="fast"), r"rows\[0\].draft_ms must be a number or None"),
    ],
)
def test_paper_comparison_is_validated(mutate, message):
    paper = json.loads(json.dumps(PAPER))
    mutate(paper)
    config = hf_spec.EagleDrafter.from_target(make_target()).config
    with pytest.raises(ValueError, match=message):
        cards.render_model_card(config, training_info={"paper_comparison": paper})


def test_card_inputs_are_stored_beside_it_and_refresh_re_renders_it(tmp_path):
    """save_pretrained keeps the card's inputs (training_info.json, card_results.json) beside README.md, and only
    those of the card it just wrote: refresh_model_card re-renders exactly that card."""
    drafter = hf_spec.EagleDrafter.from_target(make_target(), name_or_path="org/target")
    folder = tmp_path / "d"
    drafter.save_pretrained(folder, bench_results=BENCH, training_info={"datasets": ["sharegpt"], "epochs": 2})
    assert (folder / cards.TRAINING_INFO).read_text() == json.dumps({"datasets": ["sharegpt"], "epochs": 2},
                                                                     indent=1, sort_keys=True)  # fmt: skip
    assert json.loads((folder / cards.CARD_RESULTS).read_text()) == cards.load_bench_results(BENCH)
    card = (folder / "README.md").read_text()
    assert cards.refresh_model_card(folder) == folder / "README.md"
    assert (folder / "README.md").read_text() == card

    drafter.save_pretrained(folder)  # a card without results or training facts: no stale inputs beside it
    assert not (folder / cards.CARD_RESULTS).exists() and json.loads((folder / cards.TRAINING_INFO).read_text()) == {}
    cards.refresh_model_card(folder)
    assert "not measured yet" in (folder / "README.md").read_text()

    (folder / "README.md").unlink()
    assert cards.refresh_model_card(folder) is None and not (folder / "README.md").exists()


def test_refresh_keeps_a_card_written_before_its_inputs_were_stored(tmp_path):
    """A card whose results or training facts live only in README.md (saved before hf-spec stored them beside it)
    is not re-rendered: that would drop them."""
    drafter = hf_spec.EagleDrafter.from_target(make_target())
    for stored in (cards.CARD_RESULTS, cards.TRAINING_INFO):
        drafter.save_pretrained(tmp_path, bench_results=BENCH, training_info={"epochs": 2})
        (tmp_path / stored).unlink()
        card = (tmp_path / "README.md").read_bytes()
        with pytest.warns(UserWarning, match=f"written without {stored}"):
            assert cards.refresh_model_card(tmp_path) is None
        assert (tmp_path / "README.md").read_bytes() == card


def _tiny_chat_tokenizer(vocab_size: int = 128):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, **{f"w{i}": i for i in range(2, vocab_size)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>")
    tokenizer.chat_template = "{% for m in messages %}w2 {{ m['content'] }} {% endfor %}w3"
    return tokenizer


def test_card_usage_snippet_runs(tmp_path, capsys):
    target = make_target("llama")
    target_dir, drafter_dir = tmp_path / "target", tmp_path / "drafter"
    target.save_pretrained(target_dir)
    _tiny_chat_tokenizer().save_pretrained(target_dir)
    drafter = hf_spec.EagleDrafter.from_target(target, name_or_path=str(target_dir))
    drafter.save_pretrained(drafter_dir)
    text = cards.render_model_card(drafter.config, model_name=str(drafter_dir))
    snippet = text.split("```python\n", 1)[1].split("```", 1)[0]
    snippet = snippet.replace("max_new_tokens=128", "max_new_tokens=16")
    exec(compile(snippet, "README.md", "exec"), {"__name__": "card_snippet"})
    assert "tokens per target forward:" in capsys.readouterr().out


# -- push_to_hub ----------------------------------------------------------------------------------
def test_push_to_hub_uploads_weights_config_card_and_remote_code(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.utils import close_session

    token = "hf_fake_token_for_tests"
    drafter = hf_spec.EagleDrafter.from_target(make_target("qwen2"), name_or_path="Qwen/Qwen2.5-0.5B-Instruct",
                                               training_method="hass")  # fmt: skip
    bench_path = tmp_path / "bench.json"
    bench_path.write_text(json.dumps(BENCH))
    with FakeHub(token) as hub, time_limit(120):
        monkeypatch.setenv("HF_TOKEN", token)
        monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.endpoint)
        monkeypatch.setattr(huggingface_hub.constants, "AGENT_HARNESSES_PATH", str(tmp_path / "harnesses.json"))
        close_session()  # a fresh HTTP client that sees the environment above
        try:
            url = drafter.push_to_hub("me/tiny-hass", bench_results=bench_path, training_info={"epochs": 1})
        finally:
            close_session()
    assert url.startswith(hub.endpoint + "/me/tiny-hass/commit/")
    assert not hub.unexpected and not hub.unauthorized, (hub.unexpected, hub.unauthorized)
    assert [p.rsplit("/", 2)[-2] if "/models/" in p else p for _, p in hub.requests] == [
        "/api/repos/create", "/api/validate-yaml", "preupload", "commit"]  # fmt: skip
    assert hub.validated_yaml and hub.validated_yaml[0]["library_name"] == "hf-spec"
    (commit,) = hub.commits
    files = commit["files"]
    generated = remote_code.remote_code_files(hf_spec.EagleDrafter, hf_spec.EagleDrafterConfig)
    assert set(files) == {"config.json", "model.safetensors", "README.md", "training_info.json", "card_results.json",
                          *generated}  # fmt: skip
    assert json.loads(files["training_info.json"]) == {"epochs": 1}  # the card's inputs: a download can refresh it
    for name, source in generated.items():
        assert files[name].decode() == source
    config = json.loads(files["config.json"])
    assert config["model_type"] == "hf_spec_eagle" and config["training_method"] == "hass"
    assert config["auto_map"]["AutoModel"] == "modeling_hf_spec.EagleDrafter"
    (tmp_path / "weights.safetensors").write_bytes(files["model.safetensors"])
    weights = load_file(tmp_path / "weights.safetensors")
    state = drafter.state_dict()
    assert set(weights) == set(state)
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, state[name], rtol=0, atol=0)
    readme = files["README.md"].decode()
    meta = front_matter(readme)
    assert meta["base_model"] == "Qwen/Qwen2.5-0.5B-Instruct" and "hass" in meta["tags"]
    assert meta["model-index"][0]["name"] == "me/tiny-hass"
    assert 'from_pretrained("me/tiny-hass")' in readme


# -- speculators export ---------------------------------------------------------------------------
def _rebuild_like_speculators(exported_dir):
    """Build the module tree speculators' EagleSpeculator (0.1-0.4) builds from an exported config,
    with transformers only: fusion_fc Linear(2H, H, bias=fusion_bias); the decoder layer class named by
    transformer_layer_architecture from the CausalLM's modeling module; identity input norm when
    layernorms is false."""
    import importlib

    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    config = json.loads((exported_dir / "config.json").read_text())
    layer_config = AutoConfig.for_model(**config["transformer_layer_config"])
    layer_config._attn_implementation = "sdpa"
    modeling = importlib.import_module(MODEL_FOR_CAUSAL_LM_MAPPING[type(layer_config)].__module__)
    hidden = layer_config.hidden_size
    module = torch.nn.Module()
    module.fusion_fc = torch.nn.Linear(2 * hidden, hidden, bias=config["fusion_bias"])
    module.transformer = getattr(modeling, config["transformer_layer_architecture"])(layer_config, layer_idx=0)
    if not config["layernorms"]:
        module.transformer.input_layernorm = torch.nn.Identity()
    rotary = getattr(modeling, config["transformer_layer_architecture"].replace("DecoderLayer", "RotaryEmbedding"))
    module.rotary_emb = rotary(config=layer_config)
    return config, module


def test_export_speculators_maps_every_weight_one_to_one(tmp_path, family):
    target = make_target(family)
    drafter = hf_spec.EagleDrafter.from_target(target, name_or_path=f"org/tiny-{family}")
    mapping = export.export_speculators(drafter, tmp_path / "spec", legacy_eagle=True)
    state = drafter.state_dict()
    assert set(mapping) == set(state) and len(set(mapping.values())) == len(mapping)
    assert all(v.startswith(("fusion_fc.", "transformer.")) for v in mapping.values())
    assert not any("input_layernorm" in v for v in mapping.values())  # EAGLE-1: no input norm on layer 0
    exported = load_file(tmp_path / "spec" / "model.safetensors")
    assert set(exported) == set(mapping.values())
    for ours, theirs in mapping.items():
        assert exported[theirs].shape == state[ours].shape
        torch.testing.assert_close(exported[theirs], state[ours], rtol=0, atol=0)

    config, module = _rebuild_like_speculators(tmp_path / "spec")
    assert config["speculators_model_type"] == "eagle"
    assert config["layernorms"] is False and config["fusion_bias"] is True
    assert config["speculators_config"]["verifier"]["name_or_path"] == f"org/tiny-{family}"
    module.load_state_dict(exported, strict=False)
    missing = set(module.state_dict()) - set(exported)
    assert all(k.startswith("rotary_emb.") for k in missing), missing  # the rest is one to one
    # the rebuilt speculators module computes what our drafter computes
    ids, feats = drafter_inputs()
    with torch.no_grad():
        x = module.fusion_fc(torch.cat([target.get_input_embeddings()(ids), feats], dim=-1))
        positions = torch.arange(ids.shape[1]).view(1, -1)
        causal = torch.full((ids.shape[1], ids.shape[1]), torch.finfo(x.dtype).min).triu(1).view(1, 1, *2 * (ids.shape[1],))
        x = module.transformer(x, attention_mask=causal, position_ids=positions,
                               position_embeddings=module.rotary_emb(x, positions))  # fmt: skip
        x = x[0] if isinstance(x, tuple) else x
    torch.testing.assert_close(x, drafter_output(drafter, ids, feats)[0], rtol=1e-5, atol=1e-5)

    # exporting the saved directory (no drafter class involved) gives the same files
    drafter.save_pretrained(tmp_path / "saved")
    assert export.export_speculators(tmp_path / "saved", tmp_path / "spec2", legacy_eagle=True) == mapping
    assert json.loads((tmp_path / "spec2" / "config.json").read_text()) == config
    for name, tensor in load_file(tmp_path / "spec2" / "model.safetensors").items():
        assert torch.equal(tensor, exported[name])


def test_export_speculators_block_validates_with_speculators(tmp_path):
    speculators = pytest.importorskip("speculators", reason="speculators not installed")
    drafter = hf_spec.EagleDrafter.from_target(make_target(), name_or_path="org/tiny")
    export.export_speculators(drafter, tmp_path, legacy_eagle=True)
    config = json.loads((tmp_path / "config.json").read_text())
    block = speculators.SpeculatorsConfig.model_validate(config["speculators_config"])
    assert block.algorithm == "eagle" and block.verifier.name_or_path == "org/tiny"
    assert block.proposal_methods[0].speculative_tokens == drafter.config.tree_depth


def test_export_speculators_loads_with_speculators_eagle_class(tmp_path):
    speculators = pytest.importorskip("speculators", reason="speculators not installed")
    registry = speculators.SpeculatorModelConfig.registry or {}
    if "eagle" not in registry:
        from importlib.metadata import version

        pytest.skip(f"speculators {version('speculators')} has no 'eagle' speculator type "
                    f"(has {sorted(registry)}); EAGLE-1 configs exist in speculators 0.1-0.4 only")  # fmt: skip
    drafter = hf_spec.EagleDrafter.from_target(make_target(), name_or_path="org/tiny")
    mapping = export.export_speculators(drafter, tmp_path, legacy_eagle=True)
    config = speculators.SpeculatorModelConfig.from_pretrained(tmp_path)
    assert config.speculators_model_type == "eagle"
    model_class = speculators.SpeculatorModel.registry["eagle"]
    model = model_class(config)
    theirs = {k: v.shape for k, v in model.state_dict().items() if not k.startswith(("embed_tokens", "lm_head"))}
    assert theirs == {mapping[k]: v.shape for k, v in drafter.state_dict().items()}


def test_export_rejects_what_the_format_cannot_hold(tmp_path):
    drafter = hf_spec.EagleDrafter.from_target(make_target(), num_layers=2)
    with pytest.raises(ValueError, match="exactly one decoder layer"):
        export.export_speculators(drafter, tmp_path, legacy_eagle=True)
    with pytest.raises(ValueError, match="speculators 0.1-0.4 only"):  # without the flag: today's speculators has no eagle
        export.export_speculators(drafter, tmp_path)
