"""ParallelSpec shape sweep (exploration): tau and mean verified nodes, held-aside prompts (skip 3)."""
import sys, json, torch
import hf_spec
from hf_spec.resources import load_model
from hf_spec.bench.datasets import bench_prompt_ids
from hf_spec.drafters.datastore import NGramDatastore
torch.set_num_threads(2)
target, tok = load_model("smollm2-135m-instruct", dtype=torch.bfloat16)
ps = hf_spec.AutoDrafter.from_pretrained("drafters/smollm2-135m-instruct-parallelspec").to(torch.bfloat16)
ps.ngram_datastore = NGramDatastore.load("drafters/smollm2-135m-instruct-hass/ngram_datastore.safetensors")
ps.config.ngram_depth = 8
configs = {"d3_t6_g0": dict(tree_depth=3, tree_total_tokens=6, ngram_branches=0),
           "d3_t6_g3": dict(tree_depth=3, tree_total_tokens=6, ngram_branches=3),
           "d3_t4_g3": dict(tree_depth=3, tree_total_tokens=4, ngram_branches=3),
           "d3_t3_g3": dict(tree_depth=3, tree_total_tokens=3, ngram_branches=3),
           "d2_t3_g3": dict(tree_depth=2, tree_total_tokens=3, ngram_branches=3),
           "d2_t2_g3": dict(tree_depth=2, tree_total_tokens=2, ngram_branches=3)}
res = {k: dict(seconds=0.0, tokens=0, cycles=0, nodes=0, accepted=0) for k in configs}
for i, ids in enumerate(bench_prompt_ids(tok, 3, skip=3)):
    for name, kw in configs.items():
        out = target.generate(ids, assistant_model=ps, max_new_tokens=96, do_sample=False, **kw)
        st = ps.last_generation_stats; r = res[name]
        r["tokens"] += out.shape[1] - ids.shape[1]; r["cycles"] += st.cycles; r["nodes"] += sum(st.tree_sizes)
        r["accepted"] += sum(st.accepted_lengths); r["seconds"] += st.total_seconds
    print(i, flush=True)
json.dump(dict(results=res), open("benchmarks/cross_machine_shape/sweep_parallelspec.json", "w"), indent=1)
for k, r in res.items():
    c = r["cycles"]; print(f"{k:12s} tau {1 + r['accepted'] / c:4.2f} nodes {r['nodes'] / c:4.1f} draft+verify tok/s {r['tokens'] / r['seconds']:5.1f}")
