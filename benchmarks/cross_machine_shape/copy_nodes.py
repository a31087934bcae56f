"""tau/nodes of HASS (t3 + 3 n-gram nodes) with ngram_copy_nodes 0/6/8, held-aside prompts (skip 3)."""
import json, sys, torch, hf_spec
from hf_spec.resources import load_model
from hf_spec.bench.datasets import bench_prompt_ids
torch.set_num_threads(2)
target, tok = load_model("smollm2-135m-instruct", dtype=torch.bfloat16)
hass = hf_spec.AutoDrafter.from_pretrained("drafters/smollm2-135m-instruct-hass").to(torch.bfloat16)
prompts = bench_prompt_ids(tok, 3, skip=3)
res = {}
for copy in (0, 8, 6):
    hass.config.ngram_copy_nodes = copy
    r = dict(cycles=0, nodes=0, accepted=0, per_prompt=[])
    for ids in prompts:
        target.generate(ids, assistant_model=hass, max_new_tokens=96, do_sample=False)
        st = hass.last_generation_stats
        r["cycles"] += st.cycles; r["nodes"] += sum(st.tree_sizes); r["accepted"] += sum(st.accepted_lengths)
        r["per_prompt"].append(round(st.tau, 2))
    res[f"copy{copy}"] = r
    print(copy, "tau %.3f nodes %.2f" % (1 + r["accepted"] / r["cycles"], r["nodes"] / r["cycles"]), r["per_prompt"], flush=True)
json.dump(res, open("benchmarks/cross_machine_shape/copy_nodes.json", "w"), indent=1)
