"""No kernel choice is final (:mod:`hf_spec.kernel_trials`): a choice older than ``RECHECK_SECONDS`` goes on trial
again when the next block starts, in the linear layers' block as in the attention's, and that trial's calls join the
evidence of the trials before it."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hf_spec import attention_kernels, kernel_trials, linear_kernels
from hf_spec.kernel_trials import (DISCOUNT, EARLY_CALLS, FAR_BEHIND, RECHECK_SECONDS, KernelEvidence, decision,
                                   expired, running, timed_turn, trial_samples)


pytestmark = pytest.mark.usefixtures("fresh_kernel_choices")  # each test measures from scratch


def test_expired_takes_out_the_choices_older_than_the_recheck_age():
    made = {"old": 0.0, "new": RECHECK_SECONDS}
    assert expired(made, now=RECHECK_SECONDS + 1.0) == ["old"] and made == {"new": RECHECK_SECONDS}


def test_a_decision_waits_for_every_share_and_keeps_the_default_on_a_close_call():
    assert decision({"a": [9, 1, 1], "b": [9, 2, 2]}, ("a", "b"), 3, "b", 0.1) == "a"  # 2x faster: a
    assert decision({"a": [9, 1.0, 1.0], "b": [9, 1.05, 1.05]}, ("a", "b"), 3, "b", 0.1) == "b"  # close: the default
    assert decision({"a": [9, 1, 1], "b": [9, 2]}, ("a", "b"), 3, "b", 0.1) is None  # b lacks its share


class _FakeClock:
    """``time`` for :mod:`hf_spec.kernel_trials`: each kernel's call advances it by that kernel's cost."""

    def __init__(self, costs):
        self.now, self.costs, self.calls = 0.0, costs, {kernel: 0 for kernel in costs}

    def perf_counter(self):
        return self.now

    def run(self, kernel):
        self.now += self.costs[kernel]
        self.calls[kernel] += 1


def _trial(monkeypatch, costs, default, share=8):
    """One trial of ``costs``'s kernels on a fake clock to its decision: (choice, calls per kernel, evidence)."""
    clock = _FakeClock(costs)
    monkeypatch.setattr(kernel_trials, "time", clock)
    samples, kernels, evidence = {k: [] for k in costs}, tuple(costs), KernelEvidence()
    choice = None
    while choice is None:
        assert sum(clock.calls.values()) < 100
        timed_turn(samples, kernels, clock.run)
        choice = decision(samples, kernels, share, default, 0.1, evidence)
    return choice, clock.calls, evidence


def test_a_kernel_far_behind_in_its_early_calls_stops_taking_turns_in_that_trial(monkeypatch):
    # as SmolLM2's head over 4 rows in float32 on a Zen 1 (ms): the default F.linear 22.9, packed 18.4, transposed 8.5
    choice, calls, evidence = _trial(monkeypatch, {"F.linear": 22.9, "packed": 18.4, "transposed": 8.5}, "F.linear")
    assert choice == "transposed"
    # the two slow ones ran their early calls only, and the lone survivor then ended the trial (not 8 calls each)
    assert calls == {"F.linear": EARLY_CALLS + 1, "packed": EARLY_CALLS + 1, "transposed": EARLY_CALLS + 1}
    # their calls still joined the evidence
    assert evidence.ratio("transposed") == pytest.approx(8.5 / 22.9)
    assert evidence.ratio("packed") == pytest.approx(18.4 / 22.9)
    # kernels within FAR_BEHIND of each other all run their whole share
    choice, calls, _ = _trial(monkeypatch, {"F.linear": 1.0, "packed": 1.2, "transposed": 0.8}, "F.linear")
    assert choice == "transposed" and calls == {"F.linear": 8, "packed": 8, "transposed": 8}
    # one far behind of three: the other two decide on their whole share
    choice, calls, _ = _trial(monkeypatch, {"F.linear": 1.0, "packed": 1.1, "transposed": 2.0}, "F.linear")
    assert choice == "F.linear" and calls == {"F.linear": 8, "packed": 8, "transposed": EARLY_CALLS + 1}


def test_no_kernel_stops_before_its_early_calls_or_on_one_slow_call():
    early = [9.0] + [1.0] * EARLY_CALLS  # a first call, then the early ones
    too_soon = {"a": early[:-1], "b": [9.0] + [2.0] * (EARLY_CALLS - 1)}  # 2x behind, one early call short
    assert running(too_soon, ("a", "b")) == ("a", "b")
    stall = {"a": early, "b": early[:2] + [5.0] + early[3:]}  # one stall among b's calls: its median holds
    assert running(stall, ("a", "b")) == ("a", "b")
    behind = {"a": early, "b": [9.0] + [FAR_BEHIND * 1.05] * EARLY_CALLS}
    assert running(behind, ("a", "b")) == ("a",)
    assert decision(behind, ("a", "b"), 8, "b", 0.1) == "a"  # the lone survivor decides at once


def test_one_slow_trial_does_not_overturn_the_evidence_but_a_lasting_change_does():
    evidence = KernelEvidence()
    for _ in range(4):  # "a" 30% faster than the default, four trials running
        assert decision({"a": [9, 0.7, 0.7], "b": [9, 1, 1]}, ("a", "b"), 3, "b", 0.1, evidence) == "a"
    assert evidence.ratio("a") == pytest.approx(0.7) and evidence.ratio("b") == 1.0 and evidence.trials == 4
    # one trial that met a slow spell (a 1.3x the default, alone enough to keep the default) leaves "a" chosen
    assert decision({"a": [9, 1.3, 1.3], "b": [9, 1, 1]}, ("a", "b"), 3, "b", 0.1, evidence) == "a"
    while decision({"a": [9, 1.3, 1.3], "b": [9, 1, 1]}, ("a", "b"), 3, "b", 0.1, evidence) == "a":
        assert evidence.trials < 8  # the machine changed for good: the evidence follows within a few trials
    assert evidence.ratio("a") > 0.9
    # a kernel missing from this trial (a weight that could not be packed) is not chosen from old evidence
    assert evidence.choice(("b",), "b", 0.1) == "b"


def test_the_evidence_discounts_older_trials():
    evidence = KernelEvidence()
    evidence.add({"a": 0.5, "b": 1.0}, "b")
    evidence.add({"a": 1.0, "b": 1.0}, "b")
    expected = math.exp(DISCOUNT * math.log(0.5) / (DISCOUNT + 1.0))
    assert evidence.ratio("a") == pytest.approx(expected)


def test_a_kernel_far_behind_sits_out_a_doubling_number_of_trials():
    evidence, kernels = KernelEvidence(), ("F.linear", "transposed", "packed")
    sat_out = []
    for trial in range(16):
        running = evidence.start_trial(kernels)
        assert "F.linear" in running and "transposed" in running  # the default, and a kernel close behind, always run
        sat_out.append("packed" not in running)
        medians = {"F.linear": 1.0, "transposed": 1.2, "packed": 6.0}
        evidence.add({k: medians[k] for k in running}, "F.linear")
        assert evidence.choice(running, "F.linear", 0.1) == "F.linear"
    # runs, sits out 1, runs, sits out 2, runs, sits out 4, runs, sits out 8 (cut at 16 trials)
    assert sat_out == [False, True, False, True, True, False] + [True] * 4 + [False] + [True] * 5
    # once it no longer trails that far, it runs in every trial again
    evidence = KernelEvidence()
    evidence.add({"a": 1.0, "b": FAR_BEHIND * 1.1}, "a")
    assert evidence.start_trial(("a", "b")) == ("a",)
    assert evidence.start_trial(("a", "b")) == ("a", "b")
    for _ in range(6):
        evidence.add({"a": 1.0, "b": 1.0}, "a")
    assert evidence.start_trial(("a", "b")) == ("a", "b") and not evidence.sitting_out


def test_trial_samples_open_a_trial_of_the_kernels_not_sitting_out_and_keep_it_until_decided():
    trials, evidences = {}, {}
    samples = trial_samples(trials, evidences, "k", ("a", "b"), "a")
    assert samples == {"a": [], "b": []} and trials["k"] is samples
    samples["a"].append(1.0)
    assert trial_samples(trials, evidences, "k", ("a", "b"), "a") is samples  # the trial under way
    del trials["k"]
    evidences["k"].add({"a": 1.0, "b": FAR_BEHIND * 2}, "a")  # b far behind: it sits the next trial out
    assert trial_samples(trials, evidences, "k", ("a", "b"), "a") is None and "k" not in trials
    assert trial_samples(trials, evidences, "k", ("a", "b"), "a") == {"a": [], "b": []}  # then runs again


def test_an_old_linear_choice_is_measured_again_in_the_next_block(monkeypatch):
    monkeypatch.setattr(kernel_trials, "FAR_BEHIND", float("inf"))  # a tiny layer's other kernels may trail far
    torch.manual_seed(0)
    layer = nn.Linear(16, 8, bias=False)
    base = ((8, 16), torch.float32, torch.get_num_threads())
    with torch.no_grad(), linear_kernels.few_row_linears(layer):
        for _ in range(linear_kernels.WARMUP_CALLS + 1 + linear_kernels.TRIAL_CALLS):  # + the untimed call that packs
            layer(torch.randn(1, 16))
            layer(torch.randn(2, 16))
    assert set(linear_kernels._tables[base]) == {1, 2} and not linear_kernels._trials
    linear_kernels._made[(base, 1)] -= RECHECK_SECONDS + 1.0  # the 1-row choice is old, the 2-row one is not
    with torch.no_grad(), linear_kernels.few_row_linears(layer):
        assert set(linear_kernels._tables[base]) == {2} and (base, 1) not in linear_kernels._made
        for _ in range(linear_kernels.WARMUP_CALLS + 2):  # (a call may pack the weight again: untimed)
            x = torch.randn(1, 16)
            torch.testing.assert_close(layer(x), x @ layer.weight.t())
        assert (base, 1) in linear_kernels._trials  # on trial again
        for _ in range(linear_kernels.TRIAL_CALLS):
            layer(torch.randn(1, 16))
    assert set(linear_kernels._tables[base]) == {1, 2} and (base, 1) in linear_kernels._made
    assert linear_kernels._evidence[(base, 1)].trials == 2 and linear_kernels._evidence[(base, 2)].trials == 1


def test_an_old_attention_choice_is_measured_again_in_the_next_block():
    key = (torch.float32, 1, 4, 2, 16, 3, 128)
    attention_kernels._tables[key], attention_kernels._made[key] = "grouped", 0.0
    fresh = (torch.float32, 1, 4, 2, 16, 1, 128)
    attention_kernels._tables[fresh], attention_kernels._made[fresh] = "sdpa", float("inf")
    with attention_kernels.few_query_attention():
        assert attention_kernels._tables == {fresh: "sdpa"} and key not in attention_kernels._made
