"""Markdown tables of one record folder's runs (first3 / first3_repeats3 (`--repeats 3`) / heldout6 / heldout9 / heldout15 / heldout20 / fresh64 / code_edit, each an `hf-spec bench`
output dir): τ, speedup over plain and over transformers' prompt lookup (same run) per method, then per data set
over prompt lookup with geometric means.

    python benchmarks/smollm2-drafters-that-pay/tables.py benchmarks/smollm2-drafters-that-pay/<record>
"""
import json
import math
import os
import sys

SETS = {"first3": "first 3", "first3_repeats3": "first 3 best of 3", "heldout6": "6..8", "heldout9": "9..11", "heldout15": "15..19", "heldout20": "20..29", "fresh64": "64..69", "code_edit": "code edit"}
HELD_OUT = ("heldout", "fresh")  # run folders of prompts never used to tune or choose


def label(method: str) -> str:
    """`hf_spec:<folder>` -> the folder's name, which says the family (and runs/ for unshipped ones)."""
    if method.startswith("hf_spec:ngram"):
        options = [o for o in method.split(":")[2:] if not o.startswith("datastore=")]
        return "NGramDrafter" + (" + datastore" if "datastore=" in method else "") + "".join(f" {o}" for o in options)
    if method.startswith("hf_spec:"):
        path = method.split(":", 1)[1]
        return ("new " if path.startswith("runs/") else "") + path.rsplit("-", 1)[-1]
    return method


def geo(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main(folder: str) -> None:
    runs = {k: json.load(open(os.path.join(folder, k, "results.json"))) for k in SETS
            if os.path.exists(os.path.join(folder, k, "results.json"))}  # fmt: skip
    methods = list(next(iter(runs.values()))["summary"]["all"])
    print("| method | " + " | ".join(f"τ {SETS[k]} | × plain | × PL" for k in runs) + " |")
    print("|---|" + "---:|---:|---:|" * len(runs))
    for m in methods:
        cells = []
        for run in runs.values():
            a = run["summary"]["all"]
            if m == "plain":
                cells += [f"{a[m]['tokens_per_s']:.1f} tok/s", "1.00×", ""]
            else:
                pl = a["prompt_lookup"]["speedup"]
                cells += [f"{a[m]['tau']:.2f}", f"{a[m]['speedup']:.2f}×",
                          "" if m == "prompt_lookup" else f"{a[m]['speedup'] / pl:.2f}×"]  # fmt: skip
        print(f"| {label(m)} | " + " | ".join(cells) + " |")
    cols = [(k, ds) for k in SETS if k in runs and k != "code_edit"
            for ds in ("mt_bench", "humaneval", "gsm8k", "code_edit") if ds in runs[k]["summary"]]
    cols += [("code_edit", "all")] if "code_edit" in runs else []
    print("\nPer data set, × plain / × prompt lookup (same run); geometric means over the held-out cells and all:")
    print("| method | " + " | ".join(f"{SETS[k]} {'' if ds == 'all' else ds}".strip() for k, ds in cols)
          + " | geomean held-out × plain / × PL | geomean all × plain / × PL |")  # fmt: skip
    print("|---|" + "---:|" * (len(cols) + 2))
    for m in methods[2:]:
        plain = [runs[k]["summary"][ds][m]["speedup"] for k, ds in cols]
        pl = [runs[k]["summary"][ds]["prompt_lookup"]["speedup"] for k, ds in cols]
        ratios = [a / b for a, b in zip(plain, pl)]
        held = [i for i, (k, _) in enumerate(cols) if k.startswith(HELD_OUT)]
        print(f"| {label(m)} | " + " | ".join(f"{a:.2f} / {r:.2f}" for a, r in zip(plain, ratios))
              + f" | {geo([plain[i] for i in held]):.2f} / {geo([ratios[i] for i in held]):.2f}"
              + f" | {geo(plain):.2f} / {geo(ratios):.2f} |")  # fmt: skip
    print("\nIdentical to plain greedy (answers): " + "; ".join(
        f"{SETS[k]}: " + ", ".join(f"{label(m)} {v['identical']}/{v['prompts']}" for m, v in run["summary"]["all"].items()
                                   if m != "plain") for k, run in runs.items()))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
