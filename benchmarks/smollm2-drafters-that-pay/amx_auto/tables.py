"""Markdown tables of the amx_* runs (speedups over plain and over prompt lookup, same run).

    python benchmarks/smollm2-drafters-that-pay/amx_auto/tables.py [RUN FOLDER, default amx_auto]
"""
import json, math, sys
B = "benchmarks/smollm2-drafters-that-pay/" + (sys.argv[1] if len(sys.argv) > 1 else "amx_auto") + "/"
D = "hf_spec:drafters/smollm2-135m-instruct-"
NAMES = {"plain": "plain greedy", "prompt_lookup": "transformers prompt lookup", "hf_spec:ngram": "`NGramDrafter` (8 nodes)",
         "hf_spec:ngram:tokens=16": "`NGramDrafter` (16 nodes)", "hf_spec:ngram:datastore=drafters/smollm2-135m-instruct-hass":
         "`NGramDrafter` + datastore", D + "eagle": "EAGLE", D + "hass": "HASS (demo)", D + "coral": "CORAL",
         D + "parallelspec": "ParallelSpec", D + "hass:fixed_shape": "HASS, fixed fallback shape d2/k4/t3 + 3",
         D + "coral:no_router": "CORAL, router off"}
runs = {k: json.load(open(B + k + "/results.json")) for k in ("first3", "heldout", "code_edit")}
print("| method | τ first 3 | × plain | × PL | τ held-out | × plain | × PL | τ code edit | × plain | × PL |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for m, label in NAMES.items():
    if not any(m in run["summary"]["all"] for run in runs.values()):
        continue
    cells = []
    for k, run in runs.items():
        a = run["summary"]["all"]
        if m not in a:
            cells += ["", "", ""]; continue
        pl = a["prompt_lookup"]["speedup"]
        if m == "plain":
            cells += [f"{a[m]['tokens_per_s']:.1f} tok/s", "1.00×", ""]
        else:
            cells += [f"{a[m]['tau']:.2f}", f"{a[m]['speedup']:.2f}×", "" if m == "prompt_lookup" else f"{a[m]['speedup'] / pl:.2f}×"]
    print(f"| {label} | " + " | ".join(cells) + " |")
print()
print("Per data set, speedup over prompt lookup (same run):")
print("| method | " + " | ".join(f"{k} {ds}" for k in ("first3", "heldout") for ds in ("mt_bench", "humaneval", "gsm8k")) + " | code edit | geomean |")
print("|---|" + "---:|" * 8)
for m in ["hf_spec:ngram", "hf_spec:ngram:tokens=16", "hf_spec:ngram:datastore=drafters/smollm2-135m-instruct-hass",
          D + "eagle", D + "hass", D + "coral", D + "parallelspec"]:
    if m not in runs["first3"]["summary"]["all"]:
        continue
    ratios = []
    for k in ("first3", "heldout"):
        for ds in ("mt_bench", "humaneval", "gsm8k"):
            s = runs[k]["summary"][ds]; ratios.append(s[m]["speedup"] / s["prompt_lookup"]["speedup"])
    s = runs["code_edit"]["summary"]["all"]; ratios.append(s[m]["speedup"] / s["prompt_lookup"]["speedup"])
    g = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"| {NAMES[m]} | " + " | ".join(f"{r:.2f}" for r in ratios) + f" | {g:.2f} |")
print()
print("Papers' comparison, n-gram branches off, fixed tree d2/k4/t3 (same two runs):")
print("| drafter | τ first 3 | × plain | τ held-out | × plain | draft ms/cycle | 1st / 2nd draft accepted (held-out) |")
print("|---|---:|---:|---:|---:|---:|---:|")
try:
    P = {k: json.load(open(B + "papers_no_ngram/" + k + "/results.json")) for k in ("first3", "heldout")}
except FileNotFoundError:
    P = {k: json.load(open(B + "../amx_auto/papers_no_ngram/" + k + "/results.json")) for k in ("first3", "heldout")}
for m, label in [("prompt_lookup", "transformers prompt lookup"), (D + "eagle:ngram=0", "EAGLE"), (D + "hass:ngram=0", "HASS"),
                 (D + "coral:ngram=0", "CORAL, router on"), (D + "coral:no_router:ngram=0", "CORAL, router off"),
                 (D + "parallelspec:ngram=0", "ParallelSpec")]:
    f, h = P["first3"]["summary"]["all"][m], P["heldout"]["summary"]["all"][m]
    draft = "" if m == "prompt_lookup" else f"{f['draft_ms_per_cycle']:.1f} / {h['draft_ms_per_cycle']:.1f}"
    acc = h.get("acceptance_by_position") or []
    acc = " / ".join(f"{x:.2f}" for x in acc[:2]) if m != "prompt_lookup" else ""
    print(f"| {label} | {f['tau']:.2f} | {f['speedup']:.2f}× | {h['tau']:.2f} | {h['speedup']:.2f}× | {draft} | {acc} |")
