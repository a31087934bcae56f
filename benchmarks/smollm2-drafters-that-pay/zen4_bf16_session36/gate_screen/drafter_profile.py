"""Where an EAGLE drafter forward (`EagleDraftingSession._run`: one decoder layer + the 8k-row draft head) spends its
time during a greedy generate() of SmolLM2-135M-Instruct (bf16, 2 threads, MT-bench prompt 40): self CPU time of the
ops under each drafter forward, torch profiler. Output: drafter_profile.log (session 36).
"""
import bisect, collections

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from transformers import AutoModel

import hf_spec  # noqa: F401  (registers the drafter classes with AutoModel)
from hf_spec.resources import load_packaged_model
from hf_spec.bench.harness import build_prompts
from hf_spec.drafters.eagle import EagleDraftingSession
torch.set_num_threads(2)
model, tok = load_packaged_model("smollm2-135m-instruct", dtype=torch.bfloat16)
dr = AutoModel.from_pretrained("drafters/smollm2-135m-instruct-eagle").eval()
orig = EagleDraftingSession._run
state = {"on": False}
def run(self, *a, **k):
    if state["on"]:
        with record_function("DRAFTER_RUN"):
            return orig(self, *a, **k)
    return orig(self, *a, **k)
EagleDraftingSession._run = run
p = build_prompts(tok, ["mt_bench"], limit=1, skip=40)["mt_bench"][0]
ids = torch.tensor([p["input_ids"]])
model.generate(ids, max_new_tokens=16, do_sample=False, assistant_model=dr)
state["on"] = True
# profile the whole generate(), then keep the ops inside each DRAFTER_RUN range
with profile(activities=[ProfilerActivity.CPU], with_stack=False) as prof:
    model.generate(ids, max_new_tokens=128, do_sample=False, assistant_model=dr)
evs = prof.events()
runs = [e for e in evs if e.name == "DRAFTER_RUN"]
print("drafter runs", len(runs), "avg ms", sum(e.cpu_time_total for e in runs) / len(runs) / 1000)
agg = collections.Counter(); cnt = collections.Counter()
intervals = sorted((e.time_range.start, e.time_range.end) for e in runs)
starts = [s for s, _ in intervals]
for e in evs:
    if e.name == "DRAFTER_RUN": continue
    i = bisect.bisect_right(starts, e.time_range.start) - 1
    if i >= 0 and e.time_range.end <= intervals[i][1]:
        agg[e.name] += e.self_cpu_time_total; cnt[e.name] += 1
tot = sum(agg.values())
for k, v in agg.most_common(22): print(f"{k:55s} {v/len(runs)/1000:.3f} ms/run  calls/run {cnt[k]/len(runs):.1f}")
print("sum self", tot / len(runs) / 1000)
