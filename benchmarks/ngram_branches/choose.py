"""Choose HASS's default ``ngram_branches`` / ``ngram_depth`` (with and without the n-gram datastore) on
held-aside prompts.

τ and the verified tree size come from greedy generation on prompts 3..5 of each benchmark set (not the
reported ones); tokens/s is PREDICTED from this machine's measured costs in benchmarks/tune/hass.json
(verify cost of the tree size + drafting) and measured by wall clock (2 threads; meaningful only when alone).
    python benchmarks/ngram_branches/choose.py runs/train/hass runs/features/smollm2-sharegpt-distill [OUT.json] [DEPTHS]

The tree is the drafter folder's tuned shape; tokens/s measured (wall) is reported beside the prediction.
Rows are (n-gram branches, n-gram depth (None: the tree's), datastore).
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
out_name = sys.argv[3] if len(sys.argv) > 3 else "results.json"
with_depths = len(sys.argv) > 4
here = Path(__file__).parent
tune = json.load(open("benchmarks/tune/hass.json"))
verify_ms = {int(k): v for k, v in tune["verify_ms"].items()}
torch.set_num_threads(2)
model, tokenizer = hf_spec.load_packaged_model("smollm2-135m-instruct", dtype=torch.bfloat16)
drafter = hf_spec.EagleDrafter.from_pretrained(drafter_dir, dtype=torch.bfloat16)
store = datastore_from_feature_cache(cache)
prompts = bench_prompt_ids(tokenizer, per_set=3, skip=3)
shape = dict(tree_depth=drafter.config.tree_depth, tree_top_k=drafter.config.tree_top_k,
             tree_total_tokens=drafter.config.tree_total_tokens)
sizes = []
original = EagleDraftingSession.graft_ngram


def graft(self, tree, next_tokens):
    out = original(self, tree, next_tokens)
    sizes.append(len(out))
    return out


EagleDraftingSession.graft_ngram = graft
rows = []
variants = [(0, None, False), (8, None, False), (4, None, True), (8, None, True), (12, None, True), (16, None, True)]
if with_depths:
    variants = [(8, None, False), (4, None, True), (4, 8, True), (8, 8, True), (12, 8, True), (16, 8, True)]
for branches, depth, use_store in variants:
    drafter.ngram_datastore = store if use_store else None
    drafter.config.ngram_depth = depth
    sizes.clear()
    tokens = cycles = 0
    began = time.perf_counter()
    for ids in prompts:
        out = model.generate(ids, assistant_model=drafter, ngram_branches=branches, max_new_tokens=96, do_sample=False,
                             **shape)
        s = drafter.last_generation_stats
        tokens += out.shape[1] - ids.shape[1]
        cycles += s.cycles
    wall = time.perf_counter() - began
    tau = tokens / cycles
    mean_size = sum(sizes) / len(sizes)
    ms = interpolate_cost(verify_ms, mean_size) + tune["best"]["predicted"]["draft_ms"]
    row = {"ngram_branches": branches, "ngram_depth": depth, "datastore": use_store, "tau": tau,
           "mean_tree_tokens": mean_size, "predicted_ms_per_cycle": ms, "predicted_tokens_per_s": 1000 * tau / ms,
           "measured_tokens_per_s": tokens / wall}
    rows.append(row)
    print(json.dumps(row), flush=True)
json.dump({"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "prompts": f"3..5 of each set (9), 96 new tokens, bf16, tree {shape}", "rows": rows},
          open(here / out_name, "w"), indent=1)
