"""The fresh-machine benchmark's readings (benchmarks/fresh_machine.py, compare_runs.py) on made-up round times: the
paired reading's interval grows with how much rounds disagree, and two runs are called within 5% of each other,
not, or unresolved by their noise."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # compare_runs imports fresh_machine by name
    spec.loader.exec_module(module)
    return module


fresh_machine = load("fresh_machine", BENCHMARKS / "fresh_machine.py")
compare_runs = load("compare_runs", BENCHMARKS / "fresh_machine" / "compare_runs.py")


def run(speedups, noise, prompts: int = 14, rounds: int = 2) -> dict:
    """A results.json of ``prompts`` prompts: plain takes 4 s a round, the method ``speedups[i]`` times less, each
    round of it off by a factor exp(+-noise) in turn."""
    rows = []
    for i in range(prompts):
        method = [4.0 / speedups[i % len(speedups)] * math.exp(noise * (-1) ** (i + k)) for k in range(rounds)]
        rows.append({"prompt": f"p{i}", "plain": {"seconds_by_round": [4.0] * rounds},
                     "method": {"seconds_by_round": method}})  # fmt: skip
    return {"methods": ["plain", "method"], "prompts": rows}


def test_the_paired_reading_is_the_geometric_mean_and_its_interval_grows_with_the_rounds_disagreement():
    steady, noisy = run([1.5, 2.0], 0.01), run([1.5, 2.0], 0.1)
    centre, low, high = fresh_machine.paired_reading(steady["prompts"], "method", "plain")
    assert centre == pytest.approx(math.sqrt(1.5 * 2.0)) and low < centre < high
    _, noisy_low, noisy_high = fresh_machine.paired_reading(noisy["prompts"], "method", "plain")
    assert math.log(noisy_high / noisy_low) == pytest.approx(10 * math.log(high / low))
    one_round = run([1.5], 0.1, rounds=1)
    assert fresh_machine.paired_reading(one_round["prompts"], "method", "plain")[1:] == (None, None)


@pytest.mark.parametrize(("second", "noise", "verdict"), [(1.5, 0.01, "met"), (1.5 * 1.1, 0.01, "not met"),
                                                          (1.5 * 1.04, 0.1, "unresolved")])  # fmt: skip
def test_two_runs_are_within_five_percent_not_or_unresolved(second, noise, verdict):
    (row,) = compare_runs.compare(run([1.5], noise), run([second], noise))
    assert row["ratio"] == pytest.approx(second / 1.5) and row["verdict"] == verdict


def test_run_to_run_is_also_read_over_the_prompts_whose_texts_both_runs_share():
    first, second = run([1.5], 0.01), run([1.5, 2.0], 0.01)  # run 2 faster on the odd prompts…
    for i, (a, b) in enumerate(zip(first["prompts"], second["prompts"])):
        a["plain"]["text"] = b["plain"]["text"] = f"answer {i}"
        a["method"]["identical"] = True  # …where its text changed: other work, not another speed
        b["method"].update({"identical": True} if i % 2 == 0 else {"identical": False, "text": f"other {i}"})
    (row,) = compare_runs.compare(first, second)
    assert row["ratio"] == pytest.approx(math.sqrt(2.0 / 1.5)) and row["verdict"] == "not met"
    assert row["same_text"] == 7 and row["same_text_ratio"][0] == pytest.approx(1.0)
    assert "| 7/14 | 1.000 (" in compare_runs.markdown([row])
