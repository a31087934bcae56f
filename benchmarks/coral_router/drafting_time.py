"""Drafting time per cycle with CORAL's LM-head router vs without, measured side by side.

For each target, one drafter runs greedy ``generate()`` on the same bench prompts twice per
prompt, interleaved: router on (top-n of N groups) and router off (full LM head). The
drafter's forward seconds per drafting-verification cycle come from
``drafter.last_generation_stats``. With ``--drafter`` a trained checkpoint is used; otherwise
an untrained drafter + untrained router of the target's real shape (the drafting *cost* does
not depend on the weights; τ does, so untrained τ is not reported as a result).

    python benchmarks/coral_router/drafting_time.py --target smollm2-135m-instruct \\
        --drafter drafters/smollm2-135m-instruct-coral --out benchmarks/coral_router/smollm2.json
    python benchmarks/coral_router/drafting_time.py --target qwen2.5-coder-1.5b-instruct \\
        --out benchmarks/coral_router/qwen1.5b_untrained.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time

import torch

import hf_spec
from hf_spec.bench.datasets import bench_prompt_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", default=None, help="trained drafter with a router (default: untrained, real shape)")
    parser.add_argument("--num-groups", type=int, default=16)
    parser.add_argument("--top-n", type=int, default=2)
    parser.add_argument("--per-set", type=int, default=1, help="prompts per data set (MT-bench, HumanEval, GSM8K)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--trees", default="3,2,6;6,8,60", help="tree shapes depth,top_k,total separated by ;")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    dtype = getattr(torch, args.dtype)
    target, tokenizer = hf_spec.load_packaged_model(args.target, dtype=dtype)
    if args.drafter:
        drafter = hf_spec.EagleDrafter.from_pretrained(args.drafter, dtype=dtype).bind(target)
        if drafter.router is None:
            raise SystemExit(f"{args.drafter} has no LM-head router")
    else:
        drafter = hf_spec.EagleDrafter.from_target(target, name_or_path=args.target).to(dtype)
        drafter.add_router(torch.arange(target.config.vocab_size), args.num_groups, args.top_n)
    inputs = bench_prompt_ids(tokenizer, args.per_set)
    target.generate(inputs[0], assistant_model=drafter, max_new_tokens=4, do_sample=False)  # warm-up

    results = []
    for tree in args.trees.split(";"):
        depth, top_k, total = (int(x) for x in tree.split(","))
        totals = {True: [0.0, 0, 0.0, 0], False: [0.0, 0, 0.0, 0]}  # draft s, cycles, wall s, tokens
        for ids in inputs:
            for use_router in (True, False):
                start = time.perf_counter()
                out = target.generate(ids, assistant_model=drafter, max_new_tokens=args.max_new_tokens, do_sample=False,
                                      tree_depth=depth, tree_top_k=top_k, tree_total_tokens=total,
                                      use_router=use_router)  # fmt: skip
                wall = time.perf_counter() - start
                stats = drafter.last_generation_stats
                acc = totals[use_router]
                acc[0] += stats.drafter_forward_seconds
                acc[1] += stats.cycles
                acc[2] += wall
                acc[3] += out.shape[1] - ids.shape[1]
        row = {"tree": {"depth": depth, "top_k": top_k, "total_tokens": total}}
        for use_router, (draft_s, cycles, wall, tokens) in totals.items():
            row["routed" if use_router else "full_head"] = {
                "draft_ms_per_cycle": 1000 * draft_s / cycles, "cycles": cycles, "tau": tokens / cycles,
                "tokens_per_s": tokens / wall,
            }  # fmt: skip
        row["routed_over_full_drafting_time"] = (
            row["routed"]["draft_ms_per_cycle"] / row["full_head"]["draft_ms_per_cycle"]
        )
        results.append(row)
        print(json.dumps(row), flush=True)

    head_params = target.config.vocab_size * target.config.hidden_size
    layer = sum(p.numel() for n, p in drafter.named_parameters() if not n.startswith("router"))
    report = {
        "command": "python benchmarks/coral_router/drafting_time.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": platform.processor() or platform.machine(), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__},
        "target": args.target, "drafter": args.drafter or "untrained (real shape)", "dtype": args.dtype,
        "num_groups": drafter.config.router_num_groups, "top_n": drafter.config.router_top_n,
        "params": {"lm_head": head_params, "drafter_without_router": layer,
                   "router": sum(p.numel() for p in drafter.router.parameters())},
        "prompts": len(inputs), "max_new_tokens": args.max_new_tokens, "results": results,
    }  # fmt: skip
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
