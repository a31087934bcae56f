"""NGramDrafter budgets in fp32 (greedy text identical for every shape, so tau differences are real), held-aside prompts."""
import json, torch, hf_spec
from hf_spec.resources import load_model
from hf_spec.bench.datasets import bench_prompt_ids
torch.set_num_threads(2)
target, tok = load_model("smollm2-135m-instruct", dtype=torch.float32)
prompts = bench_prompt_ids(tok, 3, skip=3)
res = {}
for t in (4, 6, 8, 12, 16):
    drafter = hf_spec.NGramDrafter(num_draft_tokens=t)
    r = dict(cycles=0, nodes=0, accepted=0)
    for ids in prompts:
        target.generate(ids, assistant_model=drafter, max_new_tokens=96, do_sample=False)
        st = drafter.last_generation_stats
        r["cycles"] += st.cycles; r["nodes"] += sum(st.tree_sizes); r["accepted"] += sum(st.accepted_lengths)
    res[f"ngram_t{t}"] = r
    print(t, "tau %.3f nodes %.2f" % (1 + r["accepted"] / r["cycles"], r["nodes"] / r["cycles"]), flush=True)
json.dump({"dtype": "float32", "results": res}, open("benchmarks/cross_machine_shape/ngram_fp32.json", "w"), indent=1)
