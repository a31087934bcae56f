"""Two fresh-machine runs side by side: is the second within 5% of the first, beyond the timing noise?

    python benchmarks/fresh_machine/compare_runs.py RUN1/results.json RUN2/results.json

For each method, each run's speedup over plain paired by round (see ``fresh_machine.paired_reading``), and run 2
over run 1 with the 95% interval of the two runs' timing noise together. The issue's target, two cold runs within
5%, is **met** when that interval lies inside 0.95-1.05, **not met** when it lies outside, and **unresolved** (the
noise is too large to say) when it straddles a bound. Reads the JSON files only.

Where a method's text for a prompt differs between the runs (bf16: the controller's tree sizes, chosen from measured
times, round differently at near-ties), the two runs did different work on that prompt: a longer answer, other
drafts. So beside the reading over every prompt, each row gives run 2 over run 1 over the prompts whose texts are the
same in both runs, which separates the machine's and the policy's speed from the texts' divergence.
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


def output_text(row: dict, name: str) -> str | None:
    """``name``'s text for one prompt of a results.json (plain's where it was identical; None: not recorded)."""
    entry = row[name]
    if "text" in entry:
        return entry["text"]
    return row["plain"].get("text") if entry.get("identical") else None


def run_ratio(first: list[dict], second: list[dict], name: str):
    """Over these prompts: run 1's and run 2's paired readings of ``name``'s speedup over plain, run 2 over run 1,
    and the low and high of that ratio's 95% interval (None without two rounds)."""
    a, b = paired_reading(first, name, "plain"), paired_reading(second, name, "plain")
    ratio = b[0] / a[0]
    widths = [half_width(a), half_width(b)]
    if None in widths:
        return a, b, ratio, None, None
    half = math.hypot(*widths)
    return a, b, ratio, ratio * math.exp(-half), ratio * math.exp(half)


def compare(first: dict, second: dict) -> list[dict]:
    rows = []
    for name in [m for m in first["methods"] if m in second["methods"] and m != "plain"]:
        a, b, ratio, low, high = run_ratio(first["prompts"], second["prompts"], name)
        texts = [(output_text(x, name), output_text(y, name)) for x, y in zip(first["prompts"], second["prompts"])]
        same = [i for i, (x, y) in enumerate(texts) if x is not None and x == y]
        row = {"method": name, "run1": a, "run2": b, "ratio": ratio, "low": low, "high": high,
               "verdict": verdict(low, high), "same_text": len(same), "prompts": len(first["prompts"]),
               "same_text_ratio": None}  # fmt: skip
        if same and len(same) < len(first["prompts"]):
            _, _, same_ratio, same_low, same_high = run_ratio([first["prompts"][i] for i in same],
                                                              [second["prompts"][i] for i in same], name)  # fmt: skip
            row["same_text_ratio"] = (same_ratio, same_low, same_high)
        rows.append(row)
    return rows


def format_ratio(ratio: float, low: float | None, high: float | None) -> str:
    """Run 2 over run 1 as "ratio (low-high)" (the ratio alone without an interval)."""
    return f"{ratio:.3f}" + ("" if low is None else f" ({low:.2f}-{high:.2f})")


def markdown(rows) -> str:
    lines = ["| method | run 1, x plain paired | run 2, x plain paired | run 2 / run 1 | within 5% | same text | "
             "run 2 / run 1, same texts |", "|---|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        same = r["same_text_ratio"]
        same_cell = "all" if r["same_text"] == r["prompts"] else "–" if same is None else format_ratio(*same)
        lines.append(f"| {r['method']} | {format_reading(r['run1'])} | {format_reading(r['run2'])} | "
                     f"{format_ratio(r['ratio'], r['low'], r['high'])} | {r['verdict']} | "
                     f"{r['same_text']}/{r['prompts']} | {same_cell} |")
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
