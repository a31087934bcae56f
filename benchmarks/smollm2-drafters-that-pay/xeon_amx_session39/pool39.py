"""Pool ab_engine.py logs: per data set, the geometric mean over prompts (of every log given) of one arm's tokens/s
over another's, each prompt's fastest of two timings, with a 90% bootstrap interval (prompts resampled per set).

    [FIRST=1] [SKIP=LOG:INDEX,...] python pool39.py PAIR,PAIR,... LOG [LOG ...]      PAIR: arm/reference, e.g. ngram/pl

FIRST=1 pools each prompt's first timing instead; SKIP leaves prompts out (e.g. SKIP=r1_bf16.log:1).
"""
import math, os, random, re, sys

SETS = ["mt_bench", "humaneval", "gsm8k", "code_edit"]

FIRST = os.environ.get("FIRST") == "1"  # pool the first timings ("first N set ..." lines) instead of the fastest
SKIP = {tuple(x.split(":")) for x in os.environ.get("SKIP", "").split(",") if x}  # LOG:INDEX pairs left out


def rows(path):
    for line in open(path):
        m = re.match(r"^first (\d+) (\w+) ([^|]*)\|" if FIRST else r"^(\d+) (\w+) ([^|]*)\|", line)
        if m and (path.split("/")[-1], m.group(1)) in SKIP:
            continue
        if m:
            yield m.group(2), {k: float(v) for k, v in (kv.split("=") for kv in m.group(3).split())}


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


pairs = [p.split("/") for p in sys.argv[1].split(",")]
data = [r for path in sys.argv[2:] for r in rows(path)]
rng = random.Random(0)
print("| arm / reference | " + " | ".join(SETS) + " | geomean of sets | prompts |")
print("|---|" + "---:|" * (len(SETS) + 2))
for a, b in pairs:
    cells, means, n = [], [], 0
    for ds in SETS:
        ratios = [s[a] / s[b] for d, s in data if d == ds and a in s and b in s]
        n += len(ratios)
        draws = sorted(geomean([rng.choice(ratios) for _ in ratios]) for _ in range(2000))
        means.append(geomean(ratios))
        cells.append(f"{means[-1]:.3f} [{draws[100]:.2f}, {draws[1899]:.2f}]")
    print(f"| {a} / {b} | " + " | ".join(cells) + f" | **{geomean(means):.3f}** | {n} |")
