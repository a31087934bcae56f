"""Pool several `hf-spec bench` output folders (same code, same settings, disjoint prompts) into per-data-set cells
of issue #14: speed of each method over plain and over transformers' prompt lookup, and of each hybrid over
`NGramDrafter` + datastore (its n-gram part) and over its drafter alone (`:ngram=0`, where the runs have it).

A cell's speed is pooled as in `hf-spec bench`'s own summary: all new tokens over all seconds of the cell's prompts
(fastest of the repeats). Beside each ratio, a 90% bootstrap interval over prompts (prompts resampled with
replacement within the data set, 2000 draws, fixed seed): how far the cell could move on another draw of prompts.

    python pool.py OUT.md FOLDER [FOLDER ...]
"""
import json
import math
import os
import random
import sys
from collections import defaultdict

DATASETS = ("mt_bench", "humaneval", "gsm8k", "code_edit")
NGRAM_DS = "NGramDrafter + datastore"


def label(method: str) -> str:
    if method.startswith("hf_spec:ngram"):
        return "NGramDrafter" + (" + datastore" if "datastore=" in method else "")
    if method.startswith("hf_spec:"):
        path, *options = method.split(":")[1:]
        return path.rsplit("-", 1)[-1] + (" alone" if "ngram=0" in options else "")
    return method


def load(folders):
    """{dataset: {prompt id: {method label: (new tokens, seconds)}}}, prompts from every folder."""
    cells = defaultdict(dict)
    for folder in folders:
        for s in json.load(open(os.path.join(folder, "results.json")))["samples"]:
            cells[s["dataset"]].setdefault(s["id"], {})[label(s["method"])] = (s["new_tokens"], s["seconds"])
    return cells


def speed(prompts, method):
    toks = sum(p[method][0] for p in prompts)
    return toks / sum(p[method][1] for p in prompts)


def ratio(prompts, a, b):
    return speed(prompts, a) / speed(prompts, b)


def interval(prompts, a, b, draws=2000, seed=0):
    rng = random.Random(seed)
    values = sorted(ratio([rng.choice(prompts) for _ in prompts], a, b) for _ in range(draws))
    return values[int(0.05 * draws)], values[int(0.95 * draws) - 1]


def geo(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs))


def main(out, folders):
    cells = load(folders)
    sets = [d for d in DATASETS if d in cells]
    methods = [m for m in next(iter(cells[sets[0]].values())) if m != "plain"]
    lines = [f"Pooled from: {', '.join(folders)}", "",
             "Prompts per data set: " + ", ".join(f"{d} {len(cells[d])}" for d in sets), ""]

    def table(title, base, rows, need_all=True):
        """One row per method in ``rows``: its speed over ``base`` (a method, or a function of the row's method)."""
        lines.extend([title, "", "| method | " + " | ".join(sets) + " | geomean |", "|---|" + "---:|" * (len(sets) + 1)])
        base_of = base if callable(base) else lambda m: base
        for m in rows:
            base = base_of(m)
            values, texts = [], []
            for d in sets:
                prompts = [p for p in cells[d].values() if m in p and base in p]
                if not prompts or (need_all and len(prompts) < len(cells[d])):
                    texts.append("–")
                    continue
                r = ratio(prompts, m, base)
                lo, hi = interval(prompts, m, base)
                values.append(r)
                texts.append(f"{r:.2f} [{lo:.2f}, {hi:.2f}]" + ("" if len(prompts) == len(cells[d]) else f" (n={len(prompts)})"))
            lines.append(f"| {m} | " + " | ".join(texts) + f" | {geo(values):.2f} |" if values else "")
        lines.append("")

    table("× plain (pooled tokens/s; 90% bootstrap interval over prompts):", "plain", methods, need_all=False)
    table("× transformers' prompt lookup (same runs):", "prompt_lookup",
          [m for m in methods if m != "prompt_lookup"], need_all=False)
    hybrids = [m for m in methods if m not in ("prompt_lookup", "NGramDrafter", NGRAM_DS) and not m.endswith("alone")]
    table(f"Each hybrid over its n-gram part ({NGRAM_DS}, same runs):", NGRAM_DS, hybrids)
    alone = [m for m in hybrids if any(f"{m} alone" in p for d in sets for p in cells[d].values())]
    if alone:
        table("Each hybrid over its drafter alone (`:ngram=0`, only on the prompts that ran it):",
              lambda m: f"{m} alone", alone, need_all=False)
    open(out, "w").write("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
