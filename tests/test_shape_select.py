"""Shape candidates (hf_spec.shape_select): the config checks, the round trip through a saved config and
`hf-spec tune --write`, and the offline measurement of their τ and verified nodes on a tiny target.
Which candidate a call uses is the online controller's business (tests/test_controller.py)."""

import pytest

import hf_spec
from hf_spec.shape_select import candidate_options, check_candidates
from hf_spec.tree.dynamic import TreeShape
from hf_spec.tune import measure_candidates, write_shape_candidates, write_tree_shape
from tests.conftest import oracle_pair, random_prompt

SMALL = dict(tree_depth=2, tree_top_k=2, tree_total_tokens=2, ngram_nodes=None, tau=1.8, verified_nodes=3.0)
WIDE = dict(tree_depth=5, tree_top_k=4, tree_total_tokens=24, ngram_nodes=None, tau=3.0, verified_nodes=25.0)


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


def test_candidate_options_are_the_generate_options_a_candidate_sets():
    assert candidate_options(SMALL) == dict(tree_depth=2, tree_top_k=2, tree_total_tokens=2)
    assert check_candidates(None) == [] and check_candidates((SMALL,)) == [SMALL]


def _drafter_with_candidates(**config):
    _, drafter = oracle_pair("llama")
    drafter = hf_spec.EagleDrafter(hf_spec.EagleDrafterConfig(**{**drafter.config.to_dict(), **config}))
    drafter.load_state_dict(oracle_pair("llama")[1].state_dict(), strict=False)
    return drafter.eval()


def test_candidates_round_trip_and_tune_write_turns_the_choice_off(tmp_path):
    drafter = _drafter_with_candidates(tree_shape_candidates=[SMALL, WIDE])
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
