"""Drafting time per cycle: ParallelSpec (one drafter forward) vs HASS (one per depth), side by side.

Two measurements in one run, both drafters loaded on the same target, interleaved:

1. ``propose``: direct timing of ``session.propose`` (the drafter forward(s) + building the
   tree; the forwards alone from ``session.forward_seconds``) at a fixed context: each bench prompt's pairs are committed once, then the last
   ``--new-pairs`` pairs are proposed ``--repeats`` times (the drafter's cache is cropped back
   after each), alternating the drafters. Tree pairs at equal depth and size, HASS
   ``depth,top_k,total`` vs ParallelSpec widths; for the first pair also ParallelSpec running
   all k [MASK] positions (what it did before it ran only depth-1 of them).
2. ``generate``: greedy ``generate()`` with each drafter's shipped default tree on the same
   prompts, drafter forward seconds per cycle from ``drafter.last_generation_stats`` and τ.

    python benchmarks/parallelspec_vs_hass/drafting_time.py \\
        --out benchmarks/parallelspec_vs_hass/drafting_time.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time

import torch

import hf_spec
from hf_spec.bench.datasets import bench_prompt_ids
from hf_spec.cache import crop_to
from hf_spec.training.data import target_features
from hf_spec.tree.static import StaticTreeShape, static_tree_size


def static_shape(widths) -> StaticTreeShape:
    widths = tuple(widths)
    return StaticTreeShape(depth=len(widths), top_k=max(widths), widths=widths, total_tokens=static_tree_size(widths)[0])


@torch.no_grad()
def time_propose(sessions: dict, feats: torch.Tensor, ids: torch.Tensor, new_pairs: int, repeats: int) -> dict:
    """Median seconds of one ``propose`` of the last ``new_pairs`` pairs, per session (interleaved)."""
    n = ids.shape[1]  # pairs (f_i, x_{i+1}), i = 0..n-2; the root is the last prompt token
    cut = n - 1 - new_pairs
    for session in sessions.values():  # commit the context once (and warm up)
        session.propose(feats[0, :cut], ids[0, 1 : cut + 1])
    times = {name: [] for name in sessions}
    forward = {name: [] for name in sessions}
    nodes = {}
    for _ in range(repeats):
        for name, session in sessions.items():
            before = session.forward_seconds
            start = time.perf_counter()
            tree = session.propose(feats[0, cut : n - 1], ids[0, cut + 1 : n])
            times[name].append(time.perf_counter() - start)
            forward[name].append(session.forward_seconds - before)
            nodes[name] = len(tree) - 1
            crop_to(session.cache, cut)
            session.committed = cut
    return {
        name: {"median_s": statistics.median(t), "forward_median_s": statistics.median(forward[name]),
               "draft_nodes": nodes[name]}
        for name, t in times.items()
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--hass", default="drafters/smollm2-135m-instruct-hass")
    parser.add_argument("--parallelspec", default="drafters/smollm2-135m-instruct-parallelspec")
    parser.add_argument("--per-set", type=int, default=2, help="prompts per data set (MT-bench, HumanEval, GSM8K)")
    parser.add_argument("--new-pairs", type=int, default=2, help="pairs committed per timed propose (τ ≈ 1.3 -> 1-2)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--trees", default="3,2,6/2,1,1;5,2,10/2,1,1,1,1;5,8,60/4,2,2,1,1",
                        help="HASS depth,top_k,total / ParallelSpec widths, pairs separated by ;")  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, default=64, help="for the generate() measurement; 0 skips it")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    dtype = getattr(torch, args.dtype)
    target, tokenizer = hf_spec.load_packaged_model(args.target, dtype=dtype)
    hass = hf_spec.EagleDrafter.from_pretrained(args.hass, dtype=dtype).bind(target).eval()
    pspec = hf_spec.ParallelDrafter.from_pretrained(args.parallelspec, dtype=dtype).bind(target).eval()
    inputs = bench_prompt_ids(tokenizer, args.per_set)

    propose_rows = []
    for i, pair in enumerate(args.trees.split(";")):
        hass_tree, widths = pair.split("/")
        depth, top_k, total = (int(x) for x in hass_tree.split(","))
        widths = [int(x) for x in widths.split(",")]
        per_prompt = []
        for ids in inputs:
            feats = target_features(target, ids)
            sessions = {
                "hass": hass.new_drafting_session(target, hass.tree_shape(depth, top_k, total), False),
                "parallelspec": pspec.new_drafting_session(target, static_shape(widths), False),
            }
            if i == 0:
                sessions["parallelspec_all_masks"] = pspec.new_drafting_session(target, static_shape(widths), False)
                sessions["parallelspec_all_masks"].num_masks = pspec.num_mask_tokens
            per_prompt.append(time_propose(sessions, feats, ids, args.new_pairs, args.repeats))
        row = {"hass_tree": {"depth": depth, "top_k": top_k, "total_tokens": total}, "parallelspec_widths": widths}
        for name in per_prompt[0]:
            row[name] = {
                "ms_per_propose": 1000 * statistics.mean(p[name]["median_s"] for p in per_prompt),
                "forward_ms_per_propose": 1000 * statistics.mean(p[name]["forward_median_s"] for p in per_prompt),
                "draft_nodes": per_prompt[0][name]["draft_nodes"],
            }
        for name in list(per_prompt[0]):
            if name != "hass":
                row[f"{name}_over_hass"] = row[name]["ms_per_propose"] / row["hass"]["ms_per_propose"]
        propose_rows.append(row)
        print(json.dumps(row), flush=True)

    generate_row = None
    if args.max_new_tokens > 0:
        target.generate(inputs[0], assistant_model=pspec, max_new_tokens=4, do_sample=False)  # warm-up
        totals = {"hass": [0.0, 0, 0], "parallelspec": [0.0, 0, 0]}  # draft s, cycles, new tokens
        for ids in inputs:
            for name, drafter in (("hass", hass), ("parallelspec", pspec)):
                out = target.generate(ids, assistant_model=drafter, max_new_tokens=args.max_new_tokens, do_sample=False)
                stats = drafter.last_generation_stats
                totals[name][0] += stats.drafter_forward_seconds
                totals[name][1] += stats.cycles
                totals[name][2] += out.shape[1] - ids.shape[1]
        generate_row = {
            name: {"draft_ms_per_cycle": 1000 * s / c, "cycles": c, "tau": t / c} for name, (s, c, t) in totals.items()
        }
        generate_row["parallelspec_over_hass"] = (
            generate_row["parallelspec"]["draft_ms_per_cycle"] / generate_row["hass"]["draft_ms_per_cycle"]
        )
        print(json.dumps(generate_row), flush=True)

    report = {
        "command": "python benchmarks/parallelspec_vs_hass/drafting_time.py "
        + " ".join(f"--{k.replace('_', '-')} '{v}'" for k, v in vars(args).items()),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": platform.processor() or platform.machine(), "torch_threads": torch.get_num_threads(),
                    "torch": torch.__version__},  # fmt: skip
        "prompts": len(inputs),
        "propose": propose_rows,
        "generate": generate_row,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
