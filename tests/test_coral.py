"""CORAL: the CSRA InfoNCE loss, the LM-head router (a real subset of the head, a normalised
draft distribution), losslessness with a routed drafter (greedy and sampled), the router
checkpoint round trip, and the two training stages."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import hf_spec
from conftest import oracle_pair, plain_generate, random_prompt
from hf_spec.drafters.eagle import router as router_module
from hf_spec.drafters.eagle.router import frequency_order, group_mass, group_slices
from hf_spec.training.losses import csra_loss_per_step
from test_sampling import P_VALUE_FLOOR, VOCAB, sampled_law_p_value, tiny_pair


# -- CSRA ---------------------------------------------------------------------------------------
def test_csra_loss_hand_computed():
    """One step, two positions: each output's only positive is its position's target feature."""
    outputs = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    targets = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    t = 0.5
    c = 1 / math.sqrt(2)
    # query (1,0): others (0,1) cos 0, (1,1) cos c [positive], (0,2) cos 0
    first = -math.log(math.exp(c / t) / (1 + math.exp(c / t) + 1))
    # query (0,1): others (1,0) cos 0, (1,1) cos c, (0,2) cos 1 [positive]
    second = -math.log(math.exp(1 / t) / (1 + math.exp(c / t) + math.exp(1 / t)))
    assert csra_loss_per_step([outputs], targets, temperature=t).item() == pytest.approx((first + second) / 2, rel=1e-6)


# -- the router ---------------------------------------------------------------------------------
def test_frequency_order_breaks_ties_by_id():
    counts = torch.tensor([3, 0, 5, 3, 0, 9])
    assert frequency_order(counts).tolist() == [5, 2, 0, 3, 1, 4]


def test_group_slices_cover_the_vocabulary_once():
    slices = group_slices(10, 4)
    assert [(s.start, s.stop) for s in slices] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    with pytest.raises(ValueError, match="router_num_groups"):
        group_slices(10, 11)


def routed_pair(family="qwen2", num_groups=8, top_n=2, seed=0):
    """The conftest oracle drafter with a fresh (untrained) router over a shuffled token order."""
    target, trained = oracle_pair(family)
    drafter = copy.deepcopy(trained).bind(target)
    g = torch.Generator().manual_seed(seed)
    drafter.add_router(frequency_order(torch.randint(0, 50, (target.config.vocab_size,), generator=g)), num_groups, top_n)
    return target, drafter


def test_routed_distribution_sums_to_one_over_the_top_groups_only():
    target, drafter = routed_pair(num_groups=8, top_n=2)
    hidden = torch.randn(6, target.config.hidden_size)
    logq = drafter.draft_log_probs(hidden, temperature=0.7, use_router=True)
    torch.testing.assert_close(logq.exp().sum(-1), torch.ones(6))
    router_probs = torch.softmax(drafter.router(hidden), dim=-1)
    top = router_probs.topk(2, dim=-1)
    order = drafter.router_token_order
    for row in range(6):
        allowed = torch.cat([order[group_slices(128, 8)[g]] for g in top.indices[row].tolist()])
        finite = torch.isfinite(logq[row]).nonzero().view(-1)
        assert sorted(finite.tolist()) == sorted(allowed.tolist())
        # p(x) = p_router(g) / (p_router(top-2)) * softmax_g(logits / T)(x)  (Eq. 8, renormalised)
        g = top.indices[row, 0].item()
        ids = order[group_slices(128, 8)[g]]
        in_group = torch.softmax(drafter.lm_logits(hidden[row : row + 1])[0, ids] / 0.7, dim=-1)
        expected = top.values[row, 0] / top.values[row].sum() * in_group
        torch.testing.assert_close(logq[row, ids].exp(), expected, rtol=1e-4, atol=1e-6)


def test_routing_multiplies_only_the_selected_groups_rows(monkeypatch):
    """Real savings: the head rows that enter a matmul are those of the groups some row selected."""
    target, drafter = routed_pair(num_groups=8, top_n=2)
    rows_multiplied = []
    real_linear = F.linear

    def counting_linear(x, weight, bias=None):
        rows_multiplied.append((weight.shape[0], weight.data_ptr()))
        return real_linear(x, weight, bias)

    hidden = torch.randn(1, target.config.hidden_size)
    drafter.draft_log_probs(hidden, use_router=True)  # builds the grouped head
    head_rows = {w.data_ptr() for w in drafter._grouped_head[1].weights}
    monkeypatch.setattr(router_module.F, "linear", counting_linear)
    drafter.draft_log_probs(hidden, use_router=True)
    monkeypatch.undo()
    assert rows_multiplied, "the head was not computed through F.linear"
    assert sum(r for r, ptr in rows_multiplied if ptr in head_rows) == 2 * 128 // 8  # top-2 of 8 groups
    assert all(r < 128 for r, _ in rows_multiplied)  # the full head (128 rows) is never multiplied


def test_greedy_with_a_routed_drafter_equals_plain_generate():
    """Losslessness does not depend on the router: an untrained router only costs acceptance."""
    for family in ("llama", "qwen2"):
        target, drafter = routed_pair(family)
        for seed in (1, 2):
            prompt = random_prompt(10, seed=seed)
            expected = plain_generate(target, prompt, max_new_tokens=30, do_sample=False)
            routed = target.generate(prompt, assistant_model=drafter, max_new_tokens=30, do_sample=False)
            assert torch.equal(routed, expected)
            unrouted = target.generate(prompt, assistant_model=drafter, max_new_tokens=30, do_sample=False,
                                       use_router=False)  # fmt: skip
            assert torch.equal(unrouted, expected)


def test_batched_greedy_with_a_routed_drafter_equals_plain_generate():
    target, drafter = routed_pair("llama")
    prompts = torch.cat([random_prompt(8, seed=3), random_prompt(8, seed=4)])
    expected = plain_generate(target, prompts, max_new_tokens=20, do_sample=False)
    assert torch.equal(target.generate(prompts, assistant_model=drafter, max_new_tokens=20, do_sample=False), expected)


def test_a_router_that_knows_the_answer_raises_acceptance_over_a_random_one():
    """Routing acts on drafting: a router pointing at the drafter's own best group keeps τ,
    a random router lowers it (the switch is live, and use_router=False restores it)."""
    target, drafter = routed_pair("qwen2", num_groups=8, top_n=1)
    prompt = random_prompt(10, seed=5)
    kwargs = dict(max_new_tokens=40, do_sample=False)
    target.generate(prompt, assistant_model=drafter, use_router=False, **kwargs)
    tau_full = drafter.last_generation_stats.tau
    target.generate(prompt, assistant_model=drafter, **kwargs)
    tau_random = drafter.last_generation_stats.tau
    assert tau_random < tau_full


@pytest.mark.parametrize("warp", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9)], ids=["T1", "T0.7-p0.9"])
def test_sampling_with_a_routed_drafter_keeps_the_target_distribution(warp):
    target, trained = tiny_pair("trained")
    drafter = copy.deepcopy(trained).bind(target)
    drafter.add_router(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0)), num_groups=4, top_n=2)
    prompt = random_prompt(length=6, vocab_size=VOCAB, seed=11)
    p_value, tau = sampled_law_p_value(target, prompt, drafter, warp, seed=4321, tree_depth=3, tree_top_k=3,
                                       tree_total_tokens=6)  # fmt: skip
    assert p_value > P_VALUE_FLOOR, tau


def test_router_checkpoint_round_trip(tmp_path):
    target, drafter = routed_pair()
    drafter.save_pretrained(tmp_path)
    loaded = hf_spec.EagleDrafter.from_pretrained(tmp_path).bind(target)
    assert loaded.config.router_num_groups == 8 and loaded.config.router_top_n == 2
    assert torch.equal(loaded.router_token_order, drafter.router_token_order)
    hidden = torch.randn(3, target.config.hidden_size)
    torch.testing.assert_close(loaded.draft_log_probs(hidden, use_router=True), drafter.draft_log_probs(hidden, use_router=True))


def test_use_router_without_a_router_is_a_clear_error():
    target, drafter = oracle_pair("llama")
    with pytest.raises(ValueError, match="no LM-head router"):
        target.generate(random_prompt(6), assistant_model=drafter, max_new_tokens=4, use_router=True)


def test_add_router_rejects_a_token_order_that_is_not_a_permutation():
    target, drafter = oracle_pair("llama")
    drafter = copy.deepcopy(drafter)
    with pytest.raises(ValueError, match="permutation"):
        drafter.add_router(torch.zeros(128, dtype=torch.long))


def test_group_mass_is_the_router_target():
    probs = torch.softmax(torch.randn(2, 10), dim=-1)
    order = torch.tensor([9, 8, 7, 6, 5, 4, 3, 2, 1, 0])
    mass = group_mass(probs, order, 4)  # groups of 3, 3, 3, 1 in that order
    torch.testing.assert_close(mass[:, 0], probs[:, [9, 8, 7]].sum(-1))
    torch.testing.assert_close(mass[:, 3], probs[:, 0])
    torch.testing.assert_close(mass.sum(-1), torch.ones(2))
