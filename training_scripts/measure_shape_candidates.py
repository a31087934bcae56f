"""Measure each drafter folder's shape candidates (τ and verified nodes per cycle) on held-aside prompts and write
them into the folder's config (``tree_shape_candidates``): the rungs the online speed controller
(:mod:`hf_spec.controller`) chooses among at run time, ordered by tree size, then n-gram budget.

    python training_scripts/measure_shape_candidates.py drafters/smollm2-135m-instruct-hass [FOLDER ...]

Run it alone on a quiet machine: the n-gram cost gate of these folders decides each cycle from this process's
measured drafting time, so τ and node counts depend on the machine's load (beside a training job every candidate
measured the same τ, 2.4764: the gate had stopped drafting).
Prompts: ``--skip``..``--skip + --prompts - 1`` of MT-bench, HumanEval and GSM8K (default 33..37: never the
benchmarks' first prompts). ParallelSpec folders get the static-tree ladder, sorted (S2D) folders a ladder of chain
depths (their drafts are chains), the others the EAGLE-family one.
"""

import argparse
import json
import time

import torch

import hf_spec
from hf_spec.bench.datasets import bench_prompt_ids
from hf_spec.hardware import dtype_name, resolve_dtype
from hf_spec.resources import load_model
from hf_spec.tune import measure_candidates, write_shape_candidates

EAGLE_FAMILY = [  # from the cheapest (a CPU in float32) to a nearly flat verification cost (a GPU)
    dict(tree_depth=1, tree_top_k=4, tree_total_tokens=2, ngram_nodes=3),
    dict(tree_depth=2, tree_top_k=4, tree_total_tokens=3, ngram_nodes=3),
    dict(tree_depth=2, tree_top_k=4, tree_total_tokens=3, ngram_nodes=8),
    dict(tree_depth=2, tree_top_k=4, tree_total_tokens=4, ngram_nodes=8),
    dict(tree_depth=2, tree_top_k=4, tree_total_tokens=4, ngram_nodes=16),
    dict(tree_depth=3, tree_top_k=4, tree_total_tokens=6, ngram_nodes=8),
    dict(tree_depth=4, tree_top_k=6, tree_total_tokens=12, ngram_nodes=8),
    dict(tree_depth=6, tree_top_k=8, tree_total_tokens=32, ngram_nodes=12),
]
PARALLEL = [  # None: the folder's configured widths
    dict(tree_depth=1, tree_top_k=2, tree_total_tokens=2, ngram_nodes=3),
    dict(tree_depth=1, tree_top_k=2, tree_total_tokens=2, ngram_nodes=8),
    dict(tree_depth=None, tree_top_k=None, tree_total_tokens=3, ngram_nodes=3),
    dict(tree_depth=None, tree_top_k=None, tree_total_tokens=3, ngram_nodes=8),
    dict(tree_depth=None, tree_top_k=None, tree_total_tokens=3, ngram_nodes=16),
    dict(tree_depth=3, tree_top_k=3, tree_total_tokens=8, ngram_nodes=8),
    dict(tree_depth=5, tree_top_k=4, tree_total_tokens=24, ngram_nodes=12),
]

SORTED_CHAINS = [dict(tree_depth=d, tree_top_k=1, tree_total_tokens=d) for d in (1, 2, 3, 4, 6)]


def ladder(drafter) -> list[dict]:
    """The shape candidates measured for ``drafter``'s family."""
    if isinstance(drafter, hf_spec.ParallelDrafter):
        return PARALLEL
    if isinstance(drafter, hf_spec.SortedDrafter):
        return SORTED_CHAINS
    return EAGLE_FAMILY


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", help="drafter folders (of --target's drafters)")
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--skip", type=int, default=33)
    parser.add_argument("--prompts", type=int, default=5, help="prompts per data set")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dry-run", action="store_true", help="print the measurements, write nothing")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = resolve_dtype(args.dtype)
    target, tokenizer = load_model(args.target, dtype=dtype)
    prompts = bench_prompt_ids(tokenizer, args.prompts, skip=args.skip)
    for folder in args.folders:
        drafter = hf_spec.AutoDrafter.from_pretrained(folder).to(dtype)
        grid = ladder(drafter)
        start = time.time()
        rows = measure_candidates(target, drafter, prompts, grid, args.max_new_tokens,
                                  progress=lambda message: print(folder, message, flush=True))  # fmt: skip
        print(json.dumps({"folder": folder, "seconds": round(time.time() - start), "candidates": rows}, indent=1))
        if not args.dry_run:
            provenance = {"by": "training_scripts/measure_shape_candidates.py", "dtype": dtype_name(dtype),
                          "prompts": f"{args.skip}..{args.skip + args.prompts - 1} of mt_bench, humaneval, gsm8k",
                          "max_new_tokens": args.max_new_tokens, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            print("updated", write_shape_candidates(folder, rows, provenance))


if __name__ == "__main__":
    main()
