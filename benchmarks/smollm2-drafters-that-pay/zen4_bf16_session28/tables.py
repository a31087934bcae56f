"""Markdown tables of this folder's runs (speedups over plain and over prompt lookup, same run).

    python benchmarks/smollm2-drafters-that-pay/zen4_bf16_session28/tables.py
"""
import json, math, os
B = os.path.dirname(os.path.abspath(__file__)) + "/"
D = "hf_spec:drafters/smollm2-135m-instruct-"
NAMES = {"plain": "plain greedy", "prompt_lookup": "transformers prompt lookup", "hf_spec:ngram": "`NGramDrafter` (8 nodes)",
         "hf_spec:ngram:datastore=drafters/smollm2-135m-instruct-hass": "`NGramDrafter` + datastore", D + "eagle": "EAGLE",
         D + "hass": "HASS (demo)", D + "coral": "CORAL", D + "parallelspec": "ParallelSpec"}
SETS = {"first3": "first 3", "heldout6": "6..8", "heldout9": "9..11", "code_edit": "code edit"}
runs = {k: json.load(open(B + k + "/results.json")) for k in SETS if os.path.exists(B + k + "/results.json")}
print("| method | " + " | ".join(f"τ {SETS[k]} | × plain | × PL" for k in runs) + " |")
print("|---|" + "---:|---:|---:|" * len(runs))
for m, label in NAMES.items():
    cells = []
    for k, run in runs.items():
        a = run["summary"]["all"]
        pl = a["prompt_lookup"]["speedup"]
        if m == "plain":
            cells += [f"{a[m]['tokens_per_s']:.1f} tok/s", "1.00×", ""]
        else:
            cells += [f"{a[m]['tau']:.2f}", f"{a[m]['speedup']:.2f}×", "" if m == "prompt_lookup" else f"{a[m]['speedup'] / pl:.2f}×"]
    print(f"| {label} | " + " | ".join(cells) + " |")
print()
print("Per data set, speedup over prompt lookup (same run); geomean over the held-out cells (6..11) and over all:")
cols = [(k, ds) for k in ("first3", "heldout6", "heldout9") if k in runs for ds in ("mt_bench", "humaneval", "gsm8k")]
cols += [("code_edit", "all")] if "code_edit" in runs else []
print("| method | " + " | ".join(f"{SETS[k]} {ds if ds != 'all' else ''}".strip() for k, ds in cols) + " | geomean held-out | geomean all |")
print("|---|" + "---:|" * (len(cols) + 2))
geo = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")
for m in list(NAMES)[2:]:
    ratios = [runs[k]["summary"][ds][m]["speedup"] / runs[k]["summary"][ds]["prompt_lookup"]["speedup"] for k, ds in cols]
    held = [r for (k, _), r in zip(cols, ratios) if k.startswith("heldout")]
    print(f"| {NAMES[m]} | " + " | ".join(f"{r:.2f}" for r in ratios) + f" | {geo(held):.2f} | {geo(ratios):.2f} |")
print()
print("Identical to plain greedy (answers), per run: " + ", ".join(
    f"{SETS[k]}: " + " ".join(f"{NAMES[m].split(' ')[0]} {v['identical']}/{v['prompts']}" for m, v in run["summary"]["all"].items() if m in NAMES)
    for k, run in runs.items()))
P = B + "papers_heldout6/results.json"
if os.path.exists(P):
    a = json.load(open(P))["summary"]["all"]
    print()
    print("Papers' comparison on 6..8, n-gram branches off, fixed tree d2/k4/t3 (ParallelSpec widths [2, 1], 3 tokens):")
    print("| drafter | τ | × plain | draft ms/cycle | verified/cycle | 1st / 2nd draft accepted |")
    print("|---|---:|---:|---:|---:|---:|")
    for m, label in [("prompt_lookup", "transformers prompt lookup"), (D + "eagle:ngram=0", "EAGLE"), (D + "hass:ngram=0", "HASS"),
                     (D + "coral:ngram=0", "CORAL, router on"), (D + "coral:no_router:ngram=0", "CORAL, router off"),
                     (D + "parallelspec:ngram=0", "ParallelSpec")]:
        v = a[m]
        if m == "prompt_lookup":
            print(f"| {label} | {v['tau']:.2f} | {v['speedup']:.2f}× | | | |"); continue
        acc = " / ".join(f"{x:.2f}" for x in (v.get("acceptance_by_position") or [])[:2])
        print(f"| {label} | {v['tau']:.2f} | {v['speedup']:.2f}× | {v['draft_ms_per_cycle']:.1f} | {v['verified_per_cycle']:.1f} | {acc} |")
