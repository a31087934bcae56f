"""Drafters x tree shapes side by side, one machine moment, greedy, bf16, 2 threads (SmolLM2-135M-Instruct).

    python benchmarks/drafter_shape_ab.py OUT.json --skip 3 --per-set 3 --shapes SHAPES.json \
        --drafter NAME=PATH [--drafter NAME=PATH ...]

Plain greedy, transformers' prompt lookup (10 tokens) and every drafter under every shape of ``SHAPES.json``
(``{"label": {generate() options}}``; ``{}`` is the drafter's run-time choice) on ``--per-set`` prompts of
MT-bench, HumanEval and GSM8K after the first ``--skip`` of each, 128 new tokens, methods interleaved per prompt
(the first prompt runs once more, untimed, as a warm-up). Prints and writes per method: tokens/s, × plain,
× prompt lookup, τ (tokens per target forward), verified nodes per cycle, drafter ms per token.
"""
import argparse, json, time
import torch
import hf_spec
from hf_spec.bench.datasets import bench_prompt_ids

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--skip", type=int, default=3)
parser.add_argument("--per-set", type=int, default=3)
parser.add_argument("--shapes", required=True)
parser.add_argument("--drafter", action="append", required=True, help="NAME=PATH")
parser.add_argument("--max-new-tokens", type=int, default=128)
args = parser.parse_args()
torch.set_num_threads(2)
shapes = json.load(open(args.shapes))
drafters = {n: hf_spec.AutoDrafter.from_pretrained(p) for n, p in (a.split("=", 1) for a in args.drafter)}
target, tok = hf_spec.load_packaged_model("smollm2-135m-instruct", dtype=torch.bfloat16)
prompts = bench_prompt_ids(tok, args.per_set, skip=args.skip)
runs = {"plain": (None, {}), "prompt_lookup": (None, {"prompt_lookup_num_tokens": 10})}
runs.update({f"{n} {s}" if len(drafters) > 1 else s: (d, o) for s, o in shapes.items() for n, d in drafters.items()})
totals = {m: dict(seconds=0.0, tokens=0, accepted=0, cycles=0, nodes=0, drafter_seconds=0.0) for m in runs}
for i, ids in enumerate([prompts[0]] + prompts):
    for method, (drafter, options) in runs.items():
        kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=args.max_new_tokens, do_sample=False)
        kwargs.update(options, **({"assistant_model": drafter} if drafter is not None else {}))
        start = time.perf_counter()
        out = target.generate(ids, **kwargs)
        wall = time.perf_counter() - start
        if i == 0:
            continue  # warm-up
        t = totals[method]
        t["seconds"] += wall
        t["tokens"] += out.shape[1] - ids.shape[1]
        if drafter is not None:
            s = drafter.last_generation_stats
            t["accepted"] += sum(s.accepted_lengths); t["cycles"] += s.cycles; t["nodes"] += sum(s.tree_sizes)
            t["drafter_seconds"] += s.drafter_forward_seconds
    print(f"prompt {i}/{len(prompts)} done", flush=True)
rows = {}
plain = totals["plain"]["tokens"] / totals["plain"]["seconds"]
pl = totals["prompt_lookup"]["tokens"] / totals["prompt_lookup"]["seconds"]
for method, t in totals.items():
    rate = t["tokens"] / t["seconds"]
    row = {"tok_s": round(rate, 2), "x_plain": round(rate / plain, 3), "x_pl": round(rate / pl, 3)}
    if t["cycles"]:
        row.update(tau=round(1 + t["accepted"] / t["cycles"], 3), verified_nodes=round(t["nodes"] / t["cycles"], 2),
                   drafter_ms_per_token=round(1000 * t["drafter_seconds"] / t["tokens"], 2))
    rows[method] = row
    print(f"{method:24s} {row}")
json.dump({"command": "python " + " ".join(__import__("sys").argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "shapes": shapes, "rows": rows}, open(args.out, "w"), indent=1)
