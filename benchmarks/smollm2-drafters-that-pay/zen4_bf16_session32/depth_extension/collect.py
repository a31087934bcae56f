"""Session 32. Per-cycle tree nodes (depth, cum log-prob, parent, accepted?) of the shipped EAGLE with a deep tree, no n-gram.
    python collect.py SKIP LIMIT OUT.json   (as run: 3 3 and 12 4, prompts 3..5 and 12..15 of each set)"""
import json, sys, time, torch
import hf_spec, hf_spec.decoding as dec
from hf_spec.resources import load_packaged_model
from hf_spec.bench.harness import build_prompts
model, tok = load_packaged_model("smollm2-135m-instruct", dtype=torch.bfloat16)
torch.set_num_threads(2)
dr = hf_spec.EagleDrafter.from_pretrained("drafters/smollm2-135m-instruct-eagle")
records = []
orig = dec.verify_tree
def rec(tree, logits, *a, **k):
    w = orig(tree, logits, *a, **k)
    records.append(dict(depths=tree.depths.tolist(), scores=[round(s, 4) for s in tree.scores.tolist()],
                        parents=tree.parents.tolist(), accepted=w.nodes))
    return w
dec.verify_tree = rec
skip, limit = int(sys.argv[1]), int(sys.argv[2])
prompts = build_prompts(tok, ["mt_bench", "humaneval", "gsm8k"], limit=limit, skip=skip)
out = {}
for shape in [dict(tree_depth=5, tree_top_k=4, tree_total_tokens=12), dict(tree_depth=1, tree_top_k=4, tree_total_tokens=4)]:
    key = f"d{shape['tree_depth']}t{shape['tree_total_tokens']}"
    out[key] = {"cycles": [], "draft_s": 0, "target_s": 0, "forwards": 0}
    for ds, ps in prompts.items():
        for p in ps:
            ids = torch.tensor([p["input_ids"]])
            records.clear()
            o = model.generate(ids, max_new_tokens=128, do_sample=False, assistant_model=dr, ngram_branches=0, **shape)
            s = dr.last_generation_stats
            out[key]["cycles"] += [dict(r, ds=ds) for r in records]
            out[key]["draft_s"] += s.drafter_forward_seconds; out[key]["target_s"] += s.target_forward_seconds
            out[key]["forwards"] += s.verify_forwards
            print(key, ds, s.new_tokens, s.verify_forwards, round(s.new_tokens / s.verify_forwards, 2), flush=True)
json.dump(out, open(sys.argv[3], "w"))
