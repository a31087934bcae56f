"""Markdown tables of this folder's runs: τ and speedup over plain / prompt lookup (same run), per data set too.

    python benchmarks/smollm2-drafters-that-pay/zen3_fp32_session27/tables.py
"""
import json, math, os
B = os.path.dirname(os.path.abspath(__file__))
D = "hf_spec:drafters/smollm2-135m-instruct-"
NAMES = {"plain": "plain greedy", "prompt_lookup": "transformers prompt lookup",
         "hf_spec:ngram:datastore=drafters/smollm2-135m-instruct-hass": "`NGramDrafter` + datastore",
         D + "eagle": "EAGLE", D + "hass": "HASS (demo)", D + "coral": "CORAL", D + "parallelspec": "ParallelSpec",
         "hf_spec:runs/pub/e3-4ep": "EAGLE-3 (4 epochs over 1,631 turns)",
         "hf_spec:runs/pub/hass-dscopy": "HASS + datastore copy cycles",
         D + "eagle:fixed_shape:ngram=0": "EAGLE alone", D + "hass:fixed_shape:ngram=0": "HASS alone",
         "hf_spec:runs/pub/e3-4ep:fixed_shape:ngram=0": "EAGLE-3 alone"}
SETS = ("mt_bench", "humaneval", "gsm8k")


def table(runs):
    heads = list(runs)
    print("| method | " + " | ".join(f"τ {k} | × plain" + (" | × PL" if "prompt_lookup" in runs[k]["summary"]["all"] else "")
                                     for k in heads) + " |")
    print("|---|" + "|".join("---:|---:" + ("|---:" if "prompt_lookup" in runs[k]["summary"]["all"] else "") for k in heads) + "|")
    for m, label in NAMES.items():
        if not any(m in r["summary"]["all"] for r in runs.values()):
            continue
        cells = []
        for k in heads:
            a = runs[k]["summary"]["all"]
            has_pl = "prompt_lookup" in a
            if m not in a:
                cells += [""] * (3 if has_pl else 2); continue
            if m == "plain":
                cells += [f"{a[m]['tokens_per_s']:.1f} tok/s", "1.00×"] + ([""] if has_pl else [])
                continue
            cells += [f"{a[m]['tau']:.2f}", f"{a[m]['speedup']:.2f}×"]
            if has_pl:
                cells += ["" if m == "prompt_lookup" else f"{a[m]['speedup'] / a['prompt_lookup']['speedup']:.2f}×"]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()


def per_set(runs, base):
    print(f"Per data set, speedup over {base} (same run):")
    keys = [(k, ds) for k in runs for ds in SETS]
    print("| method | " + " | ".join(f"{k} {ds}" for k, ds in keys) + " | geomean |")
    print("|---|" + "---:|" * (len(keys) + 1))
    for m, label in NAMES.items():
        if m in ("plain", base) or not all(m in runs[k]["summary"][ds] for k, ds in keys):
            continue
        r = [runs[k]["summary"][ds][m]["speedup"] / runs[k]["summary"][ds][base]["speedup"] for k, ds in keys]
        print(f"| {label} | " + " | ".join(f"{x:.2f}" for x in r) + f" | {math.exp(sum(map(math.log, r)) / len(r)):.2f} |")
    print()


load = lambda k: json.load(open(os.path.join(B, k, "results.json")))
have = [k for k in ("tuning3", "heldout6", "heldout9", "heldout6_d4t8_no_ngram") if os.path.exists(os.path.join(B, k, "results.json"))]
if "tuning3" in have:
    print("Tuning prompts 3..5:"); table({"3..5": load("tuning3")}); per_set({"3..5": load("tuning3")}, "plain")
held = {k.replace("heldout", "") + ".." + str(int(k.replace("heldout", "")) + 2): load(k) for k in have if k in ("heldout6", "heldout9")}
if held:
    print("Held-out prompts:"); table(held); per_set(held, "prompt_lookup")
    per_set(held, "hf_spec:ngram:datastore=drafters/smollm2-135m-instruct-hass")
if "heldout6_d4t8_no_ngram" in have:
    a = load("heldout6_d4t8_no_ngram")["summary"]["all"]
    print("Drafters alone (n-gram off, d4/k4/t8), prompts 6..8:")
    print("| drafter | τ | × plain | draft ms/cycle | 1st / 2nd / 3rd draft accepted |")
    print("|---|---:|---:|---:|---:|")
    for m, v in a.items():
        if m == "plain":
            continue
        acc = " / ".join(f"{x:.2f}" for x in (v.get("acceptance_by_position") or [])[:3])
        print(f"| {NAMES.get(m, m)} | {v['tau']:.2f} | {v['speedup']:.2f}× | {v['draft_ms_per_cycle']:.1f} | {acc} |")
