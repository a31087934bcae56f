"""Hybrid draft trees: context n-gram branches grafted into a trained drafter's tree (ngram_nodes)."""

import pytest
import torch

import hf_spec
from conftest import make_target, oracle_pair, plain_generate, random_prompt
from hf_spec.controller import SpeedController
from hf_spec.drafters import hybrid
from hf_spec.drafters.eagle import EagleDraftingSession
from hf_spec.drafters.hybrid import NGramHybridSession
from hf_spec.drafters.ngram import TrieNodes, graft_trie
from hf_spec.tree.dynamic import TreeShape, draw_candidates
from hf_spec.tree.tree import DraftTree
from hf_spec.verify import _rejection_sample, greedy_plan
from test_batched import pad_left, per_row_expected
from test_ngram import repetitive_sampling_case, target_text_prompt
from test_sampling import (P_VALUE_FLOOR, VOCAB, chi_square_pvalue, exact_joint, rejects_colder_law, sample_batches,
                           warpers)  # fmt: skip
from test_s2d import sorted_pair

SHAPE = dict(tree_depth=4, tree_top_k=4, tree_total_tokens=12)


def capture_trees(monkeypatch):
    """(drafter tree, grafted tree) of every drafted cycle: grafted by the branches' own budget, or under the cost
    gate with the gate's trie."""
    trees = []
    original = hybrid.NGramBranches.graft

    def graft(self, tree, *args, **kwargs):
        grafted = original(self, tree, *args, **kwargs)
        trees.append((tree, grafted))
        return grafted

    def graft_gate_trie(tree, trie):
        grafted = graft_trie(tree, trie)
        trees.append((tree, grafted))
        return grafted

    monkeypatch.setattr(hybrid.NGramBranches, "graft", graft)
    monkeypatch.setattr(hybrid, "graft_trie", graft_gate_trie)
    return trees


def check_tree(tree: DraftTree, base: DraftTree, budget: int):
    """BFS order, no duplicate sibling tokens, the node budget, the base tree kept whole."""
    parents, depths, tokens = tree.parents.tolist(), tree.depths.tolist(), tree.tokens.tolist()
    assert len(tree) - 1 <= budget
    assert depths == sorted(depths) and all(parents[i] < i and depths[i] == depths[parents[i]] + 1 for i in range(1, len(tree)))
    siblings = {}
    for i in range(1, len(tree)):
        assert tokens[i] not in siblings.setdefault(parents[i], set()), "duplicate sibling token"
        siblings[parents[i]].add(tokens[i])
    paths = {tuple(tree.path_tokens(i).tolist()) for i in range(len(tree))}
    assert all(tuple(base.path_tokens(i).tolist()) in paths for i in range(len(base)))
    new = int(tree.from_ngram.sum()) if tree.from_ngram is not None else 0  # None: nothing grafted
    assert new == len(tree) - len(base)


# -- greedy ------------------------------------------------------------------------------------
def test_greedy_matches_plain_and_ngram_nodes_are_accepted(family, monkeypatch):
    target = make_target(family)
    drafter = hf_spec.EagleDrafter.from_target(target)  # untrained: the n-gram nodes do the work
    prompt = target_text_prompt(target)
    expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    trees = capture_trees(monkeypatch)
    out = target.generate(prompt, assistant_model=drafter, ngram_nodes=8, max_new_tokens=40, do_sample=False,
                          **SHAPE)  # fmt: skip
    assert torch.equal(out, expected)
    stats = drafter.last_generation_stats
    assert stats.accepted_from_ngram > 0 and stats.tau > 2
    assert stats.accepted_from_ngram + stats.accepted_from_drafter == sum(stats.accepted_lengths)
    assert trees and any(len(g) > len(t) for t, g in trees)
    for base, grafted in trees:
        check_tree(grafted, base, SHAPE["tree_total_tokens"] + 8)
    assert stats.tree_sizes == [len(grafted) for _, grafted in trees]  # what each verification forward paid for
    # Off (the config default): the same output, and no n-gram node.
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=40, do_sample=False, **SHAPE)
    assert torch.equal(out, expected) and drafter.last_generation_stats.accepted_from_ngram == 0


def test_trained_drafter_with_ngram_branches_matches_plain(monkeypatch):
    target, drafter = oracle_pair("llama")
    trees = capture_trees(monkeypatch)
    for prompt in (target_text_prompt(target, seed=2), random_prompt(seed=5)):
        expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
        out = target.generate(prompt, assistant_model=drafter, ngram_nodes=6, max_new_tokens=40, do_sample=False)
        assert torch.equal(out, expected)
    for base, grafted in trees:
        check_tree(grafted, base, drafter.config.tree_total_tokens + 6)
    assert drafter.last_generation_stats.accepted_from_drafter > 0


def test_ngram_branches_reach_below_a_shallow_drafter_tree(monkeypatch):
    """ngram_depth: n-gram nodes may be deeper than the drafter's own tree; still greedy == plain."""
    target = make_target("llama")
    drafter = hf_spec.EagleDrafter.from_target(target, ngram_nodes=6, ngram_depth=6)
    prompt = target_text_prompt(target)
    expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    trees = capture_trees(monkeypatch)
    shallow = dict(tree_depth=2, tree_top_k=3, tree_total_tokens=4)
    assert torch.equal(target.generate(prompt, assistant_model=drafter, max_new_tokens=40, **shallow), expected)
    deep = drafter.last_generation_stats
    assert max(int(grafted.depths.max()) for _, grafted in trees) > 2
    for base, grafted in trees:
        check_tree(grafted, base, shallow["tree_total_tokens"] + 6)
    drafter.config.ngram_depth = None  # the tree's depth: the n-gram nodes stop at depth 2
    assert torch.equal(target.generate(prompt, assistant_model=drafter, max_new_tokens=40, **shallow), expected)
    assert deep.tau > drafter.last_generation_stats.tau
    with pytest.raises(ValueError, match="ngram_depth"):
        hf_spec.EagleDrafter.from_target(target, ngram_depth=0)


def test_config_field_is_the_default_and_the_kwarg_overrides_it():
    target = make_target("llama")
    drafter = hf_spec.EagleDrafter.from_target(target, ngram_nodes=8)
    assert drafter.config.ngram_nodes == 8
    prompt = target_text_prompt(target)
    expected = plain_generate(target, prompt, max_new_tokens=20, do_sample=False)
    assert torch.equal(target.generate(prompt, assistant_model=drafter, max_new_tokens=20, **SHAPE), expected)
    assert drafter.last_generation_stats.accepted_from_ngram > 0
    target.generate(prompt, assistant_model=drafter, ngram_nodes=0, max_new_tokens=20, **SHAPE)
    assert drafter.last_generation_stats.accepted_from_ngram == 0
    with pytest.raises(ValueError, match="ngram_nodes must be an integer"):
        target.generate(prompt, assistant_model=drafter, ngram_nodes=-1, max_new_tokens=5)
    with pytest.raises(ValueError, match="ngram_nodes must be an integer"):
        hf_spec.EagleDrafter.from_target(target, ngram_nodes=1.5)
    with pytest.raises(ValueError, match="trained drafter.s trees, not into NGramDrafter"):
        target.generate(prompt, assistant_model=hf_spec.NGramDrafter(), ngram_nodes=4, max_new_tokens=5)


def test_ngram_branches_is_the_old_name_of_ngram_nodes(tmp_path):
    """The option counts grafted trie nodes, so it is ``ngram_nodes``; configs (shipped copies elsewhere, shape
    candidates) and calls that still say ``ngram_branches`` are read as before, with a FutureWarning."""
    from hf_spec.shape_select import check_candidates

    target = make_target("llama")
    with pytest.warns(FutureWarning, match="`ngram_branches` is now `ngram_nodes`"):
        drafter = hf_spec.EagleDrafter.from_target(target, ngram_branches=8)
    assert drafter.config.ngram_nodes == 8 and "ngram_branches" not in drafter.config.to_dict()
    with pytest.raises(ValueError, match="Fix: pass ngram_nodes only"):
        hf_spec.EagleDrafterConfig(ngram_nodes=2, ngram_branches=5)
    with pytest.warns(FutureWarning, match=r"tree_shape_candidates\[0\]"):
        (candidate,) = check_candidates([{"tree_depth": 2, "ngram_branches": 3, "tau": 2.0, "verified_nodes": 5.0}])
    assert candidate == {"tree_depth": 2, "ngram_nodes": 3, "tau": 2.0, "verified_nodes": 5.0}
    drafter.config.save_pretrained(tmp_path)  # a config written before the rename loads with the old key
    path = tmp_path / "config.json"
    path.write_text(path.read_text().replace('"ngram_nodes"', '"ngram_branches"'))
    with pytest.warns(FutureWarning):
        assert hf_spec.EagleDrafterConfig.from_pretrained(tmp_path).ngram_nodes == 8
    prompt = target_text_prompt(target)
    with pytest.warns(FutureWarning, match="generate"):
        target.generate(prompt, assistant_model=drafter, ngram_branches=0, max_new_tokens=10, **SHAPE)
    assert drafter.last_generation_stats.accepted_from_ngram == 0


def test_parallel_drafter_with_ngram_branches_matches_plain():
    target = make_target("qwen2")
    drafter = hf_spec.ParallelDrafter.from_target(target)
    prompt = target_text_prompt(target)
    expected = plain_generate(target, prompt, max_new_tokens=30, do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, ngram_nodes=8, max_new_tokens=30, do_sample=False)
    assert torch.equal(out, expected)
    assert drafter.last_generation_stats.accepted_from_ngram > 0


def test_batch_matches_per_row_plain_greedy(family):
    target = make_target(family)
    drafter = hf_spec.EagleDrafter.from_target(target)
    prompts = [target_text_prompt(target, seed=s)[0, 10 + 3 * s :] for s in (1, 2, 3)]
    ids, mask = pad_left(prompts)
    out = target.generate(ids, attention_mask=mask, assistant_model=drafter, do_sample=False, max_new_tokens=30,
                          ngram_nodes=8, **SHAPE)  # fmt: skip
    assert torch.equal(out, per_row_expected(target, prompts, do_sample=False, max_new_tokens=30))
    stats = drafter.last_generation_stats
    assert len(stats.rows) == 3 and stats.accepted_from_ngram > 0
    assert stats.accepted_from_ngram == sum(row.accepted_from_ngram for row in stats.rows)


# -- grafting ------------------------------------------------------------------------------------
def small_tree():
    """root 0 -> (1: token 5, 2: token 6), 1 -> (3: token 7); token 9 drafted at the root but pruned."""
    return DraftTree(tokens=torch.tensor([1, 5, 6, 7]), parents=torch.tensor([-1, 0, 0, 1]),
                     depths=torch.tensor([0, 1, 1, 2]), scores=torch.tensor([0.0, -0.1, -0.2, -0.3]),
                     expanded=torch.tensor([0, 1]), candidate_tokens=torch.tensor([[5, 6, 9], [7, 8, -1]]),
                     candidate_nodes=torch.tensor([[1, 2, -1], [3, -1, -1]]))  # fmt: skip


def test_graft_follows_shared_prefixes_and_respects_the_budget():
    # trie: 5 -> 7 -> 4 (shares 5, 7), 9 (a pruned drafter candidate: a new node), 5 -> 3
    trie = TrieNodes(tokens=[5, 9, 7, 3, 4], parents=[-1, -1, 0, 0, 2], depths=[1, 1, 2, 2, 3],
                     counts=[3, 1, 2, 1, 2], occurrences=4, ranks=[0, 3, 1, 4, 2])  # fmt: skip
    base = small_tree()
    tree = graft_trie(base, trie)
    check_tree(tree, base, len(base) - 1 + 3)
    paths = {tuple(tree.path_tokens(i).tolist()): i for i in range(1, len(tree))}
    assert set(paths) == {(5,), (6,), (9,), (5, 7), (5, 3), (5, 7, 4)}
    assert tree.from_ngram.tolist() == [False, False, False, True, False, True, True]
    # The root's row: its trie children first (point masses, rank order), then the drafter's candidates.
    slot = tree.expanded.tolist().index(0)
    assert tree.num_point_mass[slot] == 2
    assert tree.candidate_tokens[slot].tolist()[:5] == [5, 9, 5, 6, 9]
    assert tree.candidate_nodes[slot].tolist()[:5] == [paths[(5,)], paths[(9,)], paths[(5,)], paths[(6,)], -1]
    # Greedy: a target that wants 9 then 3 walks into the grafted node, never the pruned candidate.
    logits = torch.full((len(tree), 16), -10.0)
    logits[0, 9] = 10.0
    logits[paths[(9,)], 3] = 10.0
    packed = greedy_plan(tree, logits).tolist()
    assert packed[0] == 2 and packed[1 : 3] == [0, paths[(9,)]]
    # The budget: at most max_new new nodes, best ranks first (5-7-4 outranks 9 and 5-3).
    limited = graft_trie(base, trie, max_new=1)
    assert len(limited) == len(base) + 1
    assert {tuple(limited.path_tokens(i).tolist()) for i in range(1, len(limited))} >= {(5, 7, 4)}


# -- sampling ----------------------------------------------------------------------------------
def test_mixed_point_mass_and_sampled_candidates_rejection_sampling_is_exact():
    """Point-mass candidates first, then candidates drawn without replacement from q: emits exactly p."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(VOCAB, generator=g) * 2, dim=-1)
    q = torch.softmax(torch.randn(VOCAB, generator=g) * 2, dim=-1)
    point_masses = torch.tensor([int(p.argmax()), int(q.argmax()), 3])  # overlaps the draws often
    counts = torch.zeros(VOCAB)
    draws = 20000
    for _ in range(draws):
        drawn, _ = draw_candidates(q.log().view(1, -1), 3, True, g)
        candidates = torch.cat([point_masses, drawn[0]])
        nodes = torch.arange(1, candidates.numel() + 1)
        token, node = _rejection_sample(p, q, candidates, nodes, g, num_point_mass=3)
        counts[token] += 1
        assert node < 0 or int(candidates[node - 1]) == token
    assert chi_square_pvalue(counts, p) > P_VALUE_FLOOR
    # Negative control: the standard min(1, p/q) steps over ALL candidates as if drawn from q are biased.
    wrong = torch.zeros(VOCAB)
    for _ in range(draws):
        drawn, _ = draw_candidates(q.log().view(1, -1), 3, True, g)
        candidates = torch.cat([point_masses, drawn[0]])
        token, _ = _rejection_sample(p, q, candidates, torch.arange(1, 7), g, num_point_mass=0)
        wrong[token] += 1
    assert chi_square_pvalue(wrong, p) < P_VALUE_FLOOR


def sample_counts(target, prompt, drafter, seed: int, stat: str | None = None, **generate_kwargs):
    """Counts of 1,500 sampled 3-token continuations (VOCAB^3 table, drawn in batches of rows:
    :func:`test_sampling.sample_batches`) and the sum of one GenerationStats field over the calls."""
    torch.manual_seed(seed)
    counts, stats = sample_batches(target, prompt, drafter, **generate_kwargs)
    return counts, sum(getattr(s, stat) for s in stats) if stat else 0


@pytest.mark.parametrize("warp", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9)], ids=str)
def test_sampled_distribution_equals_target(warp, monkeypatch):
    target, prompt, exact = repetitive_sampling_case(warp)
    drafter = hf_spec.EagleDrafter.from_target(target)
    trees = capture_trees(monkeypatch)
    counts, from_ngram = sample_counts(target, prompt, drafter, 1234, "accepted_from_ngram", ngram_nodes=4,
                                       tree_depth=3, tree_top_k=2, tree_total_tokens=4, **warp)  # fmt: skip
    p_value = chi_square_pvalue(counts, exact)
    assert p_value > P_VALUE_FLOOR, p_value
    assert rejects_colder_law(counts, target, prompt, warp)  # the test can fail
    assert from_ngram > 100  # n-gram nodes are accepted: the point-mass path is exercised
    mixed = [t for _, t in trees if t.num_point_mass is not None and bool(
        ((t.num_point_mass > 0) & ((t.candidate_tokens >= 0).sum(dim=1) > t.num_point_mass)).any())]  # fmt: skip
    assert mixed  # rows with both point masses and sampled candidates occur


def test_sampled_distribution_with_copy_cycles_equals_target(monkeypatch):
    """The copy budget depends on the committed text only, so the sampled law stays the target's."""
    target, prompt, exact = repetitive_sampling_case(dict(temperature=1.0))
    drafter = hf_spec.EagleDrafter.from_target(target, ngram_nodes=1, ngram_copy_nodes=4, ngram_depth=3)
    trees = capture_trees(monkeypatch)
    counts, _ = sample_counts(target, prompt, drafter, 4321, tree_depth=2, tree_top_k=2, tree_total_tokens=2)
    p_value = chi_square_pvalue(counts, exact)
    assert p_value > P_VALUE_FLOOR, p_value
    assert rejects_colder_law(counts, target, prompt, dict(temperature=1.0))  # the test can fail
    assert any(len(grafted) - len(base) > 1 for base, grafted in trees)  # copy cycles occurred


def test_bench_method_suffix():
    from hf_spec.bench.harness import parse_method

    target = make_target("llama")
    drafter = hf_spec.EagleDrafter.from_target(target)
    import tempfile

    with tempfile.TemporaryDirectory() as path:
        drafter.save_pretrained(path)
        method = parse_method(f"hf_spec:{path}:ngram=6", torch.float32)
    assert method.generate_kwargs["ngram_nodes"] == 6 and method.info["ngram_nodes"] == 6
    prompt = target_text_prompt(target)
    model_drafter = method.generate_kwargs["assistant_model"]
    target.generate(prompt, max_new_tokens=10, **method.generate_kwargs)
    assert model_drafter.last_generation_stats.accepted_from_ngram > 0
    assert method.stats()["accepted_from_ngram"] == model_drafter.last_generation_stats.accepted_from_ngram


def test_copy_cycles_graft_longer_chains_and_stay_lossless(monkeypatch):
    """ngram_copy_nodes: a cycle whose context repeats the whole max_match suffix grafts up to that many
    n-gram nodes (a copy), other cycles ngram_nodes; greedy output equals plain either way."""
    target = make_target("llama")
    prompt = target_text_prompt(target)
    expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    shape = dict(tree_depth=2, tree_top_k=2, tree_total_tokens=2)
    new_nodes = {}
    for copy in (0, 8):
        drafter = hf_spec.EagleDrafter.from_target(target, ngram_nodes=2, ngram_depth=8, ngram_copy_nodes=copy)
        trees = capture_trees(monkeypatch)
        assert torch.equal(target.generate(prompt, assistant_model=drafter, max_new_tokens=40, **shape), expected)
        new_nodes[copy] = [len(grafted) - len(base) for base, grafted in trees]
        assert max(new_nodes[copy]) <= max(2, copy)
    assert max(new_nodes[0]) == 2 and max(new_nodes[8]) > 2  # the repetitive prompt makes copies certain
    with pytest.raises(ValueError, match="ngram_copy_nodes"):
        hf_spec.EagleDrafter.from_target(target, ngram_copy_nodes=-1)


class RecordingController(SpeedController):
    """Drafts every cycle on the costliest arm and keeps what the loop reports of each cycle: (tokens, copied)."""

    def __init__(self, labels):
        super().__init__(list(labels), start=len(labels) - 1)
        self.reported: list[tuple[int, bool]] = []

    def choose(self) -> int:
        return len(self.labels) - 1

    def record(self, arm, seconds, tokens, rows=1, copied=False, typical=True):
        self.reported.append((tokens, copied))
        super().record(arm, seconds, tokens, rows=rows, copied=copied, typical=typical)


def test_the_loop_tells_the_controller_which_cycles_were_copy_cycles(monkeypatch):
    """A cycle that grafted a copy's chain (more n-gram nodes than ngram_nodes) reaches the controller as a copy
    cycle, which it does not weigh between tree shapes; without copy cycles none is reported."""
    target = make_target("llama")
    prompt = target_text_prompt(target)
    expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    for copy in (0, 8):
        drafter = hf_spec.EagleDrafter.from_target(target, ngram_nodes=2, ngram_depth=8, ngram_copy_nodes=copy,
                                                   tree_depth=2, tree_top_k=2, tree_total_tokens=2)  # fmt: skip
        trees = capture_trees(monkeypatch)
        controller = RecordingController(["plain", "configured"])
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=40, speed_controller=controller)
        assert torch.equal(out, expected)
        copied = [flag for _, flag in controller.reported]
        assert len(copied) == len(trees) == drafter.last_generation_stats.cycles
        grafted_a_copy = [len(grafted) - len(base) > 2 for base, grafted in trees]
        assert all(flag for flag, big in zip(copied, grafted_a_copy) if big)
        assert any(copied) == (copy > 0)


def count_drafter_forwards(monkeypatch) -> list[int]:
    """A one-element list counting the drafting sessions' drafter forwards (EAGLE and ParallelSpec)."""
    from hf_spec.drafters.parallelspec import ParallelDraftingSession

    calls = [0]
    for cls, name in ((EagleDraftingSession, "_run"), (ParallelDraftingSession, "draft_distributions")):
        original = getattr(cls, name)

        def counted(self, *args, _original=original, **kwargs):
            calls[0] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(cls, name, counted)
    return calls


def copy_cycle_run(monkeypatch, target, prompt, expected, drafter) -> tuple[float, int]:
    """Greedy generate with ``drafter`` on the tiny-tree settings of the copy-cycle tests; asserts the output is
    ``expected`` (plain greedy) and returns (drafter forwards per cycle, tokens accepted from n-gram nodes)."""
    calls = count_drafter_forwards(monkeypatch)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=40, tree_depth=2, tree_top_k=2,
                          tree_total_tokens=2)  # fmt: skip
    assert torch.equal(out, expected)
    stats = drafter.last_generation_stats
    return calls[0] / stats.cycles, stats.accepted_from_ngram


class ScriptedGate:
    """A cost gate that prefers the n-gram trie alone on the cycles it is told to."""

    node_costs = 0.0

    def __init__(self, skip_at):
        self.skip_at, self.cycle = set(skip_at), -1

    def record_committed(self, tokens, own=None):
        self.cycle += 1

    def prefers_ngram(self, expected, nodes):
        return self.cycle in self.skip_at

    def record_ngram(self, expected):
        pass

    def record_drafted(self, *args):
        pass

    def copy_trie(self, trie):
        return trie


def test_deferred_pairs_reach_the_drafter_cache_as_if_never_skipped():
    """The pairs of a skipped cycle (the cost gate's n-gram trie alone) enter the family's session with the next
    drafted cycle: that cycle's tree equals the one of a session that drafted every cycle."""
    target, drafter = oracle_pair("llama")
    prompt = random_prompt(8)
    ids = plain_generate(target, prompt, max_new_tokens=12, do_sample=False)
    features = target.base_model(input_ids=ids).last_hidden_state[0]
    shape = TreeShape(3, 2, 4)
    every = EagleDraftingSession(drafter, shape, False, 1.0, prompt)
    inner = EagleDraftingSession(drafter, shape, False, 1.0, prompt)
    gated = NGramHybridSession(inner, drafter.config, shape, False, prompt, branches=1,
                               gate=ScriptedGate(skip_at={1, 2}))  # fmt: skip
    length = prompt.shape[1]
    steps = [(features[:length], ids[0, 1 : length + 1])] + [
        (features[i : i + 1], ids[0, i + 1 : i + 2]) for i in range(length, length + 4)]  # fmt: skip
    drafted = []
    inner_propose = inner.propose
    inner.propose = lambda f, t: drafted.append(inner_propose(f, t)) or drafted[-1]
    for step, (feats, tokens) in enumerate(steps):
        tree = every.propose(feats, tokens)
        before = len(drafted)
        hybrid_tree = gated.propose(feats, tokens)
        if step in (1, 2):  # skipped: the trie alone, nothing reaches the drafter
            assert len(drafted) == before and bool(hybrid_tree.from_ngram[1:].all())
            continue
        assert len(drafted) == before + 1
        assert torch.equal(drafted[-1].tokens, tree.tokens) and torch.allclose(drafted[-1].scores, tree.scores)
    assert every.committed == inner.committed == length + 4  # every pair in the cache
    assert gated.skipped_cycles == 2


class CostGate(ScriptedGate):
    """A cost gate that never skips the drafter and prices each verified node at ``node_costs``."""

    def __init__(self, node_costs):
        super().__init__(skip_at=())
        self.node_costs = node_costs


@pytest.mark.parametrize("node_costs, most", [(100.0, 0), (0.0, 2)])
def test_a_gated_drafted_cycle_verifies_only_the_nodes_the_gate_priced(node_costs, most, monkeypatch):
    """Under the cost gate a drafted cycle grafts the trie the gate weighed (cut by the verification costs), at most
    the arm's budget: where every node costs more than it is expected to commit, none; where nodes are free, the
    budget's best. Not ``branches`` nodes regardless of their cost (a float32 CPU pays for each verified row)."""
    target, drafter = oracle_pair("llama")
    prompt = target_text_prompt(target)  # the text loops: the trie has nodes
    ids = plain_generate(target, prompt, max_new_tokens=3, do_sample=False)
    features = target.base_model(input_ids=ids).last_hidden_state[0]
    shape = TreeShape(3, 2, 4)
    inner = EagleDraftingSession(drafter, shape, False, 1.0, prompt)
    gated = NGramHybridSession(inner, drafter.config, shape, False, prompt, branches=2, gate=CostGate(node_costs))
    grafted = []
    monkeypatch.setattr(hybrid, "graft_trie", lambda tree, trie: grafted.append(len(trie)) or graft_trie(tree, trie))
    length = prompt.shape[1]
    for end in (length, length + 1, length + 2):
        start = 0 if end == length else end - 1
        gated.propose(features[start:end], ids[0, start + 1 : end + 1])
    assert gated.skipped_cycles == 0 and len(grafted) == 3 and not gated.copied
    assert max(grafted) == most  # the gate's trie, capped by the budget: at most 2 nodes, none when too dear


def test_copy_budget_tells_copy_and_plain_cycles_apart():
    """copy_budget: a context match of the whole max_match suffix (or longer) is a copy (copy_nodes); a shorter
    match, one found only in the datastore, no continuation, or a budget of 0 draft as usual (0)."""
    from hf_spec.drafters.ngram import Continuation, copy_budget

    def budget(length, position=5, copy=24):
        return copy_budget(Continuation([1, 2], length, position), 4, copy)

    assert budget(4) == budget(9) == 24 and budget(4, copy=0) == 0  # a copy, or none where copies are off
    assert budget(4, position=-1) == 0  # a datastore-only match is no copy
    assert budget(3) == budget(1) == 0 and copy_budget(None, 4, 24) == 0


def test_ngram_max_match_sets_the_suffix_a_copy_must_repeat(monkeypatch):
    """ngram_max_match: the hybrid's n-gram index matches suffixes up to that long, so a copy cycle needs that many
    repeated tokens (a 4-token repeat is a copy at 4, not at 6); greedy output still equals plain."""
    from hf_spec.drafters.ngram import NGramBranches

    context = torch.tensor([[7, 1, 2, 3, 4, 9, 8, 8, 1, 2, 3, 4]])  # the suffix 1 2 3 4 repeats, 9 1 2 3 4 does not
    for max_match, expected_budget in ((4, 24), (6, 0)):
        branches = NGramBranches(context[:, :1], max_match=max_match, copy_nodes=24)
        branches.extend(context[0, 1:])
        assert branches.copy_budget(depth=4) == expected_budget
    target = make_target("llama")
    prompt = target_text_prompt(target)
    expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    made = []
    monkeypatch.setattr(hybrid, "NGramBranches", lambda *a, **kw: made.append(kw) or NGramBranches(*a, **kw))
    drafter = hf_spec.EagleDrafter.from_target(target, ngram_nodes=2, ngram_copy_nodes=8, ngram_max_match=6)
    assert torch.equal(target.generate(prompt, assistant_model=drafter, max_new_tokens=40, tree_depth=2, tree_top_k=2,
                                       tree_total_tokens=2), expected)  # fmt: skip
    assert [kw["max_match"] for kw in made] == [6]
    with pytest.raises(ValueError, match="ngram_max_match"):
        hf_spec.EagleDrafter.from_target(target, ngram_max_match=0)


# -- the cost gate (ngram_cost_gate) -------------------------------------------------------------
def test_cycle_gate_measures_the_drafters_exact_gain_per_bucket_and_weighs_it_against_its_cost():
    from hf_spec.drafters.ngram import CycleGate
    from hf_spec.tree.tree import DraftTree

    def trie(parents, tokens):  # root (token 0) first
        return DraftTree(torch.tensor([0, *tokens]), torch.tensor([-1, *parents]), None, None, None, None, None)

    gate = CycleGate({1: 10.0, 17: 14.0}, 16)  # each node +0.25 ms on a 10 ms step, x1.2: 3% of a step
    assert gate.node_costs[16] == pytest.approx(1.48)
    assert not gate.prefers_ngram(8.0, 16)  # nothing measured yet: the drafter runs
    untimed = CycleGate({1: 10.0, 17: 14.0}, 16)
    untimed.record_drafted(8, None, 8.0, trie([0], [5]))  # the first cycle (the drafter read the prompt): untimed
    untimed.record_committed([1])
    assert not untimed.prefers_ngram(8.0, 16)  # still no drafting time measured: the drafter runs
    # nothing matched (1 token expected, trie [5]); the drafter's tree committed 7, 8 and the target's 9:
    # the trie alone would have committed 1 token (7 is not in it), so the drafter gained 2
    gate.record_drafted(8, 5.0, 1.0, trie([0], [5]))
    gate.record_committed([7, 8, 9])
    # a copied passage (8 expected from a chain of 8): all 8 in the trie, + the target's own: gained 0, and
    # the trie did 1 token better than expected
    gate.record_drafted(8, 5.0, 8.0, trie(list(range(8)), list(range(1, 9))))
    gate.record_committed(list(range(1, 10)))
    # branches: the committed 7, 8 follow the trie's second branch, then the target's 2: gained 0
    gate.record_drafted(8, 5.0, 1.5, trie([0, 0, 2], [5, 7, 8]))
    gate.record_committed([7, 8, 2])
    gate.record_ngram(1.0)  # a cycle of the trie alone: its commit calibrates bucket 0 (1 token, as expected)
    gate.record_committed([4])
    gate.record_committed([4])  # nothing pending: ignored
    overall = (2 + 0 + 0 + 4 * 1.0) / (3 + 4)
    assert gate.gain(1.0) == pytest.approx((2 + 4 * overall) / (1 + 4))  # bucket 0: its own gain + prior
    assert gate.gain(8.0) == pytest.approx((0 + 4 * overall) / (1 + 4))
    assert gate.gain(1.5) == pytest.approx((0 + 4 * overall) / (1 + 4))
    assert gate.gain(3.0) == pytest.approx(overall)  # no drafted cycle in this bucket yet
    assert gate.trie_tokens(8.0) == pytest.approx(8.0 + 1 / 5) and gate.trie_tokens(1.0) == pytest.approx(1.0)
    # nothing to copy (1 token, no nodes): 1.0 alone vs (1 + 1.03) / (1 + 0.03 x 8 + 0.5) = 1.17: draft
    assert not gate.prefers_ngram(1.0, 0)
    # a copied passage (8 tokens expected from 16 nodes): 8.2 / 1.48 = 5.5 alone vs 8.8 / 2.22 = 4.0 drafted
    assert gate.prefers_ngram(8.0, 16)
    # the same trie sizes, but the drafter's gain measured where the trie expects little:
    # 2.0 / 1.36 = 1.47 alone vs (2.0 + 0.86) / (1 + 0.03 x 20 + 0.5) = 1.36 drafted
    assert gate.prefers_ngram(2.0, 12) and not gate.prefers_ngram(1.0, 12)


def test_cycle_gate_resolves_a_cycle_by_its_own_commit_when_other_arms_ran_since():
    """After other arms' cycles (the speed controller's plain steps, other tree shapes), the tokens the gate reads
    next include their commits: only the first ``own`` are its last cycle's outcome."""
    from hf_spec.drafters.ngram import CycleGate

    trie = DraftTree(torch.tensor([0, 5]), torch.tensor([-1, 0]), None, None, None, None, None)
    alone, after_others = CycleGate({1: 10.0, 17: 14.0}, 16), CycleGate({1: 10.0, 17: 14.0}, 16)
    for gate, tokens, own in ((alone, [7, 8, 9], None), (after_others, [7, 8, 9, *range(20, 50)], 3)):
        gate.record_drafted(8, 5.0, 1.0, trie)
        gate.record_committed(tokens, own=own)
        gate.record_ngram(2.0)
        gate.record_committed([5, 6, 7, 8], own=1)  # the trie alone committed 1 token, 1 fewer than expected
    for expected in (1.0, 2.0):
        assert after_others.gain(expected) == pytest.approx(alone.gain(expected))
        assert after_others.trie_tokens(expected) == pytest.approx(alone.trie_tokens(expected))
    assert alone.gain(1.0) == pytest.approx((2 + 4 * 1.2) / 5)  # bucket 0: its gain 2, the prior 1.2 (overall)
    assert alone.trie_tokens(2.0) == pytest.approx(2.0 - 1 / 5)


def test_cycle_gate_lets_copy_cycles_go_deep_only_while_the_deep_nodes_were_accepted():
    """A copy cycle's trie (up to ngram_copy_nodes) is verified whole until earlier copy cycles, counted exactly
    once the committed text has gone past them, say its nodes past the best 16 did not pay for themselves."""
    from hf_spec.drafters.ngram import CycleGate, TrieNodes

    def chain(n, start=100):  # a copied passage: one chain of n nodes, best first
        return TrieNodes(tokens=list(range(start, start + n)), parents=list(range(-1, n - 1)),
                         depths=list(range(1, n + 1)), counts=[1] * n, occurrences=1, ranks=list(range(n)),
                         probabilities=[0.97 ** (k + 1) for k in range(n)])  # fmt: skip

    costs = {1: 10.0, 25: 12.4}  # +0.1 ms a node on a 10 ms step: 24 nodes are worth verifying on a guess
    departs, follows = CycleGate(costs, 24), CycleGate(costs, 24)
    for gate, copied in ((departs, 5), (follows, 24)):
        for counted in range(CycleGate.MIN_COPY_TRIALS):
            assert len(gate.copy_trie(chain(24))) == 24  # too few counted yet: the whole trie
            text = list(range(100, 100 + copied)) + [7]  # the committed text follows the chain, then departs
            gate.record_committed(text[:3])  # the text so far still follows it: not counted yet
            assert gate._copy_big.cycles == counted and len(gate._copy_trials) == 1
            gate.record_committed(text[3:])
            assert not gate._copy_trials
    assert (departs._copy_big.tokens, departs._copy_small.tokens) == (2 * 6, 2 * 6)  # 5 accepted + the target's
    assert (follows._copy_big.tokens, follows._copy_small.tokens) == (2 * 25, 2 * 17)
    # the restated passage departs after 5 tokens: the best 16 nodes commit as much for less
    cut = departs.copy_trie(chain(24))
    assert len(cut) == 16 and cut.tokens == list(range(100, 116)) and cut.parents == list(range(-1, 15))
    assert len(follows.copy_trie(chain(24))) == 24  # the copied code went on: deep copies pay
    assert len(departs.copy_trie(chain(12))) == 12  # no more than 16 nodes: nothing to choose
    carried = departs.carried_over()  # the next call's text: counted afresh
    assert not carried._copy_trials and carried._copy_big.cycles == 0 and len(carried.copy_trie(chain(24))) == 24


def test_trie_nodes_first_keeps_the_best_nodes_with_their_parents():
    from hf_spec.drafters.ngram import TrieNodes

    # root -> a(rank 0) -> c(rank 2); root -> b(rank 1) -> d(rank 3); BFS order a, b, c, d
    trie = TrieNodes(tokens=[1, 2, 3, 4], parents=[-1, -1, 0, 1], depths=[1, 1, 2, 2], counts=[2, 1, 2, 1],
                     occurrences=3, ranks=[0, 1, 2, 3], probabilities=[0.9, 0.5, 0.8, 0.4])  # fmt: skip
    best = trie.first(3)
    assert (best.tokens, best.parents, best.ranks, best.probabilities) == ([1, 2, 3], [-1, -1, 0], [0, 1, 2], [0.9, 0.5, 0.8])
    assert len(trie.first(0)) == 0 and trie.first(9).tokens == trie.tokens


def test_cycle_gate_carries_its_measurements_over_to_the_next_call_with_the_same_target(monkeypatch):
    """A second call with the same target starts from the first call's gate (capped to MEMORY_CYCLES cycles);
    another target (or dtype) starts afresh."""
    from hf_spec import verify_cost
    from hf_spec.drafters.ngram import CycleGate

    monkeypatch.setattr(verify_cost, "verify_cost_curve", lambda model: {1: 0.5, 64: 0.6})
    target = make_target("llama")
    prompt = target_text_prompt(target)
    drafter = hf_spec.EagleDrafter.from_target(target, ngram_nodes=2, ngram_depth=8, ngram_cost_gate=True)
    target.generate(prompt, assistant_model=drafter, max_new_tokens=20)
    first = hybrid._GATES[drafter][2]
    assert first._draft_ms.count >= 1 and first._pending is not None  # timed; its last cycle never verified
    target.generate(prompt, assistant_model=drafter, max_new_tokens=20)
    second = hybrid._GATES[drafter][2]
    assert second is not first and second._draft_ms.count >= first._draft_ms.count
    assert sum(t.count for t in second._bias) > sum(t.count for t in first._bias)
    other = make_target("llama")
    drafter.bind(other)
    other.generate(prompt, assistant_model=drafter, max_new_tokens=4)
    assert hybrid._GATES[drafter][0]() is other
    assert sum(t.count for t in hybrid._GATES[drafter][2]._bias) < sum(t.count for t in second._bias)
    gate = CycleGate({1: 10.0, 17: 14.0}, 16)
    for _ in range(500):
        gate.record_ngram(1.0)
        gate.record_committed([1, 2])  # the trie did 1 token better than expected, 500 times
    carried = gate.carried_over()
    assert carried._bias[0].count == CycleGate.MEMORY_CYCLES and carried._bias[0].mean() == gate._bias[0].mean() == 1.0


@pytest.mark.parametrize("kind", ["eagle", "parallel"])
def test_cost_gate_stays_lossless_and_skips_the_drafter_on_a_repetitive_text(kind, monkeypatch):
    """With ngram_cost_gate the n-gram trie alone replaces drafted cycles where it is worth more: greedy output
    equals plain and fewer drafter forwards run than without the gate (EAGLE family and ParallelSpec)."""
    from hf_spec import verify_cost

    # a target step of 0.5 ms: the untrained drafter's forwards cost several steps and add little
    monkeypatch.setattr(verify_cost, "verify_cost_curve", lambda model: {1: 0.5, 64: 0.6})
    target = make_target("llama")
    prompt = target_text_prompt(target)
    expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    forwards = {}
    for gate in (False, True):
        cls = hf_spec.EagleDrafter if kind == "eagle" else hf_spec.ParallelDrafter
        drafter = cls.from_target(target, ngram_nodes=2, ngram_depth=8, ngram_cost_gate=gate)
        forwards[gate], _ = copy_cycle_run(monkeypatch, target, prompt, expected, drafter)
        assert drafter.last_generation_stats.drafter_skipped_cycles > 0 if gate else True
    assert forwards[True] < forwards[False]
    # a call that turns the n-gram branches off drafts every cycle, gate or not
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=40, ngram_nodes=0)
    assert torch.equal(out, expected) and drafter.last_generation_stats.drafter_skipped_cycles == 0


def test_cost_gate_copy_cycles_stay_lossless_and_are_counted(monkeypatch):
    """Copy cycles under the gate (a copy budget above 16 nodes) verify the whole trie or its best 16 nodes as the
    gate chooses: greedy output equals plain, and the gate counts what both would have committed."""
    from hf_spec import verify_cost

    monkeypatch.setattr(verify_cost, "verify_cost_curve", lambda model: {1: 0.5, 64: 0.6})
    target = make_target("llama")
    prompt = target_text_prompt(target)  # the tiny target loops: its text copies the prompt
    expected = plain_generate(target, prompt, max_new_tokens=60, do_sample=False)
    drafter = hf_spec.EagleDrafter.from_target(target, ngram_nodes=2, ngram_depth=24, ngram_copy_nodes=24,
                                               ngram_cost_gate=True)  # fmt: skip
    for _ in range(2):  # the second call counts its own copies afresh
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=60, tree_depth=2, tree_top_k=2,
                              tree_total_tokens=2)  # fmt: skip
        assert torch.equal(out, expected)
    gate = hybrid._GATES[drafter][2]
    assert gate._copy_big.cycles > 0 and gate._copy_big.tokens >= gate._copy_small.tokens
    assert max(drafter.last_generation_stats.tree_sizes) > 17  # some copy cycle verified more than 16 nodes


@pytest.mark.parametrize("kind", ["eagle", "parallel"])
def test_sampled_distribution_with_the_cost_gate_equals_target(kind, monkeypatch):
    """The gate's choice depends on the committed text and earlier cycles only: the sampled law stays the target's
    (EAGLE family and ParallelSpec)."""
    from hf_spec import verify_cost

    monkeypatch.setattr(verify_cost, "verify_cost_curve", lambda model: {1: 0.5, 64: 0.6})
    target, prompt, exact = repetitive_sampling_case(dict(temperature=1.0))
    cls = hf_spec.EagleDrafter if kind == "eagle" else hf_spec.ParallelDrafter
    drafter = cls.from_target(target, ngram_nodes=1, ngram_depth=3, ngram_cost_gate=True)
    calls = count_drafter_forwards(monkeypatch)
    counts, num_cycles = sample_counts(target, prompt, drafter, 2470, "cycles", tree_depth=2, tree_top_k=2,
                                       tree_total_tokens=2)  # fmt: skip
    p_value = chi_square_pvalue(counts, exact)
    assert p_value > P_VALUE_FLOOR, p_value
    assert rejects_colder_law(counts, target, prompt, dict(temperature=1.0))  # the test can fail
    forwards_per_drafted_cycle = 2 if kind == "eagle" else 1  # depth 2: EAGLE commits then expands once
    assert calls[0] < forwards_per_drafted_cycle * num_cycles  # some cycles skipped the drafter


# -- every trained family: the branches wrap any drafting session ---------------------------------
def family_pair(name, **target_kwargs):
    """(target, untrained drafter of family ``name``) for the family tests of the n-gram wrapper."""
    if name == "s2d":
        return sorted_pair(**target_kwargs)
    target = make_target("llama", **target_kwargs)
    if name == "eagle3":
        return target, hf_spec.Eagle3Drafter.from_target(target, eagle_aux_hidden_state_layer_ids=[0, 1])
    if name == "parallelspec":
        return target, hf_spec.ParallelDrafter.from_target(target, num_mask_tokens=2, tree_widths=[2, 1],
                                                           tree_total_tokens=3)  # fmt: skip
    return target, hf_spec.EagleDrafter.from_target(target)


@pytest.mark.parametrize("gate", [False, True], ids=["branches", "cost-gate"])
@pytest.mark.parametrize("name", ["eagle", "eagle3", "parallelspec", "s2d"])
def test_every_family_grafts_ngram_branches_and_matches_plain(name, gate, monkeypatch):
    """ngram_nodes (and the cost gate) wrap any family's session: greedy output equals plain generate(), and
    n-gram nodes are accepted on a text that repeats itself."""
    from hf_spec import verify_cost

    monkeypatch.setattr(verify_cost, "verify_cost_curve", lambda model: {1: 0.5, 64: 0.6})
    target, drafter = family_pair(name)
    drafter.config.ngram_nodes, drafter.config.ngram_cost_gate = 4, gate
    drafter.config.ngram_copy_nodes, drafter.config.ngram_depth = 8, 8
    prompt = target_text_prompt(target)
    expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    trees = capture_trees(monkeypatch)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=40, do_sample=False, speed_controller=False)
    assert torch.equal(out, expected)
    stats = drafter.last_generation_stats
    assert stats.accepted_from_ngram > 0 and trees
    assert any(int(grafted.from_ngram.sum()) > 0 for _, grafted in trees if grafted.from_ngram is not None)
    if not gate:
        assert stats.drafter_skipped_cycles == 0


@pytest.mark.parametrize("name", ["eagle3", "s2d"])
def test_sampled_law_with_ngram_branches_is_exact_for_every_family(name, monkeypatch):
    """Point-mass n-gram candidates ahead of the family's sampled ones keep the target's law (chi-square)."""
    target, drafter = family_pair(name, vocab_size=VOCAB, logit_scale=8.0, seed=3)
    seed_prompt = random_prompt(length=4, vocab_size=VOCAB, seed=11)
    torch.manual_seed(0)
    text = plain_generate(target, seed_prompt, max_new_tokens=24, do_sample=True, top_k=None, temperature=1.0)
    prompt = torch.cat([text, seed_prompt], dim=1)  # its own text, then its start again: n-grams to follow
    exact = exact_joint(target, prompt, warpers(temperature=1.0))
    trees = capture_trees(monkeypatch)
    counts, from_ngram = sample_counts(target, prompt, drafter, 1234, "accepted_from_ngram", ngram_nodes=4,
                                       tree_depth=3, tree_top_k=2, tree_total_tokens=4, temperature=1.0)  # fmt: skip
    assert chi_square_pvalue(counts, exact) > P_VALUE_FLOOR
    assert rejects_colder_law(counts, target, prompt, dict(temperature=1.0))  # the test can fail
    assert from_ngram > 100 and trees  # n-gram nodes are accepted: the point-mass path is exercised
