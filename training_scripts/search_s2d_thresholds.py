"""Pick a trained S2D drafter's per-target thresholds on held-out prompts (S2D §4.4.1).

For each target, runs :func:`hf_spec.drafters.s2d.search_thresholds` (greedy; ranks the candidates
by measured tokens per second, each candidate and prompt timed ``--repeats`` times, interleaved, best
time kept: run it on a quiet machine, in the ``--dtype`` you deploy) on benchmark prompts that the
benchmark itself does not use (``--offset``: skip that many prompts of each data set;
``hf-spec bench --limit N`` uses the first N), writes the chosen thresholds into the drafter's
``config.json`` (only the config is rewritten; an hf-spec model card there is re-rendered, it lists them) and every
candidate's scores to ``--out``.

    python training_scripts/search_s2d_thresholds.py --drafter runs/s2d-qwen \\
        --targets qwen2.5-coder-0.5b-instruct qwen2.5-coder-1.5b-instruct --offset 10 --per-dataset 1 \\
        --max-new-tokens 32 --grid 0.0 0.8 0.95 2.0 --tree-depth 3 --out runs/s2d-qwen/thresholds.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import hf_spec  # noqa: F401  (registers the drafter classes)
from hf_spec.bench.datasets import BENCH_DATASETS, render_prompt
from hf_spec.bench.harness import DTYPES, load_model
from hf_spec.drafters.s2d import SortedDrafter, search_thresholds, threshold_grid
from hf_spec.hub.cards import refresh_model_card


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--drafter", required=True, help="directory of a saved SortedDrafter")
    p.add_argument("--targets", nargs="+", required=True, help="packaged names or local model directories")
    p.add_argument("--datasets", nargs="+", default=list(BENCH_DATASETS), choices=list(BENCH_DATASETS))
    p.add_argument("--offset", type=int, default=10, help="skip the first N prompts of each data set (the benchmark's)")
    p.add_argument("--per-dataset", type=int, default=1, help="held-out prompts per data set")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--grid", type=float, nargs="+", default=None, help="thresholds tried at each non-final exit")
    p.add_argument("--tree-depth", type=int, default=None, help="chain depth of the search (default: the drafter's)")
    p.add_argument("--repeats", type=int, default=2, help="timed rounds; each (candidate, prompt) keeps its best")
    p.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", default=None, help="JSON file for all candidates' scores")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    drafter = SortedDrafter.from_pretrained(args.drafter, dtype=dtype).eval()
    candidates = threshold_grid(args.grid, len(drafter.config.exits)) if args.grid else None
    depth = args.tree_depth or drafter.config.tree_depth
    report = {"drafter": args.drafter, "repeats": args.repeats, "dtype": args.dtype, "offset": args.offset,
              "max_new_tokens": args.max_new_tokens, "tree_depth": depth, "targets": {}}  # fmt: skip
    for name in args.targets:
        target, tokenizer = load_model(name, dtype)
        target.config._name_or_path = name  # the key the drafter's config lists targets under
        prompts = []
        for ds in args.datasets:
            records = BENCH_DATASETS[ds]()[args.offset : args.offset + args.per_dataset]
            prompts += [torch.tensor([render_prompt(tokenizer, r)]) for r in records]
        start = time.perf_counter()
        best, results = search_thresholds(drafter, target, prompts, candidates=candidates, repeats=args.repeats,
                                          max_new_tokens=args.max_new_tokens, tree_depth=depth)  # fmt: skip
        print(f"{name}: best {best} ({time.perf_counter() - start:.0f} s)", flush=True)
        for r in results:
            print(f"  {r['thresholds']}  tok/s {r['tokens_per_second']:.2f}  tau {r['tau']:.2f}  "
                  f"exits {r['exit_counts']}  cycles {r['cycles']}  tokens {r['new_tokens']}", flush=True)  # fmt: skip
        report["targets"][name] = {"best": best, "prompts": len(prompts), "results": results}
        drafter._bound_target = None  # the next target binds afresh
        del target
    drafter.config.save_pretrained(args.drafter)  # weights unchanged: only the thresholds moved
    refresh_model_card(args.drafter)  # the card lists each target's thresholds
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
