"""Shape sweep (exploration, not a recorded bench): tau, mean verified nodes and tok/s per config
on held-aside prompts (skip 3 of each bench set). tau and nodes do not depend on the machine."""
import sys, time, json, torch, itertools
import hf_spec
from hf_spec.resources import load_model
from hf_spec.bench.datasets import bench_prompt_ids
torch.set_num_threads(2)
skip, per, N = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
out_path = sys.argv[4]
target, tok = load_model("smollm2-135m-instruct", dtype=torch.bfloat16)
hass = hf_spec.AutoDrafter.from_pretrained("drafters/smollm2-135m-instruct-hass").to(torch.bfloat16)
ds = hass.ngram_datastore
ng = {f"ngram_t{t}": hf_spec.NGramDrafter(num_draft_tokens=t) for t in (4, 8, 16)}
ng.update({f"ngram_ds_t{t}": hf_spec.NGramDrafter(num_draft_tokens=t, datastore=ds) for t in (4, 8, 16)})
configs = {"plain": {}, "pl": dict(prompt_lookup_num_tokens=10)}
for name, d in ng.items():
    configs[name] = dict(assistant_model=d)
for t, g, nd in itertools.product((2, 3, 4), (0, 1, 2, 3), (4, 8)):
    if g == 0 and nd == 8: continue
    configs[f"hass_t{t}_g{g}_d{nd}"] = dict(assistant_model=hass, tree_total_tokens=t, ngram_branches=g, _ngram_depth=nd)
configs["hass_t5_g4_d8"] = dict(assistant_model=hass, tree_total_tokens=5, ngram_branches=4, _ngram_depth=8)
prompts = bench_prompt_ids(tok, per, skip=skip)
res = {k: dict(seconds=0.0, tokens=0, cycles=0, nodes=0, accepted=0) for k in configs}
for i, ids in enumerate(prompts):
    for name, kw in configs.items():
        kw = dict(kw)
        nd = kw.pop("_ngram_depth", None)
        if nd is not None: hass.config.ngram_depth = nd
        t = time.perf_counter()
        out = target.generate(ids, max_new_tokens=N, do_sample=False, **kw)
        dt = time.perf_counter() - t
        r = res[name]; r["seconds"] += dt; r["tokens"] += out.shape[1] - ids.shape[1]
        if "assistant_model" in kw:
            st = kw["assistant_model"].last_generation_stats
            r["cycles"] += st.cycles; r["nodes"] += sum(st.tree_sizes); r["accepted"] += sum(st.accepted_lengths)
    print(i, time.strftime("%H:%M:%S"), flush=True)
    json.dump(dict(prompts=i + 1, skip=skip, per=per, max_new_tokens=N, results=res), open(out_path, "w"), indent=1)
base = res["plain"]["tokens"] / res["plain"]["seconds"]
for k, r in res.items():
    c = max(r["cycles"], 1)
    print(f"{k:22s} {r['tokens']/r['seconds']:6.1f} tok/s {r['tokens']/r['seconds']/base:5.2f}x tau {1+r['accepted']/c:4.2f} nodes {r['nodes']/c:5.1f}")
