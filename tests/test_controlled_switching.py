"""Lossless whatever the speed controller does: arms switching in the middle of a generation (plain cycles,
drafted cycles of different tree shapes and n-gram budgets) keep greedy output identical to plain
``generate()`` and the sampled law exact, for every drafter family, one prompt and a left-padded batch; and
the default controller, on the packaged model, reports what it did."""

from __future__ import annotations

import pathlib
import random

import pytest
import torch

import hf_spec
from conftest import make_target, oracle_pair, plain_generate, random_prompt
from hf_spec.controller import SpeedController
from hf_spec.generation import call_arms, ladder_positions
from hf_spec.shape_select import CANDIDATE_OPTIONS
from test_batched import pad_left, per_row_expected, prompts_of
from test_eagle3 import trained_pair as eagle3_pair
from test_sampling import P_VALUE_FLOOR, VOCAB, sampled_law_p_value, tiny_pair
from test_s2d import sorted_pair

SHIPPED = pathlib.Path(__file__).resolve().parents[1] / "drafters"
CANDIDATES = [  # a ladder of three drafted shapes, two with n-gram branches
    {"tree_depth": 1, "tree_top_k": 2, "tree_total_tokens": 2, "tau": 1.5, "verified_nodes": 3.0},
    {"tree_depth": 3, "tree_top_k": 2, "tree_total_tokens": 5, "ngram_nodes": 3, "tau": 2.0, "verified_nodes": 8.0},
    {"tree_depth": 4, "tree_top_k": 3, "tree_total_tokens": 9, "ngram_nodes": 6, "tau": 2.5, "verified_nodes": 18.0},
    {"tree_depth": 5, "tree_top_k": 4, "tree_total_tokens": 12, "tau": 2.6, "verified_nodes": 20.0},  # greedy only
]


class ScriptedController(SpeedController):
    """Switches arm every one or two cycles (seeded), whatever it measures, visiting every arm in a new random
    order each round: every arm runs within a few cycles, in the middle of a generation."""

    def __init__(self, labels, seed: int = 0):
        super().__init__(list(labels), start=0)
        self._rng = random.Random(seed)
        self._left = 0
        self._order: list[int] = []
        self.used: list[int] = []

    def choose(self) -> int:
        if self._left == 0:
            if not self._order:
                self._order = self._rng.sample(range(len(self.labels)), len(self.labels))
            self.current, self._left = self._order.pop(), self._rng.randint(1, 2)
        self._left -= 1
        self.used.append(self.current)
        return self.current


def scripted(drafter, do_sample: bool = False, seed: int = 0) -> ScriptedController:
    arms, _ = call_arms(drafter, dict.fromkeys(CANDIDATE_OPTIONS), do_sample)
    return ScriptedController([arm.label for arm in arms], seed)


def with_candidates(target, trained):
    """A copy of the (cached, shared) trained EAGLE drafter whose config carries :data:`CANDIDATES`."""
    drafter = hf_spec.EagleDrafter.from_target(target, tree_shape_candidates=[dict(c) for c in CANDIDATES])
    drafter.load_state_dict(trained.state_dict())
    return target, drafter.eval()


def eagle_with_candidates(family="llama"):
    return with_candidates(*oracle_pair(family))


def parallel_pair():
    target = make_target()
    return target, hf_spec.ParallelDrafter.from_target(target, num_mask_tokens=2, tree_widths=[2, 1], tree_total_tokens=3)


FAMILIES = {
    "eagle": eagle_with_candidates,
    "eagle3": lambda: eagle3_pair(),
    "parallelspec": parallel_pair,
    "s2d": lambda: sorted_pair(),
    "ngram": lambda: (make_target(), hf_spec.NGramDrafter()),
}


def repetitive_prompt(length: int = 24, seed: int = 1) -> torch.Tensor:
    """A prompt that repeats itself, so n-gram trees have continuations to draft."""
    half = random_prompt(length // 2, seed=seed)
    return torch.cat([half, half], dim=1)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_greedy_with_arms_switching_mid_generation_equals_plain(name):
    target, drafter = FAMILIES[name]()
    prompt = repetitive_prompt()
    expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    for seed in range(2):
        controller = scripted(drafter, seed=seed)
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=40, do_sample=False,
                              speed_controller=controller)  # fmt: skip
        assert torch.equal(out, expected), (name, seed)
        stats = drafter.last_generation_stats
        assert stats.arm_per_cycle == controller.used[: stats.cycles]
        assert len(set(stats.arm_per_cycle)) == len(controller.labels)  # every arm ran in this one call
        drafted = [size for size, arm in zip(stats.tree_sizes, stats.arm_per_cycle) if arm != 0]
        assert all(size == 1 for size, arm in zip(stats.tree_sizes, stats.arm_per_cycle) if arm == 0)
        assert max(drafted) > 1  # the drafted arms really drafted


def test_the_cost_gate_resolves_each_cycle_by_its_own_commit_with_arms_switching(monkeypatch):
    """With arms switching, a drafted arm's session next reads what other arms' cycles committed too; its cost gate
    must resolve its last cycle by that cycle's own commit (it once took a plain stretch's tokens for the gain of
    one drafted cycle): each resolved commit is one cycle's, so together they never exceed the tokens generated."""
    from hf_spec.drafters.ngram import CycleGate

    target, drafter = eagle_with_candidates()
    drafter.config.ngram_cost_gate = True
    resolved = []
    original = CycleGate.record_committed

    def record(self, tokens, own=None):
        if self._pending is not None:
            resolved.append(len(tokens) if own is None else own)
        original(self, tokens, own)

    monkeypatch.setattr(CycleGate, "record_committed", record)
    prompt = repetitive_prompt()
    expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=40, do_sample=False,
                          speed_controller=scripted(drafter, seed=1))  # fmt: skip
    assert torch.equal(out, expected)
    stats = drafter.last_generation_stats
    assert len(resolved) > 5
    assert max(resolved) <= max(stats.accepted_lengths) + 1
    assert sum(resolved) <= stats.new_tokens


@pytest.mark.parametrize("name", ["eagle", "s2d", "ngram"])
def test_batched_greedy_with_arms_switching_equals_per_row_plain(name):
    target, drafter = FAMILIES[name]()
    prompts = prompts_of()
    ids, mask = pad_left(prompts)
    expected = per_row_expected(target, prompts, do_sample=False, max_new_tokens=30)
    controller = scripted(drafter, seed=3)
    out = target.generate(ids, attention_mask=mask, assistant_model=drafter, do_sample=False, max_new_tokens=30,
                          speed_controller=controller)  # fmt: skip
    assert torch.equal(out, expected)
    assert len(set(drafter.last_generation_stats.arm_per_cycle)) == len(controller.labels)


def sampling_pair(name):
    if name == "eagle":
        return with_candidates(*tiny_pair("trained"))
    target = make_target("llama", vocab_size=VOCAB, logit_scale=8.0, seed=3)
    if name == "parallelspec":
        return target, hf_spec.ParallelDrafter.from_target(target, num_mask_tokens=2, tree_widths=[2, 1],
                                                           tree_total_tokens=3)  # fmt: skip
    if name == "eagle3":
        return target, hf_spec.Eagle3Drafter.from_target(target, eagle_aux_hidden_state_layer_ids=[0, 1])
    return target, hf_spec.NGramDrafter()


@pytest.mark.parametrize("name", ["eagle", "eagle3", "parallelspec", "ngram"])
def test_sampled_law_is_exact_with_arms_switching(name):
    """Every generation switches arms at a random cycle (chi-square against the exact joint law)."""
    target, drafter = sampling_pair(name)
    prompt = random_prompt(length=6, vocab_size=VOCAB, seed=11)
    if name == "ngram":
        prompt = torch.cat([prompt, prompt], dim=1)
    controller = scripted(drafter, do_sample=True, seed=5)
    p_value, tau = sampled_law_p_value(target, prompt, drafter, dict(temperature=0.8), speed_controller=controller)
    assert p_value > P_VALUE_FLOOR, (p_value, tau)
    assert len(set(controller.used)) == len(controller.labels)
    if name == "eagle":
        assert tau > 1.3  # drafts are accepted, so the accept path runs under switching too


def test_fixed_shapes_and_switched_off_controllers_have_one_arm():
    target, drafter = eagle_with_candidates()
    prompt = random_prompt(10)
    arms, start = call_arms(drafter, dict.fromkeys(CANDIDATE_OPTIONS), False)
    assert [a.label for a in arms][0] == "plain" and len(arms) == 1 + len(CANDIDATES)
    assert arms[start].shape is not None
    assert len(call_arms(drafter, dict.fromkeys(CANDIDATE_OPTIONS), True)[0]) == len(CANDIDATES)  # pruned: greedy only
    for kwargs in (dict(tree_depth=2), dict(ngram_nodes=0), dict(speed_controller=False)):
        target.generate(prompt, assistant_model=drafter, max_new_tokens=8, do_sample=False, **kwargs)
        stats = drafter.last_generation_stats
        assert stats.controller is None and stats.arm_per_cycle == []
    with pytest.raises(ValueError, match="speed_controller has arms"):
        target.generate(prompt, assistant_model=drafter, max_new_tokens=8, do_sample=False,
                        speed_controller=SpeedController(["plain", "x"]))  # fmt: skip


def test_the_ladder_orders_one_dimension_at_a_time():
    """Candidates are ordered by tree size, then n-gram budget, whatever nodes they verified offline (which mixes the
    two dimensions: that order put a slow rung between two fast ones), and each arm has its (tree, n-gram) rank."""
    target, trained = oracle_pair("llama")
    candidates = [  # listed out of order, verified nodes misleading
        {"tree_depth": 2, "tree_top_k": 2, "tree_total_tokens": 3, "ngram_nodes": 8, "tau": 2.0, "verified_nodes": 5.0},
        {"tree_depth": 1, "tree_top_k": 2, "tree_total_tokens": 2, "ngram_nodes": 8, "tau": 1.5, "verified_nodes": 4.0},
        {"tree_depth": 2, "tree_top_k": 2, "tree_total_tokens": 3, "ngram_nodes": 3, "tau": 2.0, "verified_nodes": 5.5},
        {"tree_depth": 1, "tree_top_k": 2, "tree_total_tokens": 2, "ngram_nodes": 3, "tau": 1.5, "verified_nodes": 4.5},
    ]
    drafter = hf_spec.EagleDrafter.from_target(target, tree_shape_candidates=candidates, tree_depth=2, tree_top_k=2,
                                               tree_total_tokens=3, ngram_nodes=3)  # fmt: skip
    arms, start = call_arms(drafter, dict.fromkeys(CANDIDATE_OPTIONS), False)
    shapes = [(a.shape.total_tokens, a.ngram_nodes) for a in arms[1:]]
    assert shapes == [(2, 3), (2, 8), (3, 3), (3, 8)]
    assert ladder_positions(drafter, arms) == [None, (0, 0), (0, 1), (1, 0), (1, 1)]
    assert (arms[start].shape.total_tokens, arms[start].ngram_nodes) == (3, 3)  # the configured shape


@pytest.mark.integration
def test_the_default_controller_reports_its_arms_on_the_packaged_model(smollm2):
    target, tokenizer = smollm2
    drafter = hf_spec.EagleDrafter.from_pretrained(SHIPPED / "smollm2-135m-instruct-hass")
    ids = tokenizer("def fibonacci(n):\n    ", return_tensors="pt").input_ids
    expected = plain_generate(target, ids, max_new_tokens=48, do_sample=False)
    out = target.generate(ids, assistant_model=drafter, max_new_tokens=48, do_sample=False, speed_controller=True)
    assert torch.equal(out, expected)
    report = drafter.last_generation_stats.controller
    assert report["arms"][0] == "plain" and len(report["arms"]) == 1 + len(drafter.config.tree_shape_candidates)
    assert report["ms_per_token"][report["current"]] > 0
    stats = drafter.last_generation_stats
    assert len(stats.arm_per_cycle) == len(stats.cycle_seconds) == stats.cycles
    assert all(s > 0 for s in stats.cycle_seconds) and sum(stats.cycle_seconds) < stats.total_seconds
