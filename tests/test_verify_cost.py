"""The target's verification costs as decoding pays them (hf_spec.verify_cost.VerifyCosts): a measured prior
corrected by the loop's own timed verifications, which the n-gram tree sizing reads at each call."""

import itertools

import pytest
import torch

import hf_spec
from conftest import make_target, random_prompt
from hf_spec import linear_kernels, verify_cost
from hf_spec.verify_cost import VerifyCosts

PRIOR = {1: 10.0, 2: 10.0, 4: 12.0, 8: 16.0, 16: 24.0}


def observe(costs, n, ms, times=5):
    for _ in range(times):
        costs.observe(n, ms)


def test_measured_sizes_replace_the_prior_and_scale_the_sizes_between_and_beyond():
    costs = VerifyCosts(PRIOR)
    assert costs.curve() == PRIOR
    observe(costs, 1, 20.0)  # decoding pays twice the prior for a plain step...
    observe(costs, 4, 36.0)  # ...and three times for four tokens
    curve = costs.curve()
    assert curve[1] == pytest.approx(20.0) and curve[4] == pytest.approx(36.0)
    assert curve[2] == pytest.approx(10.0 * 2.5)  # the ratio halfway (in log size) between 1 and 4
    assert curve[8] == pytest.approx(48.0) and curve[16] == pytest.approx(72.0)  # the last ratio, beyond
    observe(costs, 6, 30.0)  # a size the prior lacks joins the curve; a dip is noise: made non-decreasing
    assert costs.curve()[6] == pytest.approx(36.0)


def test_one_measurement_is_not_a_curve_and_old_ones_fade():
    costs = VerifyCosts(PRIOR)
    costs.observe(2, 100.0)
    costs.observe(2, 100.0)
    assert costs.curve() == PRIOR  # two measurements are not trusted yet
    observe(costs, 1, 20.0)
    assert costs.curve()[1] == pytest.approx(20.0)
    observe(costs, 8, 16.0, times=int(4 * VerifyCosts.HALF_LIFE))  # long after: size 1 has faded, 8 rules
    assert 1 not in costs.measured() and costs.curve()[1] == pytest.approx(10.0)


def test_one_stall_does_not_price_a_size():
    costs = VerifyCosts(PRIOR)
    observe(costs, 1, 10.0, times=3)
    costs.observe(1, 10_000.0)  # another process, a page fault: counted as at most 3x the mean
    assert costs.curve()[1] == pytest.approx((30.0 + 30.0) / 4, rel=0.01)
    with pytest.raises(ValueError, match="prior"):
        VerifyCosts({})


def test_the_loop_reports_each_verification_and_the_next_call_sizes_trees_by_it(monkeypatch):
    """generate() with a drafter that sizes its trees by the costs reports every one-row verification (tree size,
    wall ms); plain generate() asks for nothing and times nothing."""
    monkeypatch.setattr(verify_cost, "verify_cost_curve", lambda model: dict(PRIOR))
    monkeypatch.setattr(linear_kernels, "weights_packed", lambda: 0)  # no forward packs a weight
    target = make_target("llama")
    prompt = random_prompt(length=12, vocab_size=128, seed=3).repeat(1, 3)
    target.generate(prompt, max_new_tokens=8, do_sample=False)
    assert verify_cost.live_verify_costs(target) is None
    drafter = hf_spec.NGramDrafter()
    target.generate(prompt, max_new_tokens=96, do_sample=False, assistant_model=drafter)
    costs = verify_cost.live_verify_costs(target)
    assert costs is not None and costs.observations == drafter.last_generation_stats.verify_forwards
    assert costs.measured() and all(ms > 0 for ms in costs.measured().values())
    assert drafter.last_generation_stats.verify_ms == pytest.approx(costs.curve(), rel=1e-3)  # what the next call reads
    seen = []
    monkeypatch.setattr(type(costs), "curve", lambda self: seen.append(self.observations) or dict(PRIOR))
    target.generate(prompt, max_new_tokens=8, do_sample=False, assistant_model=drafter)
    assert seen and seen[0] == costs.observations - drafter.last_generation_stats.verify_forwards  # read at the start
    monkeypatch.setattr(verify_cost, "verify_cost_curve", lambda model: {1: 5.0, 64: 6.0})
    assert verify_cost.verify_costs(target) is not costs  # a new prior (another machine's cache) starts afresh


def test_forwards_that_packed_a_weight_are_neither_a_verification_cost_nor_a_controller_measurement(monkeypatch):
    """A forward during which a CPU kernel trial packed a weight (first-time work: hundreds of ms for an LM head in
    float32) is not what decoding pays per step: the verification costs do not observe it and the speed controller
    does not measure its cycle."""
    monkeypatch.setattr(verify_cost, "verify_cost_curve", lambda model: dict(PRIOR))
    packings = itertools.count()
    monkeypatch.setattr(linear_kernels, "weights_packed", lambda: next(packings))  # grows in every forward
    target = make_target("llama")
    prompt = random_prompt(length=12, vocab_size=128, seed=3).repeat(1, 3)
    drafter = hf_spec.NGramDrafter()
    target.generate(prompt, max_new_tokens=48, do_sample=False, assistant_model=drafter, speed_controller=True)
    stats = drafter.last_generation_stats
    assert stats.verify_forwards > 1 and verify_cost.live_verify_costs(target).observations == 0
    assert stats.controller is not None and set(stats.controller["ms_per_token"].values()) == {None}


@pytest.mark.usefixtures("fresh_kernel_choices")
def test_the_prior_times_every_small_size_in_every_round_and_the_large_ones_in_fewer(monkeypatch):
    """measure_verify_cost on a real (tiny) target: the few-row sizes get their warm-up rounds, round 0 and every
    timed round; a size above MAX_ROWS gets round 0 and ``large_repeats`` timed rounds; round 0 leaves the LM head's
    kernel chosen for each few-row size (its trial calls stop there)."""
    target = make_target("llama")
    head = target.get_output_embeddings()
    rows, head_calls, timed = [], [], verify_cost.timed

    def recording(fn, device):
        (hidden, logits), ms = timed(fn, device)
        rows.append(hidden.shape[0])
        return (hidden, logits), ms

    monkeypatch.setattr(verify_cost, "timed", recording)
    head.register_forward_hook(lambda module, args, out: head_calls.append(args[0].shape[0]))
    large = linear_kernels.MAX_ROWS + 4
    curve = verify_cost.measure_verify_cost(target, (1, 3, large), prefix_length=16, repeats=5, large_repeats=2)
    small_forwards = linear_kernels.WARMUP_CALLS + 1 + 5
    assert rows.count(1) == rows.count(3) == small_forwards and rows.count(large) == 1 + 2
    assert set(curve) == {1, 3, large} and all(ms > 0 for ms in curve.values())
    assert all(linear_kernels.chosen_kernel(head, n) in linear_kernels.KERNELS for n in (1, 3))
    assert small_forwards < head_calls.count(1) <= small_forwards + linear_kernels.TRIAL_CALLS
