"""Batched tree decoding vs plain batched generate(): tokens/s at batch 1, 4, 8.

The same prompts (the first ``--per-dataset`` of MT-bench, HumanEval and GSM8K, chat
template, left-padded) are decoded greedily by plain batched ``generate()`` and by hf-spec
with the shipped HASS drafter, in batches of each size (8 prompts = 8 calls at batch 1, 2 at
batch 4, 1 at batch 8), the two methods interleaved batch by batch. Tokens/s counts real
new tokens (up to each row's EOS or ``--max-new-tokens``; pad tokens after an EOS are not
counted) over the wall time of the calls.

    OMP_NUM_THREADS=1 python benchmarks/batched/bench_batched.py --out benchmarks/batched/results.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

import hf_spec
from hf_spec.bench.harness import BenchSettings, build_prompts, run_metadata


def left_pad(rows: list[list[int]], pad: int):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    return ids, mask


def new_tokens(out: torch.Tensor, width: int, eos: set[int]) -> tuple[int, list[list[int]]]:
    """Real new tokens per row: up to and including the first EOS."""
    rows = []
    for row in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        rows.append(row[:cut])
    return sum(len(r) for r in rows), rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", default="drafters/smollm2-135m-instruct-hass")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--per-dataset", type=int, default=3, help="prompts per data set (3 data sets)")
    parser.add_argument("--num-prompts", type=int, default=8, help="prompts decoded at every batch size")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/batched/results.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    target, tokenizer = hf_spec.load_packaged_model(args.target, dtype=torch.bfloat16)
    drafter = hf_spec.EagleDrafter.from_pretrained(args.drafter).to(torch.bfloat16).eval()
    drafter.bind(target)
    prompts = build_prompts(tokenizer, ["mt_bench", "humaneval", "gsm8k"], limit=args.per_dataset)
    rows = [p["input_ids"] for name in prompts for p in prompts[name]][: args.num_prompts]
    eos_ids = target.generation_config.eos_token_id
    eos = set(eos_ids if isinstance(eos_ids, list) else [eos_ids])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos)
    common = dict(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=pad)

    def run(ids, mask, method):
        start = time.perf_counter()
        with torch.inference_mode():
            if method == "plain":
                out = target.generate(ids, attention_mask=mask, **common)
            else:
                out = target.generate(ids, attention_mask=mask, assistant_model=drafter, **common)
        return out, time.perf_counter() - start

    warm_ids, warm_mask = left_pad(rows[:2], pad)  # warm-up: first-call allocations, both methods
    for method in ("plain", "hf_spec"):
        target.generate(warm_ids, attention_mask=warm_mask, **{**common, "max_new_tokens": 8},
                        **({"assistant_model": drafter} if method == "hf_spec" else {}))  # fmt: skip

    results = []
    for batch in args.batch_sizes:
        totals = {m: {"tokens": 0, "seconds": 0.0} for m in ("plain", "hf_spec")}
        taus, forwards, identical, stats_seconds = [], 0, 0, {"target": 0.0, "drafter": 0.0, "total": 0.0}
        for begin in range(0, len(rows), batch):
            ids, mask = left_pad(rows[begin : begin + batch], pad)
            outputs = {}
            for method in ("plain", "hf_spec"):
                out, seconds = run(ids, mask, method)
                count, generated = new_tokens(out, ids.shape[1], eos)
                totals[method]["tokens"] += count
                totals[method]["seconds"] += seconds
                outputs[method] = generated
            stats = drafter.last_generation_stats
            taus += [r.tau for r in getattr(stats, "rows", [stats]) if r.cycles]
            forwards += getattr(stats, "verify_forwards", stats.cycles)
            stats_seconds["target"] += stats.target_forward_seconds
            stats_seconds["drafter"] += stats.drafter_forward_seconds
            stats_seconds["total"] += stats.total_seconds
            identical += sum(a == b for a, b in zip(outputs["plain"], outputs["hf_spec"]))
        entry = {
            "batch_size": batch,
            "plain_tokens_per_s": totals["plain"]["tokens"] / totals["plain"]["seconds"],
            "hf_spec_tokens_per_s": totals["hf_spec"]["tokens"] / totals["hf_spec"]["seconds"],
            "plain": totals["plain"],
            "hf_spec": totals["hf_spec"],
            "mean_tau_per_row": sum(taus) / len(taus) if taus else None,
            "verify_forwards": forwards,
            "hf_spec_seconds_split": stats_seconds,
            "rows_identical_to_plain_batched": f"{identical}/{len(rows)}",
        }
        entry["speedup"] = entry["hf_spec_tokens_per_s"] / entry["plain_tokens_per_s"]
        results.append(entry)
        print(json.dumps(entry), flush=True)

    settings = BenchSettings(max_new_tokens=args.max_new_tokens, warmup_tokens=8)
    meta = run_metadata(settings, torch.bfloat16, command=shlex.join(["python", *sys.argv]),
                        target=args.target, drafter=args.drafter, prompts=len(rows),
                        tree=dict(hf_spec_tree=str(drafter.tree_shape())))  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**meta, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
