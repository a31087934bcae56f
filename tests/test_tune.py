"""hf-spec tune (offline): cost curves and shape prediction (pure, injected numbers), the exact acceptance
replay against real generations (tiny random models), --write round trip, CLI."""

import json

import pytest
import torch

import hf_spec
from hf_spec.cli import build_parser
from hf_spec.shape_select import interpolate_cost, non_decreasing
from hf_spec.tree.dynamic import TreeShape
from hf_spec.tune import (
    TuneGrid,
    candidate_shapes,
    draft_cost_ms,
    measure_acceptance,
    measure_generation,
    path_ranks,
    predict,
    replay_cycles,
    tune,
    write_shape_candidates,
    write_tree_shape,
)
from tests.conftest import make_target, random_prompt


def test_candidate_shapes_prune_the_grid():
    shapes = candidate_shapes([2, 3], [1, 2], [1, 2, 4, 8, 100])
    keys = {(s.depth, s.top_k, s.total_tokens) for s in shapes}
    # chains keep exactly depth nodes; trees keep depth <= total <= min(64, nodes grown)
    assert keys == {(2, 1, 2), (3, 1, 3), (2, 2, 2), (2, 2, 4), (3, 2, 4), (3, 2, 8)}
    assert all(s.total_tokens <= 64 for s in candidate_shapes([7], [8], [32, 64, 100]))


def test_interpolate_cost_is_piecewise_linear_and_extends():
    curve = {1: 10.0, 4: 10.0, 8: 20.0, 16: 40.0}
    assert interpolate_cost(curve, 1) == 10.0
    assert interpolate_cost(curve, 6) == pytest.approx(15.0)
    assert interpolate_cost(curve, 12) == pytest.approx(30.0)
    assert interpolate_cost(curve, 20) == pytest.approx(50.0)  # slope of the last segment
    assert interpolate_cost({1: 5.0, 2: 4.0}, 10) == 4.0  # a noisy falling tail never extrapolates below
    assert draft_cost_ms(1, 2.0, 14.0, 7) == 2.0 and draft_cost_ms(4, 2.0, 14.0, 7) == pytest.approx(8.0)


def test_prediction_picks_the_shape_the_costs_favour():
    taus = {(4, 2, 8): 2.6, (6, 4, 32): 3.2, (2, 1, 2): 1.9}
    flat = {1: 20.0, 64: 22.0}  # bf16-CPU-like: a wide tree costs little more to verify
    steep = {1: 20.0, 64: 200.0}  # fp32-like: every token costs

    def best(curve):
        rows = {k: predict(TreeShape(*k), tau, curve, draft_cost_ms(k[0], 1.0, 6.0, 6), 2.0) for k, tau in taus.items()}
        return max(rows, key=lambda k: rows[k]["tokens_per_s"]), rows

    winner, rows = best(flat)
    assert winner == (6, 4, 32)
    # verify t(T + 1) = t(33) on the curve (the LM head over all rows included), draft linear in depth, overhead
    assert rows[(6, 4, 32)]["ms_per_cycle"] == pytest.approx(20.0 + 32 / 63 * 2.0 + 6.0 + 2.0)
    assert best(steep)[0] == (2, 1, 2)


def test_path_ranks_and_replay():
    # root 0 -> 1 (a, -0.1), 2 (b, -0.5); 1 -> 3 (c, -0.3), 4 (d, -0.2); 2 -> 5 (e, -0.6)
    tokens = [9, 1, 2, 3, 4, 5]
    parents = [-1, 0, 0, 1, 1, 2]
    depths = [0, 1, 1, 2, 2, 2]
    scores = [0.0, -0.1, -0.5, -0.3, -0.2, -0.6]
    ranks = path_ranks(tokens, parents, depths, scores, truth=[1, 3, 7], max_depth=2)
    # depth<=1 order: 1, 2; depth<=2 order: 1, 4, 3, 2, 5
    assert ranks == [[0], [0, 2]]
    accepted = {T: sum(r < T for r in ranks[1]) for T in (1, 2, 3)}
    assert accepted == {1: 1, 2: 1, 3: 2}
    assert path_ranks(tokens, parents, depths, scores, truth=[2, 5], max_depth=2) == [[1], [3, 4]]
    assert path_ranks(tokens, parents, depths, scores, truth=[7], max_depth=2) == [[], []]
    assert replay_cycles(lambda root: {10: 2, 13: 0, 14: 5}[root], 10, 15) == [2, 0, 5]


@pytest.fixture(scope="module")
def tiny_pair():
    # A 16-token vocabulary: an untrained drafter's guesses are often right, so acceptance varies.
    target = make_target("llama", vocab_size=16)
    torch.manual_seed(3)
    drafter = hf_spec.EagleDrafter.from_target(target)
    return target, drafter


def test_replayed_acceptance_equals_real_generation(tiny_pair):
    """The offline replay must give, shape by shape, the accepted lengths generate() records (fp32)."""
    target, drafter = tiny_pair
    prompts = [random_prompt(8, 16, seed=s) for s in (1, 2)]
    shapes = [TreeShape(2, 1, 2), TreeShape(3, 2, 4), TreeShape(4, 4, 12), TreeShape(2, 4, 3)]
    data = measure_acceptance(target, drafter, prompts, 24, [s.depth for s in shapes], sorted({s.top_k for s in shapes}))
    total_accepted = 0
    for shape in shapes:
        real = measure_generation(target, drafter, prompts, shape, 24)
        assert data.accepted_lengths(shape) == real["accepted_lengths"], shape
        total_accepted += sum(real["accepted_lengths"])
    assert total_accepted > 0  # the comparison saw accepted drafts


def test_tune_end_to_end_and_write_round_trip(tiny_pair, tmp_path):
    target, drafter = tiny_pair
    prompts = [random_prompt(8, 16, seed=4)]
    grid = TuneGrid(depths=(2, 3), top_ks=(1, 2), totals=(2, 4), verify_sizes=(1, 4, 8), verify_repeats=1, confirm=2,
                    confirm_repeats=1)  # fmt: skip
    report = tune(target, drafter, prompts, 12, grid, progress=None)
    measured = [r for r in report["rows"] if "measured" in r]
    assert report["best"]["key"] == max(measured, key=lambda r: r["measured"]["tokens_per_s"])["key"]
    assert {r["key"] for r in measured} >= {"d6/k8/t60"}  # the configured shape is the reference
    json.dumps(report)  # the report is JSON-serialisable

    drafter.save_pretrained(tmp_path / "d")
    best = TreeShape(**report["best"]["shape"])
    write_tree_shape(tmp_path / "d", TreeShape(3, 2, 5), {"device": "cpu", "dtype": "float32", "threads": 1})
    loaded = hf_spec.EagleDrafter.from_pretrained(tmp_path / "d")
    assert loaded.tree_shape() == TreeShape(3, 2, 5) != TreeShape(6, 8, 60)
    assert loaded.config.tree_tuned_for["dtype"] == "float32"
    assert isinstance(best.depth, int)


CARD_BENCH = {"machine": "2-core CPU", "date": "2026-11-20", "command": "hf-spec bench --drafter ./d",
              "baseline": "plain greedy generate()", "results": [{"dataset": "mt_bench", "tau": 3.25, "speedup": 1.91}]}


def test_config_writes_re_render_the_hf_spec_card_from_its_stored_inputs(tmp_path):
    """The card lists the config's shape candidates and default tree: both config writers re-render it from the
    inputs save_pretrained stored beside it, so it keeps its benchmark results and training facts."""
    drafter = hf_spec.EagleDrafter.from_target(make_target("llama", vocab_size=16))
    folder = tmp_path / "d"
    drafter.save_pretrained(folder, bench_results=CARD_BENCH, training_info={"datasets": ["sharegpt"], "epochs": 7})
    assert json.loads((folder / "training_info.json").read_text()) == {"datasets": ["sharegpt"], "epochs": 7}
    assert json.loads((folder / "card_results.json").read_text())["results"][0]["tau"] == 3.25
    assert "| 5 | 3 | 9 | 2 |" not in (folder / "README.md").read_text()

    rows = [dict(tree_depth=5, tree_top_k=3, tree_total_tokens=9, tree_min_prob=None, ngram_nodes=2, tau=2.875,
                 verified_nodes=10.0)]  # fmt: skip
    write_shape_candidates(folder, rows, {"by": "test"})
    card = (folder / "README.md").read_text()
    assert "| 5 | 3 | 9 | 2 | 2.88 | 10.0 |" in card  # the new candidate
    # a tuned fixed shape switches the run-time choice off: the card shows the new default tree, no candidates
    write_tree_shape(folder, TreeShape(3, 2, 5), {"device": "cpu"})
    tuned = (folder / "README.md").read_text()
    assert "| default tree | depth 3, top-k 2, 5 tokens |" in tuned and "| 5 | 3 | 9 | 2 |" not in tuned
    for text in (card, tuned):
        assert "hf-spec bench --drafter ./d" in text and "acceptance_length" in text  # the results stay
        assert "sharegpt" in text and "epochs" in text  # the training facts stay


def test_config_writes_never_touch_a_readme_hf_spec_did_not_write(tmp_path):
    drafter = hf_spec.EagleDrafter.from_target(make_target("llama", vocab_size=16))
    folder = tmp_path / "d"
    drafter.save_pretrained(folder)
    own = "---\nlicense: mit\n---\n# My drafter\n\nlibrary_name: hf-spec (in the body, not the front matter)\n"
    (folder / "README.md").write_bytes(own.encode())
    rows = [dict(tree_depth=2, tree_top_k=2, tree_total_tokens=3, ngram_nodes=None, tau=1.5, verified_nodes=3.0)]
    write_shape_candidates(folder, rows, {"by": "test"})
    write_tree_shape(folder, TreeShape(3, 2, 5), {"device": "cpu"})
    assert (folder / "README.md").read_bytes() == own.encode()
    assert json.loads((folder / "config.json").read_text())["tree_depth"] == 3


def test_tune_refuses_fixed_tree_drafters():
    target = make_target("llama", vocab_size=16)
    drafter = hf_spec.ParallelDrafter.from_target(target)
    with pytest.raises(ValueError, match="dynamic draft trees"):
        measure_acceptance(target, drafter, [random_prompt(6, 16)], 4, [2], [2])


def test_cli_help(capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["tune", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for option in ("--drafter", "--skip-prompts", "--write", "--quick", "--device"):
        assert option in out


def test_non_decreasing_lifts_noisy_dips_of_a_cost_curve():
    """A timing dip (t(8) below t(4)) must not make the larger tree look cheaper; rising points stay as measured."""
    assert non_decreasing({1: 46.8, 2: 49.2, 4: 56.5, 8: 52.2, 16: 54.9, 32: 72.1}) == {
        1: 46.8, 2: 49.2, 4: 56.5, 8: 56.5, 16: 56.5, 32: 72.1}  # fmt: skip
    assert non_decreasing({4: 3.0, 1: 1.0, 2: 2.0}) == {1: 1.0, 2: 2.0, 4: 3.0}
