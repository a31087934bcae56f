"""The GPU engine benchmark (benchmarks/gpu/engine_bench.py) runs its whole code path on the CPU in ``--tiny`` mode
(tiny configs of the same three families, float32), so the script that waits for a GPU never rots."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "engine_bench.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("engine_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """(module, results, output folder) of one ``--tiny`` run (~10 s on one thread)."""
    bench = load_bench()
    out = tmp_path_factory.mktemp("engine_bench")
    results = bench.main(["--tiny", "--out", str(out)])
    return bench, results, out


def hf_spec_rows(bench, methods):
    return {m: r for m, r in methods.items() if m.startswith("hf_spec_")}


def test_every_target_has_every_method(tiny_run):
    bench, results, _ = tiny_run
    expected = bench.expected_methods(list(bench.SHAPES), list(bench.TAUS), ["eager", "static"])
    assert results["meta"]["methods"] == expected
    assert set(results["targets"]) == set(bench.TINY_TARGETS) == set(bench.REAL_TARGETS)
    for name, target in results["targets"].items():
        assert target["status"] == "done", (name, target.get("error"))
        assert list(target["methods"]) and set(target["methods"]) == set(expected), name
        for method, row in target["methods"].items():
            assert "skipped" not in row, (name, method, row)
            assert row["tokens_per_s"] > 0 and row["new_tokens"] == results["meta"]["new_tokens"]
        for row in hf_spec_rows(bench, target["methods"]).values():
            for key in ("cycle_ms", "draft_ms_per_cycle", "verify_ms_per_cycle", "host_ms_per_cycle", "host_share"):
                assert row[key] is not None, (key, row)
            assert row["draft_ms_per_cycle"] > 0 and row["verify_ms_per_cycle"] > 0
            assert row["cycle_ms"] >= row["draft_ms_per_cycle"] + row["verify_ms_per_cycle"] - 1e-6
            assert row["speedup_vs_plain_eager"] > 0 and row["speedup_vs_plain_compiled_static"] > 0
            assert row["peak_memory_gib"] is None  # CPU
        syncs = target["host_syncs"]
        assert syncs["cycles"] > 0 and syncs["host_reads_per_cycle"] > 0
        assert syncs["cuda_synchronizing_ops"] is None and syncs["explicit_synchronize"] is None  # CPU
        assert target["oracle_rewrite_ms"] > 0


def test_hf_spec_output_equals_plain_greedy(tiny_run):
    bench, results, _ = tiny_run
    for target in results["targets"].values():
        methods = target["methods"]
        assert methods["plain_compiled_static"]["matches_plain"] is True
        assert methods["plain_compiled_static"]["compiled"] is False  # transformers compiles nothing on a CPU
        for method, row in hf_spec_rows(bench, methods).items():
            assert row["matches_plain"] is True, method


def test_measured_tau_rises_with_the_oracle_p(tiny_run):
    bench, results, _ = tiny_run
    low, high = min(bench.TAUS), max(bench.TAUS)
    for name, target in results["targets"].items():
        for shape in bench.SHAPES:
            rows = {tau: target["methods"][bench.spec_method_name(shape, tau, "eager")] for tau in bench.TAUS}
            assert rows[low]["p"] < rows[high]["p"]
            assert rows[high]["tau"] > rows[low]["tau"] + 0.5, (name, shape, rows[low]["tau"], rows[high]["tau"])
            for tau, row in rows.items():
                assert 1.0 <= row["tau"] <= bench.SHAPES[shape]["tree_depth"] + 1
                assert abs(row["tau"] - tau) < 1.0, (name, shape, tau, row["tau"])  # the oracle hits its target
                # a chain always reaches its depth; a dynamic tree's deepest path mostly does (its re-ranking may
                # keep shallower nodes instead, as a trained drafter's would), which lowers τ a little
                depth = bench.SHAPES[shape]["tree_depth"]
                if bench.SHAPES[shape]["tree_top_k"] == 1:
                    assert row["spine_depth_mean"] == depth
                else:
                    assert depth - 2 <= row["spine_depth_mean"] <= depth
                assert row["tree_nodes_mean"] == bench.SHAPES[shape]["tree_total_tokens"] + 1


def test_cost_curve_has_every_k(tiny_run):
    bench, results, _ = tiny_run
    assert results["meta"]["cost_grid"] == list(bench.COST_GRID)
    for target in results["targets"].values():
        curve = target["verify_cost_ms"]
        assert [int(k) for k in curve] == list(bench.COST_GRID)
        assert all(ms > 0 for ms in curve.values())


def test_outputs_are_written(tiny_run):
    bench, results, out = tiny_run
    on_disk = json.loads((out / "results.json").read_text())
    assert on_disk["targets"].keys() == results["targets"].keys()
    readme = (out / "README.md").read_text()
    assert all(f"## {name}" in readme for name in results["targets"])
    assert "hf_spec_tree60_tau3" in readme and "Verification cost t(k)" in readme
    png = out / "engine_bench.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    # --replot re-renders README and PNG from the JSON alone (a run cut by a time limit)
    again = out / "replot"
    bench.main(["--replot", str(out / "results.json"), "--out", str(again)])
    assert (again / "README.md").read_text() == readme and (again / "engine_bench.png").exists()


def test_oracle_tree_marks_the_spine_and_nothing_else():
    bench = load_bench()
    from hf_spec.tree.tree import DraftTree

    # root 0; depth 1: nodes 1, 2; depth 2: 3 (under 1), 4 and 5 (under 2); depth 3: 6 (under 5). Spine: 0-2-5-6.
    parents = torch.tensor([-1, 0, 0, 1, 2, 2, 5])
    depths = torch.tensor([0, 1, 1, 2, 2, 2, 3])
    tokens = torch.tensor([7, 11, 12, 13, 14, 15, 16])
    tree = DraftTree(tokens=tokens, parents=parents, depths=depths, scores=torch.zeros(7),
                     expanded=torch.tensor([0, 1, 2, 5]),
                     candidate_tokens=torch.tensor([[11, 12], [13, 99], [14, 15], [16, 98]]),
                     candidate_nodes=torch.tensor([[1, 2], [3, -1], [4, 5], [6, -1]]))  # fmt: skip
    reference = torch.tensor([5, 6, 7, 40, 41, 42, 43])  # root (7) at position 2: the truth below it is 40, 41, 42
    vocab = 50
    for successes, accepted in (([1, 1, 1], 3), ([1, 1, 0], 2), ([1, 0, 1], 1), ([0, 1, 1], 0)):
        new, spine = bench.oracle_tree(tree, reference, 2, torch.tensor(successes, dtype=torch.bool), vocab)
        assert int(spine) == 3 and int(new.tokens[0]) == 7
        truth = {1: 40, 2: 41, 3: 42}
        for node in range(1, 7):
            depth = int(depths[node])
            on_path = node in (2, 5, 6) and depth <= accepted
            assert (int(new.tokens[node]) == truth[depth]) == on_path, (successes, node)
        # candidates follow their nodes; pruned ones can never match
        kept = new.candidate_nodes >= 0
        assert torch.equal(new.candidate_tokens[kept], new.tokens[new.candidate_nodes[kept]])
        assert bool((new.candidate_tokens[new.candidate_nodes < 0] == -1).all())
        # siblings stay distinct, so the greedy walk's choice is unambiguous
        for parent in range(7):
            children = new.tokens[parents == parent]
            assert children.unique().numel() == children.numel()


def test_p_for_tau_inverts_the_chain_expectation():
    bench = load_bench()
    for depth in (1, 6):
        for tau in (1.0, 1.5, 2.0, depth + 0.9):
            if tau > depth + 1:
                continue
            p = bench.p_for_tau(tau, depth)
            assert abs(1 + sum(p**i for i in range(1, depth + 1)) - tau) < 1e-9
    with pytest.raises(ValueError, match="out of reach"):
        bench.p_for_tau(8.0, 6)
