"""Micro-benchmark of the tree loop itself: τ and the share of a cycle spent outside the models.

For a near-oracle drafter (an EAGLE drafter fitted to the target's own greedy outputs) on
a tiny random Llama and on a random Llama shaped like SmolLM2-135M (30 layers, hidden 576,
vocab 49152), it reports τ (tokens per target forward) and the share of the decoding loop's
wall time spent outside the target's and the drafter's forwards (tree building,
verification walk, cache compaction, bookkeeping). Random weights: the numbers describe the
engine's overhead, not a real drafter's acceptance.

    python benchmarks/micro_tree_overhead.py --shapes tiny --threads 1 --out benchmarks/micro_tree_overhead_tiny.json
    python benchmarks/micro_tree_overhead.py --packaged smollm2-135m-instruct \
        --drafter drafters/smollm2-135m-instruct-hass --dtypes bfloat16 --out benchmarks/micro_tree_overhead_smollm2.json

With ``--packaged``/``--drafter`` it measures the real packaged target with a trained drafter
(chat prompts from the bench data sets) instead of random models.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import hf_spec  # noqa: E402
from conftest import count_host_syncs, train_drafter_on_outputs  # noqa: E402

torch.set_num_threads(torch.get_num_interop_threads())  # conftest pins 1 thread for tiny unit tests; undo it

SHAPES = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128),
    "smollm2-135m-shaped": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                num_attention_heads=9, num_key_value_heads=3, vocab_size=49152),
}  # fmt: skip


def build(shape: str):
    torch.manual_seed(0)
    config = LlamaConfig(**SHAPES[shape], max_position_embeddings=2048, bos_token_id=0, eos_token_id=None,
                         pad_token_id=0, tie_word_embeddings=False)  # fmt: skip
    target = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(30.0)  # peaked distributions, like a real LM's
    drafter = hf_spec.EagleDrafter.from_target(target)
    steps = 400 if shape == "tiny" else 150
    sequences, batch = (128, 32) if shape == "tiny" else (32, 4)
    train_drafter_on_outputs(target, drafter, steps=steps, num_sequences=sequences, batch_size=batch, length=40)
    return target, drafter


def measure(target, drafter, shape: str, prompts: int, new_tokens: int, tree: dict, prompt_ids=None,
            count_syncs: bool = False) -> dict:  # fmt: skip
    dtype = target.dtype
    g = torch.Generator().manual_seed(1)
    rows, counted = [], {"loop": 0, "drafter": 0, "head": 0}
    for i in range(prompts + 1):  # the first run warms up and is dropped
        if prompt_ids is not None:
            prompt = prompt_ids[i % len(prompt_ids)]
        else:
            prompt = torch.randint(1, SHAPES[shape]["vocab_size"], (1, 16), generator=g)
        with count_host_syncs() if count_syncs and i else contextlib.nullcontext() as counts:
            target.generate(prompt, assistant_model=drafter, max_new_tokens=new_tokens, do_sample=False, **tree)
        if counts is not None:
            for key in counted:
                counted[key] += counts[key]
        s = drafter.last_generation_stats
        if i:
            rows.append((s.tau, s.total_seconds, s.target_forward_seconds, s.drafter_forward_seconds, s.cycles))
    total = sum(r[1] for r in rows)
    target_s = sum(r[2] for r in rows)
    drafter_s = sum(r[3] for r in rows)
    cycles = sum(r[4] for r in rows)
    row = {
        "shape": shape,
        "dtype": str(dtype).replace("torch.", ""),
        "tree": tree,
        "prompts": prompts,
        "new_tokens": new_tokens,
        "tau": sum(r[0] for r in rows) / len(rows),
        "cycle_ms": 1000 * total / cycles,
        "target_forward_share": target_s / total,
        "drafter_forward_share": drafter_s / total,
        "overhead_share": 1 - (target_s + drafter_s) / total,
    }
    if count_syncs:  # per cycle; "loop" includes generate()'s few one-off reads
        row["head_calls_per_cycle"] = counted["head"] / cycles
        row["loop_host_syncs_per_cycle"] = counted["loop"] / cycles
        row["drafter_host_syncs_per_cycle"] = counted["drafter"] / cycles
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--count-syncs", action="store_true",
                        help="also count LM-head calls and host syncs (.item/.tolist/bool/int...) per cycle")
    parser.add_argument("--packaged", default=None, help="a packaged target (hf_spec.resources) instead of random models")
    parser.add_argument("--drafter", default=None, help="trained drafter directory for --packaged")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = []
    if args.packaged:
        from hf_spec.bench.harness import build_prompts

        target, tokenizer = hf_spec.load_packaged_model(args.packaged, dtype=torch.float32)
        drafter = hf_spec.EagleDrafter.from_pretrained(args.drafter).bind(target)
        prompt_ids = [torch.tensor([p["input_ids"]]) for ps in build_prompts(tokenizer, ["mt_bench", "humaneval", "gsm8k"], 2).values() for p in ps]
        for dtype in (getattr(torch, name) for name in args.dtypes):
            target, drafter = target.to(dtype), drafter.to(dtype)
            for tree in (dict(tree_depth=6, tree_top_k=8, tree_total_tokens=60),
                         dict(tree_depth=3, tree_top_k=2, tree_total_tokens=6)):  # fmt: skip
                row = measure(target, drafter, args.packaged, args.prompts, args.new_tokens, tree, prompt_ids,
                              args.count_syncs)
                results.append(row)
                print(json.dumps(row), flush=True)
        args.shapes = []
    for shape in args.shapes:
        target, drafter = build(shape)
        for dtype in (getattr(torch, name) for name in args.dtypes):
            target, drafter = target.to(dtype), drafter.to(dtype)
            for tree in (dict(tree_depth=6, tree_top_k=8, tree_total_tokens=60),
                         dict(tree_depth=5, tree_top_k=1, tree_total_tokens=5)):  # fmt: skip
                start = time.time()
                row = measure(target, drafter, shape, args.prompts, args.new_tokens, tree, count_syncs=args.count_syncs)
                row["wall_s"] = round(time.time() - start, 1)
                results.append(row)
                print(json.dumps(row), flush=True)
    record = {
        "command": "python " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"processor": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                    "torch": torch.__version__},  # fmt: skip
        "results": results,
    }
    if args.out:
        args.out.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
