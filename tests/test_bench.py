"""Data-set loaders (packaged data) and the benchmark harness (tiny random models)."""

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_spec.bench import datasets as ds
from hf_spec.bench.harness import BenchSettings, ForwardCounter, load_model, parse_method, run_benchmark, run_metadata, summarize
from hf_spec.bench.report import write_report
from hf_spec.cli import build_parser
from hf_spec.resources import PACKAGED_DATA, MissingPackageError, install_command, packaged_data_path


def _load_or_skip(name, loader):
    try:
        packaged_data_path(name)
    except MissingPackageError:
        entry = PACKAGED_DATA[name]
        pytest.skip(f"data package missing: {install_command([entry.package], entry.pip_flags)}")
    return loader()


@pytest.mark.parametrize(
    "name, loader, count",
    [("mt_bench", ds.load_mt_bench, 80), ("humaneval", ds.load_humaneval, 164), ("gsm8k", ds.load_gsm8k, 100)],
)
def test_benchmark_loaders_return_documented_counts(name, loader, count):
    records = _load_or_skip(name, loader)
    assert len(records) == count
    assert len({r["id"] for r in records}) == count
    for r in records:
        assert r["dataset"] == name and r["turns"] and all(isinstance(t, str) and t for t in r["turns"])
        assert r["messages"] == [{"role": "user", "content": r["turns"][0]}]
    if name == "mt_bench":
        assert all(len(r["turns"]) == 2 for r in records)


def test_sharegpt_parses_the_truncated_file():
    conversations = _load_or_skip("sharegpt", ds.load_sharegpt)
    assert len(conversations) > 17000
    roles = {t["role"] for c in conversations for t in c}
    assert roles <= {"user", "assistant", "system"} and {"user", "assistant"} <= roles
    assert all(isinstance(t["content"], str) for t in conversations[0])


def test_chitchat_alternates_roles():
    conversations = _load_or_skip("chitchat", ds.load_chitchat)
    assert len(conversations) == 7168
    assert all(t["role"] == ("user", "assistant")[i % 2] for c in conversations[:50] for i, t in enumerate(c))


def test_json_prefix_parser_stops_at_the_cut():
    text = '[ {"a": 1}, {"b": [2, 3]} ,\n {"c": "unfinished'
    assert list(ds._iter_json_array_prefix(text)) == [{"a": 1}, {"b": [2, 3]}]
    assert list(ds._iter_json_array_prefix('[{"a": 1}]')) == [{"a": 1}]


def _tiny_llama(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=0, eos_token_id=None, pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    _tiny_llama(0).save_pretrained(root / "target")
    # The assistant has the target's weights, so drafts are accepted and τ must exceed 1.
    _tiny_llama(0).save_pretrained(root / "assistant")
    import hf_spec

    hf_spec.EagleDrafter.from_target(_tiny_llama(0)).save_pretrained(root / "drafter")
    routed = hf_spec.EagleDrafter.from_target(_tiny_llama(0))
    routed.add_router(torch.arange(128), num_groups=4, top_n=1)
    routed.save_pretrained(root / "routed")
    return root


def test_forward_counter_excludes_a_pure_prefill(tiny_models):
    model, tokenizer = load_model(str(tiny_models / "target"), torch.float32)
    assert tokenizer is None
    counter = ForwardCounter(model)
    ids = torch.randint(1, 128, (1, 12))
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=9, do_sample=False)
    counter.remove()
    assert out.shape[1] == 12 + 9
    assert counter.calls == 9 and counter.first_input_len == 12
    assert counter.counted(prompt_len=12, new_tokens=9) == (8, 8)


def test_harness_end_to_end_on_tiny_models(tiny_models, tmp_path):
    dtype = torch.float32
    model, _ = load_model(str(tiny_models / "target"), dtype)
    specs = ("plain", "prompt_lookup:3", f"assisted:{tiny_models / 'assistant'}", f"hf_spec:{tiny_models / 'drafter'}")
    methods = [parse_method(m, dtype) for m in specs]
    gen = torch.Generator().manual_seed(0)
    # Repetitive prompts so prompt lookup has something to find.
    prompts = {
        name: [{"id": f"{name}/{i}", "input_ids": torch.randint(1, 128, (6,), generator=gen).tolist() * 3} for i in range(2)]
        for name in ("set_a", "set_b")
    }
    settings = BenchSettings(max_new_tokens=12, warmup_tokens=4, repeats=2)
    rows = run_benchmark(model, prompts, methods, settings)
    names = [m.name for m in methods]
    assert len(rows) == 2 * 2 * 4
    # hf_spec rows say how many cycles ran no drafter forward (the cost gate's), beside the n-gram-accepted tokens.
    assert all(isinstance(r["drafter_skipped_cycles"], int) for r in rows if r["method"] == names[3])
    # Two timed runs per method and prompt; a row keeps the fastest.
    assert all(len(r["seconds_runs"]) == 2 and r["seconds"] == min(r["seconds_runs"]) for r in rows)
    summary = summarize(rows, names)
    assert set(summary) == {"set_a", "set_b", "all"}
    for method, s in summary["all"].items():
        assert s["prompts"] == 4 and s["new_tokens"] == 4 * 12
        # fp32 greedy: speculative methods must reproduce plain greedy token for token.
        assert s["identical"] == 4, method
        assert s["tau"] >= 1.0
    # A random assistant is never confident enough (transformers' 0.4 threshold) to draft
    # more than one token, but that one is always right: exactly two tokens per forward.
    assert summary["all"][names[2]]["tau"] == 2.0
    assert summary["all"]["plain"]["tau"] == 1.0 and summary["all"]["plain"]["speedup"] == 1.0
    # The hf_spec drafter reports its own acceptance by draft position and its time per cycle.
    assert isinstance(summary["all"][names[3]]["acceptance_by_position"], list)
    assert summary["all"][names[3]]["draft_ms_per_cycle"] > 0 and summary["all"]["plain"]["draft_ms_per_cycle"] is None
    # ... and how many tree tokens each verification forward carried (the root counts; a tree can exceed τ's tokens).
    assert summary["all"][names[3]]["verified_per_cycle"] >= 1 and summary["all"]["plain"]["verified_per_cycle"] is None

    with pytest.raises(ValueError, match="repeats"):
        run_benchmark(model, prompts, methods, BenchSettings(repeats=0))
    metadata = run_metadata(settings, dtype, command="pytest", target="tiny", methods=names)
    paths = write_report(tmp_path / "out", metadata, summary, rows)
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths.values())
    data = json.loads(paths["json"].read_text())
    assert {"command", "date", "machine", "settings", "summary", "samples"} <= set(data)
    assert {"cpu", "cores", "torch", "transformers", "dtype"} <= set(data["machine"])
    assert {"tokens_per_s", "speedup", "wall_speedup", "tau", "identical", "acceptance_by_position"} <= set(
        data["summary"]["set_a"]["plain"]
    )
    assert "| set_a | prompt_lookup:3 |" in paths["markdown"].read_text()
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_router_suffix_turns_a_coral_router_off(tiny_models):
    routed = parse_method(f"hf_spec:{tiny_models / 'routed'}", torch.float32)
    off = parse_method(f"hf_spec:{tiny_models / 'routed'}:no_router", torch.float32)
    assert "use_router" not in routed.generate_kwargs and off.generate_kwargs["use_router"] is False
    assert off.generate_kwargs["assistant_model"].router is not None


def test_exit_suffix_runs_a_sorted_drafter_as_one_fixed_submodel(tiny_models, tmp_path):
    import hf_spec

    target = _tiny_llama(0)
    target.config._name_or_path = "tiny"
    drafter = hf_spec.SortedDrafter.from_source_model(target, num_layers=2, exits=[1, 2], targets=[target])
    drafter.save_pretrained(tmp_path / "sorted")
    adaptive = parse_method(f"hf_spec:{tmp_path / 'sorted'}", torch.float32)
    fixed = parse_method(f"hf_spec:{tmp_path / 'sorted'}:exit=1", torch.float32)
    assert fixed.info["fixed_exit"] == 1 and "fixed_exit" not in adaptive.info
    assert fixed.generate_kwargs["assistant_model"].config.targets[0]["thresholds"] == [0.0, 0.0]
    ids = torch.tensor([[1, 5, 9, 3]])
    target.generate(ids, max_new_tokens=6, do_sample=False, **fixed.generate_kwargs)
    assert fixed.stats()["exit_counts"][1] == 0 and fixed.stats()["exit_counts"][0] > 0
    with pytest.raises(ValueError, match="exits"):
        parse_method(f"hf_spec:{tmp_path / 'sorted'}:exit=3", torch.float32)
    with pytest.raises(ValueError, match="sorted"):
        parse_method(f"hf_spec:{tiny_models / 'drafter'}:exit=1", torch.float32)
    both = parse_method(f"hf_spec:{tmp_path / 'sorted'}:exit=2:depth=3:min_prob=0.4", torch.float32, tree={"tree_depth": 6})
    assert both.info["fixed_exit"] == 2
    assert both.generate_kwargs["tree_depth"] == 3 and both.generate_kwargs["tree_min_prob"] == 0.4  # per method wins


@pytest.mark.cuda
def test_harness_runs_every_method_on_the_gpu(tiny_models):
    # --device cuda: target, drafter and assistant on the GPU, prompts moved there; greedy fp32 still equals plain.
    dtype, device = torch.float32, torch.device("cuda")
    model = load_model(str(tiny_models / "target"), dtype)[0].to(device)
    specs = ("plain", "prompt_lookup:3", f"assisted:{tiny_models / 'assistant'}", f"hf_spec:{tiny_models / 'drafter'}",
             "hf_spec:ngram")  # fmt: skip
    methods = [parse_method(m, dtype, device=device) for m in specs]
    prompts = {"set": [{"id": "set/0", "input_ids": list(range(1, 7)) * 3}]}
    rows = run_benchmark(model, prompts, methods, BenchSettings(max_new_tokens=12, warmup_tokens=4))
    assert [r["identical_to_plain"] for r in rows] == [True] * len(specs)
    assert run_metadata(BenchSettings(), dtype, device=device)["machine"]["gpu"]


def test_unknown_method_is_a_clear_error():
    with pytest.raises(ValueError, match="Unknown method 'medusa'"):
        parse_method("medusa")


def test_cli_parses_bench_and_install_models():
    parser = build_parser()
    args = parser.parse_args(["bench", "--methods", "plain", "prompt_lookup", "--limit", "2", "--dtype", "float32"])
    assert args.limit == 2 and args.max_new_tokens == 128 and args.dtype == "float32" and args.repeats == 1
    assert parser.parse_args(["bench", "--methods", "plain", "--repeats", "3"]).repeats == 3
    assert args.device == "cpu" and parser.parse_args(["bench", "--device", "cuda"]).device == "cuda"
    args = parser.parse_args(["install-models", "--all"])
    assert args.all and args.names == []


def test_bench_device_that_is_absent_or_misspelt_is_a_clear_error(monkeypatch):
    from hf_spec.cli import _torch_device

    assert _torch_device("cpu") == torch.device("cpu")
    with pytest.raises(SystemExit, match="not a torch device"):
        _torch_device("gpu0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA GPU.*--device cpu"):
        _torch_device("cuda")


def test_skip_leaves_out_the_first_prompts_of_each_set():
    from hf_spec.bench import harness
    from hf_spec.bench.datasets import BENCH_DATASETS

    class OneTokenTemplate:  # a tokenizer stand-in: every prompt renders to one token
        chat_template = "stub"

        def apply_chat_template(self, messages, **kwargs):
            return {"input_ids": [1]}

    for name in BENCH_DATASETS:
        first = harness.build_prompts(OneTokenTemplate(), [name], limit=5)[name]
        held_out = harness.build_prompts(OneTokenTemplate(), [name], limit=2, skip=3)[name]
        assert [p["id"] for p in held_out] == [p["id"] for p in first[3:5]]


def test_code_edit_prompts_carry_the_code_and_an_injected_bug():
    from hf_spec.bench.datasets import BENCH_DATASETS, load_code_edit, load_humaneval

    edits, originals = load_code_edit(), load_humaneval()
    assert len(edits) == len(originals) and "code_edit" not in BENCH_DATASETS  # opt-in, defaults unchanged
    typed, fixed = edits[0]["turns"][0], next(e for e in edits[1::2] if "bug" in e["turns"][0])["turns"][0]
    assert "type hints" in typed and originals[0]["reference"].strip() in typed
    original = originals[int(next(e for e in edits[1::2] if "bug" in e["turns"][0])["id"].split("/")[-1])]
    assert original["reference"].strip() not in fixed  # the solution was changed
    assert original["turns"][0].strip() in fixed  # the docstring/signature was not
