"""HASS hybrid shapes in fp32 (greedy text identical for every shape, so tau differences are real), held-aside prompts."""
import json, torch, hf_spec
from hf_spec.resources import load_model
from hf_spec.bench.datasets import bench_prompt_ids
torch.set_num_threads(2)
target, tok = load_model("smollm2-135m-instruct", dtype=torch.float32)
hass = hf_spec.AutoDrafter.from_pretrained("drafters/smollm2-135m-instruct-hass").to(torch.float32)
prompts = bench_prompt_ids(tok, 3, skip=3)
res = {}
for t, g, copy in ((3, 3, 8), (3, 3, 0), (2, 3, 8), (3, 2, 8), (4, 3, 8), (3, 4, 8), (5, 4, 0)):
    hass.config.ngram_copy_nodes = copy
    r = dict(cycles=0, nodes=0, accepted=0, drafter_s=0.0)
    for ids in prompts:
        target.generate(ids, assistant_model=hass, max_new_tokens=96, do_sample=False, tree_total_tokens=t, ngram_branches=g)
        st = hass.last_generation_stats
        r["cycles"] += st.cycles; r["nodes"] += sum(st.tree_sizes); r["accepted"] += sum(st.accepted_lengths)
    res[f"hass_t{t}_g{g}_copy{copy}"] = r
    print(t, g, copy, "tau %.3f nodes %.2f" % (1 + r["accepted"] / r["cycles"], r["nodes"] / r["cycles"]), flush=True)
json.dump({"dtype": "float32", "results": res}, open("benchmarks/cross_machine_shape/hass_fp32.json", "w"), indent=1)
