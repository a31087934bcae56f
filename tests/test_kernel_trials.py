"""No kernel choice is final (:mod:`hf_spec.kernel_trials`): a choice older than ``RECHECK_SECONDS`` goes on trial
again when the next block starts, in the linear layers' block as in the attention's, and that trial's calls join the
evidence of the trials before it."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from hf_spec import attention_kernels, kernel_trials, linear_kernels
from hf_spec.kernel_trials import (DISCOUNT, FAR_BEHIND, RECHECK_SECONDS, KernelEvidence, decision, expired,
                                   trial_samples)


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch):
    for module in (linear_kernels, attention_kernels):
        for name in ("_tables", "_trials", "_made", "_evidence"):
            monkeypatch.setattr(module, name, {})
    monkeypatch.setattr(attention_kernels, "_warmups", {})


def test_expired_takes_out_the_choices_older_than_the_recheck_age():
    made = {"old": 0.0, "new": RECHECK_SECONDS}
    assert expired(made, now=RECHECK_SECONDS + 1.0) == ["old"] and made == {"new": RECHECK_SECONDS}


def test_a_decision_waits_for_every_share_and_keeps_the_default_on_a_close_call():
    assert decision({"a": [9, 1, 1], "b": [9, 2, 2]}, ("a", "b"), 3, "b", 0.1) == "a"  # 2x faster: a
    assert decision({"a": [9, 1.0, 1.0], "b": [9, 1.05, 1.05]}, ("a", "b"), 3, "b", 0.1) == "b"  # close: the default
    assert decision({"a": [9, 1, 1], "b": [9, 2]}, ("a", "b"), 3, "b", 0.1) is None  # b lacks its share


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
