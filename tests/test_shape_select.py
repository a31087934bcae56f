"""Run-time shape choice (hf_spec.shape_select): the pure choice on injected costs, the config
checks, and real calls on a tiny target: lossless whatever is chosen, cached once per machine,
off for explicit options, for auto_tree_shape=False, and after `hf-spec tune --write`."""

import json

import pytest
import torch

import hf_spec
from hf_spec import tune
from hf_spec.shape_select import CostProfile, check_candidates, choose_candidate, predict_ms_per_token
from hf_spec.tree.dynamic import TreeShape
from hf_spec.tune import measure_candidates, select_shape, write_shape_candidates, write_tree_shape
from tests.conftest import oracle_pair, plain_generate, random_prompt

SMALL = dict(tree_depth=2, tree_top_k=2, tree_total_tokens=2, ngram_branches=None, tau=1.8, verified_nodes=3.0)
WIDE = dict(tree_depth=5, tree_top_k=4, tree_total_tokens=24, ngram_branches=None, tau=3.0, verified_nodes=25.0)


def test_the_choice_follows_the_machine_costs():
    flat = CostProfile(verify_ms={1: 20.0, 32: 23.0}, cycle_ms=[3.0, 9.0], key="gpu-like")
    steep = CostProfile(verify_ms={1: 20.0, 32: 140.0}, cycle_ms=[3.0, 9.0], key="fp32-cpu-like")
    assert choose_candidate([SMALL, WIDE], flat) == 1
    assert choose_candidate([SMALL, WIDE], steep) == 0
    # (t(verified nodes) + drafting/loop ms) / tau
    assert predict_ms_per_token(WIDE, flat.verify_ms, 9.0) == pytest.approx((20.0 + 24 / 31 * 3.0 + 9.0) / 3.0)
    with pytest.raises(ValueError, match="cost profile has 1"):
        choose_candidate([SMALL, WIDE], CostProfile({1: 1.0}, [1.0], "x"))


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"tree_depth": 2, "tau": 2.0}, "missing numbers"),
        ({**SMALL, "tree_width": 3}, "unknown keys"),
        ({**SMALL, "tau": 0.5}, ">= 1"),
        ("d2/k4", "must be a dict"),
    ],
)
def test_bad_candidates_are_refused_with_the_fix(bad, message):
    with pytest.raises(ValueError, match=message):
        check_candidates([bad])
    with pytest.raises(ValueError, match=message):
        hf_spec.EagleDrafterConfig(tree_shape_candidates=[bad])


def _drafter_with_candidates(tmp_path, monkeypatch, **config):
    monkeypatch.setenv("HF_SPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tune, "_profiles", {})
    target, drafter = oracle_pair("llama")
    drafter = hf_spec.EagleDrafter(hf_spec.EagleDrafterConfig(**{**drafter.config.to_dict(), **config}))
    drafter.load_state_dict(oracle_pair("llama")[1].state_dict(), strict=False)
    return target, drafter.eval()


def test_generate_uses_a_candidate_and_stays_lossless(tmp_path, monkeypatch):
    target, drafter = _drafter_with_candidates(tmp_path, monkeypatch, tree_shape_candidates=[SMALL, WIDE])
    prompt = random_prompt(8)
    expected = plain_generate(target, prompt, max_new_tokens=24, do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False)
    assert torch.equal(out, expected)
    chosen = drafter.last_generation_stats.shape_choice
    assert chosen is not None and chosen["tree_total_tokens"] in (2, 24) and chosen["predicted_ms_per_token"] > 0
    used = max(drafter.last_generation_stats.tree_sizes)
    assert used <= chosen["tree_total_tokens"] + 1  # the chosen tree was the one drafted
    files = list((tmp_path / "cache" / "shape_costs").glob("*.json"))
    assert len(files) == 1
    profile = json.loads(files[0].read_text())
    assert set(profile["verify_ms"]) == {str(n) for n in tune.VERIFY_SIZES} and len(profile["cycle_ms"]) == 2

    # measured once: a new process reads the disk cache, so the machine is not timed again
    monkeypatch.setattr(tune, "_profiles", {})
    monkeypatch.setattr(tune, "measure_costs", lambda *a, **k: pytest.fail("re-measured despite the cache"))
    target.generate(prompt, assistant_model=drafter, max_new_tokens=8, do_sample=False)
    assert drafter.last_generation_stats.shape_choice == chosen


@pytest.mark.parametrize("emulated", [True, False])
def test_when_no_tree_can_pay_the_call_drafts_nothing_and_stays_exact(tmp_path, monkeypatch, emulated):
    target, drafter = _drafter_with_candidates(tmp_path, monkeypatch, tree_shape_candidates=[SMALL, WIDE])
    # emulated bf16 on a CPU: every verified token costs a whole step; else nearly flat verification
    verify = {n: 20.0 * n if emulated else 20.0 + 0.1 * n for n in tune.VERIFY_SIZES}
    monkeypatch.setattr(tune, "measure_costs", lambda model, drafter, candidates, key="": CostProfile(verify, [3.0, 9.0], key))
    prompt = random_prompt(8)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False)
    assert torch.equal(out, plain_generate(target, prompt, max_new_tokens=24, do_sample=False))
    stats = drafter.last_generation_stats
    assert stats.shape_choice["plain_ms_per_token"] == pytest.approx(verify[1])
    # SMALL's prediction: (t(3 verified nodes) + 3 ms) / tau 1.8 = 35 ms > 20 ms emulated; 12.9 ms < 20.1 ms flat
    assert stats.shape_choice["drafted"] is not emulated
    assert (max(stats.tree_sizes) == 1) is emulated  # root-only trees: one target step per cycle
    if emulated:
        assert stats.tau == 1.0


def test_explicit_options_and_auto_off_keep_the_configured_shape(tmp_path, monkeypatch):
    target, drafter = _drafter_with_candidates(tmp_path, monkeypatch, tree_shape_candidates=[SMALL, WIDE])
    monkeypatch.setattr(tune, "measure_costs", lambda *a, **k: pytest.fail("no choice was asked for"))
    prompt = random_prompt(8)
    target.generate(prompt, assistant_model=drafter, max_new_tokens=8, do_sample=False, tree_total_tokens=3)
    assert drafter.last_generation_stats.shape_choice is None
    drafter.config.auto_tree_shape = False
    assert select_shape(target, drafter) is None
    target.generate(prompt, assistant_model=drafter, max_new_tokens=8, do_sample=False)
    assert drafter.last_generation_stats.shape_choice is None


def test_candidates_round_trip_and_tune_write_turns_the_choice_off(tmp_path, monkeypatch):
    _, drafter = _drafter_with_candidates(tmp_path, monkeypatch, tree_shape_candidates=[SMALL, WIDE])
    drafter.save_pretrained(tmp_path / "d")
    loaded = hf_spec.EagleDrafter.from_pretrained(tmp_path / "d")
    assert loaded.config.tree_shape_candidates == [SMALL, WIDE] and loaded.config.auto_tree_shape is None
    write_tree_shape(tmp_path / "d", TreeShape(3, 2, 4), {"machine": "test"})
    tuned = hf_spec.EagleDrafter.from_pretrained(tmp_path / "d")
    assert tuned.config.auto_tree_shape is False and tuned.config.tree_total_tokens == 4
    # measured candidates written back switch the run-time choice on again, with their provenance
    write_shape_candidates(tmp_path / "d", [WIDE], {"prompts": "held-aside"})
    again = hf_spec.EagleDrafter.from_pretrained(tmp_path / "d")
    assert again.config.tree_shape_candidates == [WIDE] and again.config.auto_tree_shape is None
    assert again.config.tree_shape_candidates_measured == {"prompts": "held-aside"}
    with pytest.raises(ValueError, match="missing numbers"):
        write_shape_candidates(tmp_path / "d", [{"tree_depth": 2}], {})


def test_measure_candidates_counts_tau_and_nodes_of_real_calls():
    target, drafter = oracle_pair("llama")
    prompts = [random_prompt(8, seed=s) for s in (1, 2)]
    rows = measure_candidates(target, drafter, prompts, [dict(tree_depth=1, tree_top_k=1, tree_total_tokens=1),
                                                         dict(tree_depth=4, tree_top_k=2, tree_total_tokens=6)], 16)
    chain, tree = rows
    assert chain["verified_nodes"] == pytest.approx(2.0)  # a one-token chain verifies root + 1 node every cycle
    assert 1.0 <= chain["tau"] <= 2.0 and tree["tau"] >= chain["tau"] and tree["verified_nodes"] <= 7.0
    with pytest.raises(ValueError, match="Unknown shape candidate keys"):
        measure_candidates(target, drafter, prompts, [dict(depth=2)], 4)


def test_floored_candidates_are_timed_at_full_depth(monkeypatch):
    """A tree_min_prob candidate's drafting is timed without the floor (its upper bound): on the random timing
    prompt the floor would stop at depth 1 and under-price the candidate."""
    target, drafter = oracle_pair("llama")
    floored = dict(SMALL, tree_depth=4, tree_total_tokens=8, tree_min_prob=0.2)
    calls = []
    generate = type(target).generate

    def spy(self, *args, **kwargs):
        calls.append({k: kwargs.get(k) for k in ("tree_depth", "tree_min_prob") if k in kwargs})
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(type(target), "generate", spy)
    monkeypatch.setattr(tune, "measure_verify_cost", lambda model, sizes, **k: {n: 1.0 for n in sizes})
    profile = tune.measure_costs(target, drafter, [floored], key="k")
    assert len(profile.cycle_ms) == 1
    assert calls and all(c.get("tree_depth") == 4 and "tree_min_prob" not in c for c in calls)


def test_a_profile_of_an_older_cache_format_is_measured_again(tmp_path, monkeypatch):
    """Format 1 profiles (3 timing rounds, dips kept) must not decide shapes any more: they are re-measured."""
    target, drafter = _drafter_with_candidates(tmp_path, monkeypatch, tree_shape_candidates=[SMALL, WIDE])
    old = CostProfile({n: 1.0 for n in tune.VERIFY_SIZES}, [1.0, 1.0], "")
    monkeypatch.setattr(tune, "measure_costs", lambda model, drafter, candidates, key="": CostProfile(
        old.verify_ms, old.cycle_ms, key))  # fmt: skip
    tune.cost_profile(target, drafter, [SMALL, WIDE])
    (path,) = (tmp_path / "cache" / "shape_costs").glob("*.json")
    stale = json.loads(path.read_text())
    path.write_text(json.dumps({**stale, "format": 1}))
    monkeypatch.setattr(tune, "_profiles", {})
    fresh = {n: 2.0 * n for n in tune.VERIFY_SIZES}
    monkeypatch.setattr(tune, "measure_costs", lambda model, drafter, candidates, key="": CostProfile(fresh, [3.0, 9.0], key))
    assert tune.cost_profile(target, drafter, [SMALL, WIDE]).verify_ms == fresh
    assert json.loads(path.read_text())["format"] == tune.CACHE_FORMAT == 3


def test_measured_verification_curves_never_fall(monkeypatch):
    """A timing dip (bigger tree measured cheaper) is lifted before the choice sees it."""
    target, drafter = oracle_pair("llama")
    dip = {1: 40.0, 2: 41.0, 4: 47.0, 8: 44.0, 16: 46.0, 32: 60.0, 64: 90.0}
    monkeypatch.setattr(tune, "measure_verify_cost", lambda model, sizes, **k: {n: dip[n] for n in sizes})
    profile = tune.measure_costs(target, drafter, [SMALL], key="k")
    assert profile.verify_ms == {1: 40.0, 2: 41.0, 4: 47.0, 8: 47.0, 16: 47.0, 32: 60.0, 64: 90.0}
