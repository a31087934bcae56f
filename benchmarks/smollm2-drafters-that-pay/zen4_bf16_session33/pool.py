"""Pool several `hf-spec bench` runs of the same prompts (e.g. the issue's first-3 run repeated): per data set and
method, total new tokens / total seconds, × plain and × prompt lookup, and each run's own ratios beside them.

    python pool.py RUN_DIR [RUN_DIR ...]
"""
import json
import sys
from collections import defaultdict

runs = [json.load(open(f"{d}/results.json")) for d in sys.argv[1:]]
methods = list(runs[0]["summary"]["all"])


def pooled(rows, dataset):
    tokens, seconds = defaultdict(int), defaultdict(float)
    for r in rows:
        if dataset in ("all", r["dataset"]):
            tokens[r["method"]] += r["new_tokens"]
            seconds[r["method"]] += r["seconds"]
    return {m: tokens[m] / seconds[m] for m in tokens}


def label(m):
    return m.replace("hf_spec:drafters/smollm2-135m-instruct-", "").replace("hf_spec:", "")


for dataset in ["all", "mt_bench", "humaneval", "gsm8k"]:
    each = [pooled(run["samples"], dataset) for run in runs]
    allrows = pooled([r for run in runs for r in run["samples"]], dataset)
    print(f"\n{dataset}: pooled over {len(runs)} runs (× plain / × prompt lookup); then each run's")
    print("| method | pooled | " + " | ".join(f"run {i + 1}" for i in range(len(runs))) + " |")
    print("|---|---:|" + "---:|" * len(runs))
    for m in methods[1:]:
        cells = [allrows] + each
        text = [f"{c[m] / c['plain']:.2f} / {c[m] / c['prompt_lookup']:.2f}" for c in cells]
        print(f"| {label(m)} | " + " | ".join(text) + " |")
