"""Confidence-sized trees (``tree_min_prob``) vs fixed trees, one machine moment, greedy, bf16, 2 threads.

    python benchmarks/confidence_floor/floor_ab.py OUT.json DRAFTER SKIP PER_SET

Runs plain greedy, transformers' prompt lookup and the drafter (``drafters/smollm2-135m-instruct-DRAFTER``) under
each shape below on ``PER_SET`` prompts of MT-bench, HumanEval and GSM8K after the first ``SKIP`` of each, 128 new
tokens, methods interleaved per prompt (the first prompt runs once more, untimed, as a warm-up). Writes per method
tokens/s, τ (tokens per target forward), verified nodes per cycle and drafter ms per token; the τ and nodes of a
shape are what ``tree_shape_candidates`` records (``hf_spec/shape_select.py``).
"""
import json, sys, time
import torch
import hf_spec
from hf_spec.bench.datasets import bench_prompt_ids

torch.set_num_threads(2)
out_path, name, skip, per_set = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
SHAPES = {  # label: generate() options (ngram_branches: n-gram nodes grafted per tree)
    "auto": {},  # the shipped candidates' run-time choice on this machine
    "d4k6t12n8": dict(tree_depth=4, tree_top_k=6, tree_total_tokens=12, ngram_branches=8),
    "d4k6t12n8 p0.1": dict(tree_depth=4, tree_top_k=6, tree_total_tokens=12, ngram_branches=8, tree_min_prob=0.1),
    "d4k6t12n8 p0.2": dict(tree_depth=4, tree_top_k=6, tree_total_tokens=12, ngram_branches=8, tree_min_prob=0.2),
    "d6k6t16n8 p0.2": dict(tree_depth=6, tree_top_k=6, tree_total_tokens=16, ngram_branches=8, tree_min_prob=0.2),
    "d6k6t16n3 p0.3": dict(tree_depth=6, tree_top_k=6, tree_total_tokens=16, ngram_branches=3, tree_min_prob=0.3),
    "d3k4t6n3 p0.1": dict(tree_depth=3, tree_top_k=4, tree_total_tokens=6, ngram_branches=3, tree_min_prob=0.1),
}
target, tok = hf_spec.load_packaged_model("smollm2-135m-instruct", dtype=torch.bfloat16)
drafter = hf_spec.AutoDrafter.from_pretrained(f"drafters/smollm2-135m-instruct-{name}")
prompts = bench_prompt_ids(tok, per_set, skip=skip)
methods = ["plain", "prompt_lookup", *SHAPES]
totals = {m: dict(seconds=0.0, tokens=0, accepted=0, cycles=0, nodes=0, drafter_seconds=0.0) for m in methods}
for i, ids in enumerate([prompts[0]] + prompts):
    for m in methods:
        kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=128, do_sample=False)
        if m == "prompt_lookup":
            kwargs["prompt_lookup_num_tokens"] = 10
        elif m != "plain":
            kwargs.update(assistant_model=drafter, **SHAPES[m])
        start = time.perf_counter()
        out = target.generate(ids, **kwargs)
        wall = time.perf_counter() - start
        if i == 0:
            continue  # warm-up
        t = totals[m]
        t["seconds"] += wall
        t["tokens"] += out.shape[1] - ids.shape[1]
        if m not in ("plain", "prompt_lookup"):
            s = drafter.last_generation_stats
            t["accepted"] += sum(s.accepted_lengths); t["cycles"] += s.cycles; t["nodes"] += sum(s.tree_sizes)
            t["drafter_seconds"] += s.drafter_forward_seconds
    print(f"prompt {i}/{len(prompts)} done", flush=True)
rows = {}
plain = totals["plain"]["tokens"] / totals["plain"]["seconds"]
pl = totals["prompt_lookup"]["tokens"] / totals["prompt_lookup"]["seconds"]
for m, t in totals.items():
    rate = t["tokens"] / t["seconds"]
    row = {"tok_s": round(rate, 2), "x_plain": round(rate / plain, 3), "x_pl": round(rate / pl, 3)}
    if t["cycles"]:
        row.update(tau=round(1 + t["accepted"] / t["cycles"], 3), verified_nodes=round(t["nodes"] / t["cycles"], 2),
                   drafter_ms_per_token=round(1000 * t["drafter_seconds"] / t["tokens"], 2))
    rows[m] = row
    print(f"{m:16s} {row}")
json.dump({"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "shapes": SHAPES, "rows": rows}, open(out_path, "w"), indent=1)
