"""Verify forward time by tree size: hybrid EAGLE vs NGramDrafter + datastore on the same prompts (interleaved)."""
import sys, time, collections, torch
import hf_spec
from hf_spec import decoding
from hf_spec.resources import load_packaged_model
from hf_spec.bench.harness import build_prompts
from transformers import AutoModel
skip, limit, ds = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
model, tok = load_packaged_model("smollm2-135m-instruct", dtype=torch.bfloat16)
torch.set_num_threads(2)
dr = AutoModel.from_pretrained("drafters/smollm2-135m-instruct-eagle").eval()
ng = hf_spec.NGramDrafter(datastore=dr.ngram_datastore)
log = []
orig = decoding._Target.forward
def fwd(self, input_ids, cache, attention_mask=None, position_ids=None):
    t = time.perf_counter(); out = orig(self, input_ids, cache, attention_mask, position_ids)
    log.append((input_ids.shape[1], time.perf_counter() - t, cache.get_seq_length())); return out
decoding._Target.forward = fwd
ps = build_prompts(tok, [ds], limit=limit, skip=skip)[ds]
model.generate(torch.tensor([ps[0]["input_ids"]]), max_new_tokens=16, assistant_model=dr)
res = {"hybrid": collections.defaultdict(list), "ngram+ds": collections.defaultdict(list)}
for i, p in enumerate(ps):
    for name, a in (("hybrid", dr), ("ngram+ds", ng)) if i % 2 == 0 else (("ngram+ds", ng), ("hybrid", dr)):
        log.clear()
        model.generate(torch.tensor([p["input_ids"]]), max_new_tokens=128, do_sample=False, assistant_model=a)
        for n, s, ctx in log[1:]:  # the prefill left out
            res[name][min(n, 25) // 4 * 4].append(s)
for name, d in res.items():
    tot = sum(len(v) for v in d.values())
    print(name, "cycles", tot, "mean ms", round(1000 * sum(sum(v) for v in d.values()) / tot, 1))
    for k in sorted(d):
        print(f"   nodes {k:2d}-{k+3:2d}: {len(d[k]):4d} cycles, {1000 * sum(d[k]) / len(d[k]):.1f} ms")
