"""τ and verified nodes per cycle of each shipped SmolLM2 drafter's shape candidates, on held-aside prompts
(prompts 3..5 of MT-bench, HumanEval and GSM8K: neither the official first three nor the held-out 6..8).

Neither number depends on the machine, so this may run beside other work; ``hf_spec.shape_select`` combines
them at run time with the machine's measured verification and drafting costs.

    python benchmarks/shape_candidates/measure.py benchmarks/shape_candidates/candidates.json [NAME | NAME=PATH ...]

NAME alone is the shipped folder drafters/smollm2-135m-instruct-NAME; NAME=PATH measures another folder (e.g. a
retrained drafter before it replaces the shipped one). The target runs in ``DTYPE`` (environment; default
``auto``: bf16 where this CPU computes it natively, else float32); ``SKIP`` (environment, default 3) measures
prompts SKIP..SKIP+2 of each set instead (more held-aside prompts: 12 gives 12..14, used in session 32); ``N``
(default 3) prompts per set (sessions 35 and 36: ``SKIP=33 N=5``, prompts 33..37).
"""
import os
import json, sys, time
import torch
import hf_spec
from hf_spec.bench.datasets import bench_prompt_ids
from hf_spec.resources import load_model
from hf_spec.tune import measure_candidates

torch.set_num_threads(2)
EAGLE_FAMILY = [  # CPU without AMX ... CPU with AMX ... GPU-like flat verification cost
    dict(tree_depth=1, tree_top_k=4, tree_total_tokens=2, ngram_branches=3),
    dict(tree_depth=2, tree_top_k=4, tree_total_tokens=3, ngram_branches=3),
    dict(tree_depth=2, tree_top_k=4, tree_total_tokens=3, ngram_branches=8),
    dict(tree_depth=2, tree_top_k=4, tree_total_tokens=4, ngram_branches=8),
    dict(tree_depth=2, tree_top_k=4, tree_total_tokens=4, ngram_branches=16),
    dict(tree_depth=3, tree_top_k=4, tree_total_tokens=6, ngram_branches=8),
    dict(tree_depth=4, tree_top_k=6, tree_total_tokens=12, ngram_branches=8),
    dict(tree_depth=6, tree_top_k=8, tree_total_tokens=32, ngram_branches=12),
    dict(tree_depth=6, tree_top_k=10, tree_total_tokens=60, ngram_branches=16),
]
PARALLEL = [  # None: the configured widths [2, 1]; depth 1 (widths [2]): session 36, EAGLE's choice on this CPU
    dict(tree_depth=1, tree_top_k=2, tree_total_tokens=2, ngram_branches=3),
    dict(tree_depth=1, tree_top_k=2, tree_total_tokens=2, ngram_branches=8),
    dict(tree_depth=None, tree_top_k=None, tree_total_tokens=3, ngram_branches=3),
    dict(tree_depth=None, tree_top_k=None, tree_total_tokens=3, ngram_branches=8),
    dict(tree_depth=None, tree_top_k=None, tree_total_tokens=3, ngram_branches=16),
    dict(tree_depth=3, tree_top_k=3, tree_total_tokens=8, ngram_branches=8),
    dict(tree_depth=5, tree_top_k=4, tree_total_tokens=24, ngram_branches=12),
]
out_path = sys.argv[1]
drafters = sys.argv[2:] or ["hass", "eagle", "coral", "parallelspec"]
from hf_spec.hardware import dtype_name, resolve_dtype

dtype = resolve_dtype(os.environ.get("DTYPE", "auto"))
target, tok = load_model("smollm2-135m-instruct", dtype=dtype)
skip, n = int(os.environ.get("SKIP", 3)), int(os.environ.get("N", 3))
prompts = bench_prompt_ids(tok, n, skip=skip)
try:
    out = json.load(open(out_path))
except FileNotFoundError:
    out = {"command": "python " + " ".join(sys.argv), "prompts": f"{skip}..{skip + n - 1} of mt_bench, humaneval, gsm8k", "dtype": dtype_name(dtype),
           "max_new_tokens": 128, "drafters": {}}
for name in drafters:
    name, _, path = name.partition("=")
    path = path or f"drafters/smollm2-135m-instruct-{name}"
    drafter = hf_spec.AutoDrafter.from_pretrained(path).to(dtype)
    # the 60-token GPU tree costs ~8 s a generation here: measured for HASS only
    grid = PARALLEL if name.startswith("parallelspec") else EAGLE_FAMILY if name.startswith("hass") else EAGLE_FAMILY[:-1]
    start = time.time()
    rows = measure_candidates(target, drafter, prompts, grid, 128, progress=lambda m: print(name, m, flush=True))
    out["drafters"][name] = {"path": path, "seconds": round(time.time() - start), "candidates": rows}
    out["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    json.dump(out, open(out_path, "w"), indent=1)
    for r in rows:
        print(name, r, flush=True)
