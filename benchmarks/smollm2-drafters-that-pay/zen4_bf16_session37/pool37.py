"""Pool this folder's A/B logs: per data set, the geometric mean over prompts of one arm's tokens/s over another's
(each prompt's fastest of two timings), with a 90% bootstrap interval (prompts resampled within the data set).

    python pool37.py ab64.log ab52.log [ab58.log]      # -> the tables in README.md

A pair is pooled over the logs whose runs have both arms; `ab58.log`'s `scored+ds` and `eagle` are not this
commit's (see README.md), so its pairs with them are left out unless asked for (--all).
"""
import math, random, re, sys

SETS = ["mt_bench", "humaneval", "gsm8k", "code_edit"]
PAIRS = [("scored", "before"), ("scored+ds", "before+ds"), ("eagle", "eagle_before"), ("ps", "ps_before"),
         ("pl", "plain"), ("before", "pl"), ("scored", "pl"), ("before+ds", "pl"), ("scored+ds", "pl"),
         ("eagle", "pl"), ("ps", "pl"), ("eagle", "scored+ds"), ("ps", "scored+ds"),
         ("eagle_before", "before+ds"), ("ps_before", "before+ds")]
NOT_THIS_COMMIT = {"ab58.log": {"scored+ds", "eagle"}}


def prompts(path):
    """[(data set, {arm: tokens/s})] of one log's per-prompt lines."""
    rows = []
    for line in open(path):
        m = re.match(r"^\d+ (\w+) ([^|]*)", line)
        if m and "=" in m.group(2):
            rows.append((m.group(1), {k: float(v) for k, v in (kv.split("=") for kv in m.group(2).split())}))
    return rows


def geomean(ratios):
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def interval(ratios, rng, draws=2000):
    means = sorted(geomean([rng.choice(ratios) for _ in ratios]) for _ in range(draws))
    return means[int(0.05 * draws)], means[int(0.95 * draws) - 1]


if __name__ == "__main__":
    every = "--all" in sys.argv
    paths = [p for p in sys.argv[1:] if not p.startswith("--")]
    logs = {p: prompts(p) for p in paths}
    rng = random.Random(0)
    print("| arm / reference | " + " | ".join(SETS) + " | geomean of the sets | prompts |")
    print("|---|" + "---:|" * (len(SETS) + 2))
    for a, b in PAIRS:
        by_set = {s: [] for s in SETS}
        for path, rows in logs.items():
            skip = set() if every else NOT_THIS_COMMIT.get(path.split("/")[-1], set())
            for ds, speed in rows:
                if a in speed and b in speed and not ({a, b} & skip):
                    by_set[ds].append(speed[a] / speed[b])
        if not any(by_set.values()):
            continue
        cells, means = [], []
        for s in SETS:
            r = by_set[s]
            if r:
                lo, hi = interval(r, rng)
                means.append(geomean(r))
                cells.append(f"{means[-1]:.3f} [{lo:.2f}, {hi:.2f}]")
            else:
                cells.append("")
        n = sum(len(v) for v in by_set.values())
        print(f"| {a} / {b} | " + " | ".join(cells) + f" | **{geomean(means):.3f}** | {n} |")
