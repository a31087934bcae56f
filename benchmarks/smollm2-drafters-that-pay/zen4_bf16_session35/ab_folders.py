"""A/B of drafter folders, NGramDrafter (+ a datastore) and transformers' prompt lookup, interleaved per prompt
(order rotated, each arm timed REPEATS times per prompt, the fastest kept). bf16, 2 threads, T=0, 128 new tokens.

    python ab_folders.py SKIP LIMIT ARM...

ARM: name=<drafter folder> | name=ngram:<datastore folder or none>[:key=value,...] (NGramDrafter kwargs) | pl.
DATASETS (environment): default "mt_bench humaneval gsm8k code_edit". Prints per prompt tokens/s, then per data
set each arm's geometric mean of tokens/s over the first arm's, τ and verified nodes per cycle, and the shape
each folder chose on this machine.
"""
import math, os, sys, time

import torch
from transformers import AutoModel

import hf_spec
from hf_spec.bench.harness import build_prompts
from hf_spec.drafters.datastore import find_datastore
from hf_spec.resources import load_model

skip, limit = int(sys.argv[1]), int(sys.argv[2])
repeats = int(os.environ.get("REPEATS", "2"))
datasets = os.environ.get("DATASETS", "mt_bench humaneval gsm8k code_edit").split()
torch.set_num_threads(2)
model, tok = load_model("smollm2-135m-instruct", dtype=torch.bfloat16)
arms = []
for spec in sys.argv[3:]:
    name, _, what = spec.partition("=")
    if name == "pl":
        arms.append((name, None))
    elif what.startswith("ngram:"):
        folder, _, options = what[len("ngram:"):].partition(":")
        kw = {k: int(v) for k, v in (kv.split("=") for kv in options.split(",") if kv)}
        arms.append((name, hf_spec.NGramDrafter(datastore=None if folder == "none" else find_datastore(folder), **kw)))
    else:
        arms.append((name, AutoModel.from_pretrained(what).eval()))
prompts = build_prompts(tok, datasets, limit=limit, skip=skip)
jobs = [(ds, torch.tensor([p["input_ids"]])) for ds, items in prompts.items() for p in items]


def run(drafter, ids, new=128):
    kw = {"prompt_lookup_num_tokens": 10} if drafter is None else {"assistant_model": drafter}
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False, **kw)
    return out.shape[1] - ids.shape[1], time.perf_counter() - start


for _, d in arms:  # warm-up (and each folder's run-time shape choice)
    run(d, jobs[0][1], 16)
logs, totals, choice = {}, {}, {}
for i, (ds, ids) in enumerate(jobs):
    order = arms[i % len(arms):] + arms[:i % len(arms)]
    best = {}
    for r in range(repeats):
        for name, d in (order if r % 2 == 0 else order[::-1]):
            n, s = run(d, ids)
            best[name] = max(best.get(name, 0.0), n / s)
            if r == 0 and d is not None:
                st = d.last_generation_stats
                for key in (ds, "all"):
                    t = totals.setdefault((name, key), [0, 0, 0])
                    t[0] += st.new_tokens; t[1] += st.cycles; t[2] += sum(st.tree_sizes)
                if st.shape_choice is not None:
                    choice[name] = {k: v for k, v in st.shape_choice.items() if k.startswith(("tree", "ngram", "tau"))}
    for name, _ in arms:
        for key in (ds, "all"):
            logs.setdefault((name, key), []).append(math.log(best[name] / best[arms[0][0]]))
    print(i, ds, " ".join(f"{k}={v:.1f}" for k, v in best.items()), flush=True)
for (name, key), v in sorted(logs.items(), key=lambda kv: (kv[0][1], [a for a, _ in arms].index(kv[0][0]))):
    t = totals.get((name, key))
    extra = f"  tau {t[0] / t[1]:.2f}  nodes {t[2] / t[1]:.1f}" if t else ""
    print(f"{key:9s} {name:12s} geomean over {arms[0][0]} {math.exp(sum(v) / len(v)):.3f} ({len(v)} prompts){extra}", flush=True)
for name, c in choice.items():
    print("shape", name, c, flush=True)
