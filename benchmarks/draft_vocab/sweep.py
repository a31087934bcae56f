"""Draft-vocabulary size sweep: coverage, τ and speed of ONE trained drafter at several draft sizes.

A feature drafter drafts through the target's own LM head, so its draft vocabulary is only a
choice of head rows at inference: the same trained weights can draft over the 4k, 8k or 16k most
frequent answer tokens of its training data, or over the full vocabulary. This script measures,
side by side in one interleaved ``run_benchmark`` run with plain greedy and transformers' prompt
lookup as anchors:

- coverage: the share of the target's greedy tokens (plain greedy outputs on the benchmarked,
  held-aside prompts) inside each draft vocabulary;
- τ, tokens/s and speedup over plain greedy for the drafter at each size.

Example (the run recorded in this folder)::

    python benchmarks/draft_vocab/sweep.py --drafter drafters/smollm2-135m-instruct-hass \\
        --feature-cache runs/features/smollm2-sharegpt-distill --sizes 4096 8192 16384 0 \\
        --skip 3 --limit 3 --threads 2 --out benchmarks/draft_vocab
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import shlex
import sys
from pathlib import Path

import torch


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", required=True, help="a trained feature drafter directory")
    parser.add_argument("--feature-cache", required=True, help="the training data's feature cache (token counts)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192, 16384, 0], help="0: full vocabulary")
    parser.add_argument("--skip", type=int, default=3, help="leave out the first N prompts of each data set")
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    import hf_spec
    from hf_spec.bench.harness import BenchSettings, Method, build_prompts, drafter_stats, load_model, parse_method, run_benchmark, run_metadata, summarize
    from hf_spec.bench.report import write_report
    from hf_spec.bench.datasets import BENCH_DATASETS
    from hf_spec.training.data import load_feature_cache
    from hf_spec.training.pipeline import assistant_token_counts

    target, tokenizer = load_model(args.target, torch.bfloat16)
    dataset, _ = load_feature_cache(args.feature_cache)
    counts = assistant_token_counts(dataset, target.config.vocab_size)
    prompts = build_prompts(tokenizer, list(BENCH_DATASETS), args.limit, args.skip)

    base = hf_spec.EagleDrafter.from_pretrained(args.drafter, dtype=torch.bfloat16).eval()
    methods = [parse_method("plain", torch.bfloat16, tokenizer, {}), parse_method("prompt_lookup", torch.bfloat16, tokenizer, {})]
    for size in args.sizes:
        drafter = copy.deepcopy(base)
        drafter.config.ngram_branches = 0  # the drafter's own trees only: the vocabulary is what varies
        if size:
            drafter.set_draft_vocab(counts, size)
        else:
            drafter.clear_draft_vocab()
        name = f"hf_spec:vocab={size or 'full'}"
        methods.append(Method(name, {"assistant_model": drafter}, drafter_stats(drafter), {"drafter": args.drafter, "draft_vocab_size": size or None}))

    # coverage: the target's own greedy tokens on the benchmarked prompts
    greedy = []
    with torch.inference_mode():
        for ps in prompts.values():
            for p in ps:
                ids = torch.tensor([p["input_ids"]])
                out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens, do_sample=False)
                greedy += out[0, ids.shape[1]:].tolist()
    order = torch.sort(-counts.double(), stable=True).indices
    coverage = {}
    for size in args.sizes:
        inside = torch.zeros(target.config.vocab_size, dtype=torch.bool)
        inside[order[: size or target.config.vocab_size]] = True
        coverage[str(size or "full")] = float(inside[torch.tensor(greedy)].float().mean())

    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rows = run_benchmark(target, prompts, methods, BenchSettings(max_new_tokens=args.max_new_tokens), tokenizer)
    names = [m.name for m in methods]
    summary = summarize(rows, names)
    metadata = run_metadata(BenchSettings(max_new_tokens=args.max_new_tokens), torch.bfloat16,
                            command=shlex.join([sys.executable.split("/")[-1], *sys.argv]), target=args.target,
                            methods=names, skip=args.skip, limit=args.limit, started=started,
                            threads=torch.get_num_threads(), coverage=coverage,
                            coverage_tokens=len(greedy))  # fmt: skip
    write_report(args.out, metadata, summary, rows)
    table = ["| draft vocabulary | coverage of target greedy tokens | τ | tokens/s | speedup over plain |", "|---|---:|---:|---:|---:|"]
    for m in names:
        s = summary["all"][m]
        size = m.split("=")[1] if "vocab=" in m else "—"
        cov = f"{coverage[size]:.3f}" if size in coverage else "—"
        table.append(f"| {m} | {cov} | {s.get('tau') or 1:.2f} | {s['tokens_per_s']:.1f} | {s['speedup']:.2f}x |")
    Path(args.out, "sweep.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
