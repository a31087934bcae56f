"""A/B of hybrid drafter arms (config overrides) beside NGramDrafter + the drafter's datastore; interleaved per
prompt (order rotated), bf16, 2 threads, T=0, 128 new tokens. Usage: ab.py DRAFTER SKIP LIMIT ARM... where an
ARM is name=key:value,key:value (empty: shipped config) or 'ngram' (NGramDrafter + datastore). DATASETS (environment):
the data sets, default "mt_bench humaneval gsm8k"."""
import sys, time, json, math, torch
import hf_spec
from hf_spec.resources import load_packaged_model
from hf_spec.bench.harness import build_prompts
name, skip, limit = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
arms = []
for a in sys.argv[4:]:
    arm, _, spec = a.partition("=")
    arms.append((arm, dict((kv.split(":")[0], int(kv.split(":")[1])) for kv in spec.split(",") if kv)))
import os
datasets = os.environ.get("DATASETS", "mt_bench humaneval gsm8k").split()
model, tok = load_packaged_model("smollm2-135m-instruct", dtype=torch.bfloat16)
torch.set_num_threads(2)
from transformers import AutoModel
drafters = {}  # one drafter object per arm: learned state (ngram_adaptive_skip_nodes) is kept per object
for arm, over in arms:
    drafters[arm] = AutoModel.from_pretrained(f"drafters/smollm2-135m-instruct-{name}").eval()
    for k, v in over.items():
        setattr(drafters[arm].config, k, v)
dr = drafters[arms[0][0]]
ng = hf_spec.NGramDrafter(datastore=dr.ngram_datastore)
ps = build_prompts(tok, datasets, limit=limit, skip=skip)
ids = [(ds, torch.tensor([p["input_ids"]])) for ds, v in ps.items() for p in v]
model.generate(ids[0][1], max_new_tokens=16, do_sample=False, assistant_model=dr)  # warm-up (first arm's object)
res = {}
logratio = {}
for i, (ds, x) in enumerate(ids):
    order = arms[i % len(arms):] + arms[:i % len(arms)]
    times = {}
    for arm, over in order:
        a = ng if arm == "ngram" else drafters[arm]
        t = time.perf_counter(); model.generate(x, max_new_tokens=128, do_sample=False, assistant_model=a); dt = time.perf_counter() - t
        s = a.last_generation_stats
        times[arm] = s.new_tokens / dt
        for key in ((arm, ds), (arm, "all")):
            r = res.setdefault(key, [0, 0.0, 0, 0])
            r[0] += s.new_tokens; r[1] += dt; r[2] += s.cycles; r[3] += sum(s.tree_sizes)
    for arm, _ in arms:
        for key in ((arm, ds), (arm, "all")):
            logratio.setdefault(key, []).append(math.log(times[arm] / times[arms[0][0]]))
    print(i, ds, " ".join(f"{a}={v:.1f}" for a, v in times.items()), flush=True)
for (arm, ds), (tok_, sec, cyc, nodes) in sorted(res.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    g = math.exp(sum(logratio[(arm, ds)]) / len(logratio[(arm, ds)]))
    print(f"{name} {ds:9s} {arm:10s}: {tok_/sec:5.1f} tok/s  geo/first {g:.3f}  tau {tok_/cyc:.2f}  nodes {nodes/cyc:.1f}  tokens {tok_}", flush=True)
