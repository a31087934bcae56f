"""NGramDrafter (+ the shipped datastore) tree budgets beside transformers' prompt lookup, interleaved per prompt
(order rotated), each arm timed REPEATS times per prompt (fastest kept). bf16, 2 threads, T=0, 128 new tokens.
Usage: ab_ngram.py SKIP LIMIT ARM... where ARM is name=key:value,... (NGramDrafter kwargs) or 'pl'."""
import math, os, sys, time, torch
import hf_spec
from hf_spec.resources import load_packaged_model
from hf_spec.bench.harness import build_prompts
from hf_spec.drafters.datastore import find_datastore
skip, limit = int(sys.argv[1]), int(sys.argv[2])
repeats = int(os.environ.get("REPEATS", "2"))
datasets = os.environ.get("DATASETS", "mt_bench humaneval gsm8k code_edit").split()
model, tok = load_packaged_model("smollm2-135m-instruct", dtype=torch.bfloat16)
torch.set_num_threads(2)
store = find_datastore("drafters/smollm2-135m-instruct-eagle")
arms = []
for a in sys.argv[3:]:
    name, _, spec = a.partition("=")
    kw = dict((kv.split(":")[0], int(kv.split(":")[1])) for kv in spec.split(",") if kv)
    arms.append((name, None if name == "pl" else hf_spec.NGramDrafter(datastore=store, **kw)))
ps = build_prompts(tok, datasets, limit=limit, skip=skip)
ids = [(ds, torch.tensor([p["input_ids"]])) for ds, v in ps.items() for p in v]


def run(drafter, x):
    kw = {"prompt_lookup_num_tokens": 10} if drafter is None else {"assistant_model": drafter}
    t = time.perf_counter(); out = model.generate(x, max_new_tokens=128, do_sample=False, **kw)
    return out.shape[1] - x.shape[1], time.perf_counter() - t


for _, d in arms:
    run(d, ids[0][1][:, :64])
rate, logs = {}, {}
for i, (ds, x) in enumerate(ids):
    order = arms[i % len(arms):] + arms[:i % len(arms)]
    best = {}
    for r in range(repeats):
        for name, d in (order if r % 2 == 0 else order[::-1]):
            n, s = run(d, x)
            best[name] = max(best.get(name, 0.0), n / s)
    for name, _ in arms:
        for key in (ds, "all"):
            logs.setdefault((name, key), []).append(math.log(best[name] / best["pl"]))
    print(i, ds, " ".join(f"{k}={v:.1f}" for k, v in best.items()), flush=True)
for (name, key), v in sorted(logs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print(f"{key:9s} {name:12s} geomean over prompt lookup {math.exp(sum(v) / len(v)):.3f} ({len(v)} prompts)", flush=True)
