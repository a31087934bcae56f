"""Two fresh-machine runs side by side: is the second within 5% of the first, beyond the timing noise?

    python benchmarks/fresh_machine/compare_runs.py RUN1/results.json RUN2/results.json

For each method, each run's speedup over plain paired by round (see ``fresh_machine.paired_reading``), and run 2
over run 1 with the 95% interval of the two runs' timing noise together. The issue's target, two cold runs within
5%, is **met** when that interval lies inside 0.95-1.05, **not met** when it lies outside, and **unresolved** (the
noise is too large to say) when it straddles a bound. Reads the JSON files only.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fresh_machine import format_reading, paired_reading  # noqa: E402

WITHIN = 0.05


def half_width(reading) -> float | None:
    """The half-width of a paired reading's interval in logs (None: no interval)."""
    _, low, high = reading
    return None if low is None else (math.log(high) - math.log(low)) / 2


def verdict(low: float | None, high: float | None) -> str:
    if low is None:
        return "no interval (one round)"
    if 1 - WITHIN <= low and high <= 1 + WITHIN:
        return "met"
    if high < 1 - WITHIN or low > 1 + WITHIN:
        return "not met"
    return "unresolved"


def compare(first: dict, second: dict) -> list[dict]:
    rows = []
    for name in [m for m in first["methods"] if m in second["methods"] and m != "plain"]:
        a, b = paired_reading(first["prompts"], name, "plain"), paired_reading(second["prompts"], name, "plain")
        ratio = b[0] / a[0]
        widths = [half_width(a), half_width(b)]
        if None in widths:
            low = high = None
        else:
            half = math.hypot(*widths)
            low, high = ratio * math.exp(-half), ratio * math.exp(half)
        rows.append({"method": name, "run1": a, "run2": b, "ratio": ratio, "low": low, "high": high,
                     "verdict": verdict(low, high)})  # fmt: skip
    return rows


def markdown(rows) -> str:
    lines = ["| method | run 1, x plain paired | run 2, x plain paired | run 2 / run 1 | within 5% |",
             "|---|---:|---:|---:|---|"]
    for r in rows:
        span = "" if r["low"] is None else f" ({r['low']:.2f}-{r['high']:.2f})"
        lines.append(f"| {r['method']} | {format_reading(r['run1'])} | {format_reading(r['run2'])} | "
                     f"{r['ratio']:.3f}{span} | {r['verdict']} |")
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    first, second = (json.loads(Path(p).read_text()) for p in sys.argv[1:])
    if [r["prompt"] for r in first["prompts"]] != [r["prompt"] for r in second["prompts"]]:
        raise SystemExit("The two runs timed different prompts. Fix: compare runs of the same fresh_machine.py.")
    for path, run in zip(sys.argv[1:], (first, second)):
        if any("seconds_by_round" not in r["plain"] for r in run["prompts"]):
            raise SystemExit(f"{path} keeps only each method's best time (a run of an older fresh_machine.py), so its "
                             "rounds cannot be paired. Fix: compare runs that record seconds_by_round.")
    print(markdown(compare(first, second)), end="")


if __name__ == "__main__":
    main()
