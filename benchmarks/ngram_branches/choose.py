"""Choose HASS's default ``ngram_branches`` (with and without the n-gram datastore) on held-aside prompts.

τ and the verified tree size come from greedy generation on prompts 3..5 of each benchmark set (not the
reported ones); tokens/s is PREDICTED from this machine's measured costs in benchmarks/tune/hass.json
(verify cost of the tree size + drafting), so that τ can be measured while other jobs share the cores.
    python benchmarks/ngram_branches/choose.py runs/train/hass runs/features/smollm2-sharegpt-distill
"""

import json
import sys
import time
from pathlib import Path

import torch

import hf_spec
from hf_spec.bench.datasets import bench_prompt_ids
from hf_spec.drafters.datastore import datastore_from_feature_cache
from hf_spec.drafters.eagle import EagleDraftingSession
from hf_spec.tune import interpolate_cost

drafter_dir, cache = sys.argv[1], sys.argv[2]
here = Path(__file__).parent
tune = json.load(open("benchmarks/tune/hass.json"))
verify_ms = {int(k): v for k, v in tune["verify_ms"].items()}
torch.set_num_threads(1)
model, tokenizer = hf_spec.load_packaged_model("smollm2-135m-instruct", dtype=torch.bfloat16)
drafter = hf_spec.EagleDrafter.from_pretrained(drafter_dir, dtype=torch.bfloat16)
store = datastore_from_feature_cache(cache)
prompts = bench_prompt_ids(tokenizer, per_set=3, skip=3)
shape = dict(tree_depth=2, tree_top_k=6, tree_total_tokens=6)
sizes = []
original = EagleDraftingSession.graft_ngram


def graft(self, tree, next_tokens):
    out = original(self, tree, next_tokens)
    sizes.append(len(out))
    return out


EagleDraftingSession.graft_ngram = graft
rows = []
for branches, use_store in [(0, False), (8, False), (4, True), (8, True), (12, True), (16, True), (24, True)]:
    drafter.ngram_datastore = store if use_store else None
    sizes.clear()
    tokens = cycles = 0
    draft_s = 0.0
    for ids in prompts:
        out = model.generate(ids, assistant_model=drafter, ngram_branches=branches, max_new_tokens=96, do_sample=False,
                             **shape)
        s = drafter.last_generation_stats
        tokens += out.shape[1] - ids.shape[1]
        cycles += s.cycles
    tau = tokens / cycles
    mean_size = sum(sizes) / len(sizes)
    ms = interpolate_cost(verify_ms, mean_size) + tune["best"]["predicted"]["draft_ms"]
    row = {"ngram_branches": branches, "datastore": use_store, "tau": tau, "mean_tree_tokens": mean_size,
           "predicted_ms_per_cycle": ms, "predicted_tokens_per_s": 1000 * tau / ms}
    rows.append(row)
    print(json.dumps(row), flush=True)
json.dump({"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "prompts": "3..5 of each set (9), 96 new tokens, bf16, tree d2/k6/t6", "rows": rows},
          open(here / "results.json", "w"), indent=1)
