"""Chain length and confidence stop for a sorted drafter, on held-out prompts (not the bench's).

    python benchmarks/s2d-qwen-exit-adapters/chain_pilot.py DRAFTER TARGET OUT.json THRESHOLDS... 

Greedy, bf16, 2 threads; prompts 10 of MT-bench, HumanEval and GSM8K (the bench uses 6..7), 32 new tokens.
For each (tree_depth, tree_min_prob) and each thresholds triple given as "a,b,c": tokens/s and the proxy of
:func:`hf_spec.drafters.sorted.search_thresholds` (tokens per target-forward-equivalent).
"""
import json, sys, time, warnings
import torch
from hf_spec import SortedDrafter
from hf_spec.bench.datasets import BENCH_DATASETS, render_prompt
from hf_spec.bench.harness import load_model
from hf_spec.drafters.sorted import search_thresholds

torch.set_num_threads(2)
PATH, TARGET, OUT = sys.argv[1:4]
CANDIDATES = [[float(x) for x in t.split(",")] for t in sys.argv[4:]]
DEPTHS, FLOORS = (2, 3, 4, 6), (0.0, 0.2, 0.4)
target, tok = load_model(TARGET, torch.bfloat16)
target.config._name_or_path = TARGET
drafter = SortedDrafter.from_pretrained(PATH, dtype=torch.bfloat16).eval()
prompts = [torch.tensor([render_prompt(tok, BENCH_DATASETS[ds]()[10])]) for ds in ("mt_bench", "humaneval", "gsm8k")]
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    target.generate(prompts[0], assistant_model=drafter, max_new_tokens=8, do_sample=False)  # warm-up, binds
start, plain_tokens = time.perf_counter(), 0
for prompt in prompts:
    plain_tokens += target.generate(prompt, max_new_tokens=32, do_sample=False).shape[1] - prompt.shape[1]
plain = plain_tokens / (time.perf_counter() - start)
print(f"plain {plain:.2f} tok/s", flush=True)
results = []
for depth in DEPTHS:
    for floor in FLOORS:
        _, rows = search_thresholds(drafter, target, prompts, candidates=CANDIDATES, metric="tokens_per_second",
                                    max_new_tokens=32, record=False, tree_depth=depth, tree_min_prob=floor)
        for r in rows:
            r.update(tree_depth=depth, tree_min_prob=floor)
            print(json.dumps(r), flush=True)
        results += rows
results.sort(key=lambda r: -r["tokens_per_second"])
for r in results:
    r["x_plain"] = round(r["tokens_per_second"] / plain, 3)
json.dump({"command": "python " + " ".join(sys.argv), "plain_tokens_per_second": plain, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "results": results}, open(OUT, "w"), indent=1)
print("best", json.dumps(results[0]))
