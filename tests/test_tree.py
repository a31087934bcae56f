"""DraftTree masks/positions/paths and EAGLE-2 dynamic growth (pure tensor code)."""

import math

import pytest
import torch

from hf_spec.tree.dynamic import Frontier, TreeShape, draw_candidates, grow_dynamic_tree
from hf_spec.tree.tree import DraftTree, causal_mask
from hf_spec.verify import verify_tree


def hand_tree():
    #        0
    #      /   \
    #     1     2
    #    / \     \
    #   3   4     5
    #   |
    #   6
    parents = torch.tensor([-1, 0, 0, 1, 1, 2, 3])
    return DraftTree(
        tokens=torch.tensor([9, 10, 11, 12, 13, 14, 15]),
        parents=parents,
        depths=torch.tensor([0, 1, 1, 2, 2, 2, 3]),
        scores=torch.zeros(7),
        expanded=torch.tensor([0, 1, 2, 3]),
        candidate_tokens=torch.tensor([[10, 11], [12, 13], [14, -1], [15, -1]]),
        candidate_nodes=torch.tensor([[1, 2], [3, 4], [5, -1], [6, -1]]),
    )


def test_ancestor_mask_positions_and_paths():
    tree = hand_tree()
    expected_ancestors = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0, 0],
            [1, 1, 0, 1, 0, 0, 0],
            [1, 1, 0, 0, 1, 0, 0],
            [1, 0, 1, 0, 0, 1, 0],
            [1, 1, 0, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(tree.ancestor_matrix(), expected_ancestors)
    mask = tree.attention_mask(past_length=3, dtype=torch.float32)
    assert mask.shape == (1, 1, 7, 10)
    assert torch.all(mask[0, 0, :, :3] == 0)
    assert torch.equal(mask[0, 0, :, 3:] == 0, expected_ancestors)
    assert mask.min() == torch.finfo(torch.float32).min
    assert tree.position_ids(3).tolist() == [[3, 4, 4, 5, 5, 5, 6]]
    paths = tree.root_to_leaf_paths().tolist()
    assert sorted(paths) == sorted([[0, 1, 3, 6], [0, 1, 4, -1], [0, 2, 5, -1]])
    assert tree.path_tokens(6).tolist() == [10, 12, 15]
    assert tree.path_tokens(0).tolist() == []


def test_sliding_window_mask_hides_old_positions():
    tree = hand_tree()
    mask = tree.attention_mask(past_length=6, dtype=torch.float32, sliding_window=3) == 0
    # node 6 sits at position 9: it may see positions 7..9 only -> cached 7? no (cache ends at 5), its ancestors 1 (pos 7), 3 (pos 8), itself
    assert mask[0, 0, 6, :6].sum() == 0
    assert mask[0, 0, 6, 6:].tolist() == [False, True, False, True, False, False, True]
    # the root (position 6) sees cached positions 4 and 5 and itself
    assert mask[0, 0, 0, :6].tolist() == [False, False, False, False, True, True]


def test_causal_mask_matches_tree_of_a_chain():
    chain = DraftTree.chain(5, torch.tensor([6, 7, 8]))
    assert torch.equal(chain.attention_mask(2, torch.float32), causal_mask(2, 4, torch.float32, "cpu"))
    assert chain.candidate_nodes.view(-1).tolist() == [1, 2, 3]


def fake_expand(vocab=20, seed=0):
    """A deterministic 'drafter': log-probs depend on each node's token and depth only."""
    g = torch.Generator().manual_seed(seed)
    table = torch.log_softmax(torch.randn(vocab, 8, vocab, generator=g) * 2, dim=-1)
    calls = []

    def expand(frontier: Frontier):
        calls.append(frontier)
        return table[frontier.tokens, frontier.depths]

    return table, expand, calls


@pytest.mark.parametrize("depth,top_k,total", [(1, 1, 1), (4, 1, 4), (3, 3, 8), (5, 4, 20), (6, 8, 60)])
def test_dynamic_tree_is_well_formed(depth, top_k, total):
    table, expand, calls = fake_expand()
    root_logq = table[3, 0]
    tree = grow_dynamic_tree(3, root_logq, expand, TreeShape(depth, top_k, total), sample=False)
    assert len(tree) == 1 + min(total, top_k + (depth - 1) * top_k * top_k)
    assert len(calls) == depth - 1
    assert tree.max_depth <= depth
    # BFS order, ancestors kept, scores never increase downwards
    assert torch.all(tree.parents[1:] < torch.arange(1, len(tree)))
    assert torch.all(tree.scores[1:] <= tree.scores[tree.parents[1:]] + 1e-6)
    assert torch.all(tree.depths[1:] == tree.depths[tree.parents[1:]] + 1)
    # one candidate row per expanded node, pruned or not (fixed shapes); a pruned node's row leads nowhere
    assert tree.expanded.shape[0] == 1 + (depth - 1) * top_k
    # greedy candidates are the top-k of the drafter at each expanded node
    for slot, node in enumerate(tree.expanded.tolist()):
        if node < 0:
            assert bool((tree.candidate_nodes[slot] == -1).all())
            continue
        node_logq = root_logq if node == 0 else table[tree.tokens[node], tree.depths[node]]
        assert tree.candidate_tokens[slot].tolist() == node_logq.topk(top_k).indices.tolist()
        kept = tree.candidate_nodes[slot]
        assert torch.all(tree.parents[kept[kept >= 0]] == node)
    # the kept nodes are the best-scoring ones
    if total < top_k + (depth - 1) * top_k * top_k:
        kept_min = tree.scores[1:].min()
        all_scores = _all_scores(table, root_logq, depth, top_k)
        assert (all_scores > kept_min + 1e-6).sum() <= total


@pytest.mark.parametrize("finite,total", [(2, 30), (2, 10), (1, 10)])
def test_zero_probability_draws_keep_the_size_and_are_never_accepted(finite, total):
    """A drafter giving probability 0 to all but ``finite`` tokens per row (fewer than top_k): the tree keeps its
    fixed size (1 + total nodes, one row per expanded node, -1 for a pruned one), a row leads only to nodes of
    finite score, and the greedy walk on the device equals the node-by-node walk, never accepting an unreachable
    node even where the target's argmax is its token; sampling walks the same trees."""
    table, _, _ = fake_expand()
    g = torch.Generator().manual_seed(2)
    allowed = torch.rand(table.shape, generator=g).argsort(dim=-1) < finite
    table = torch.log_softmax(table.masked_fill(~allowed, float("-inf")), dim=-1)

    def grow(shape, sample):
        return grow_dynamic_tree(3, table[3, 0], lambda f: table[f.tokens, f.depths], shape, sample)

    tree = grow(TreeShape(4, 3, total), sample=False)
    assert len(tree) == 1 + total and tree.expanded.shape[0] == 1 + 3 * 3
    reachable = torch.zeros(len(tree), dtype=torch.bool)
    reachable[0] = True
    reachable[tree.candidate_nodes[tree.candidate_nodes >= 0]] = True
    assert torch.equal(reachable, torch.isfinite(tree.scores))
    rows = tree.expanded >= 0
    argmax = torch.zeros(len(tree), dtype=torch.long)  # each node's argmax: its first candidate (deep walks)
    argmax[tree.expanded[rows]] = tree.candidate_tokens[rows, 0].clamp(min=0)
    choices = [argmax]
    if not reachable.all():  # lead the walk to the first unreachable node's parent, whose argmax is its token
        node = int((~reachable).nonzero()[0])
        unreachable = (int(tree.parents[node]), int(tree.tokens[node]))
        choices.append(argmax.clone())
        while node > 0:
            choices[-1][tree.parents[node]] = tree.tokens[node]
            node = int(tree.parents[node])
    for argmax in choices:
        logits = torch.randn(len(tree), 20, generator=g)
        logits[torch.arange(len(tree)), argmax] = 50.0
        on_device = verify_tree(tree, logits, None, do_sample=False)
        walked = verify_tree(tree, logits, lambda node, raw: raw, do_sample=False)
        assert (on_device.nodes, on_device.tokens) == (walked.nodes, walked.tokens)
        assert bool(reachable[walked.nodes].all())
    if len(choices) > 1:
        assert (walked.nodes[-1], walked.tokens[-1]) == unreachable  # the walk stops there with that token
    sampled = grow(TreeShape(4, 3, 9), sample=True)
    for _ in range(20):
        walk = verify_tree(sampled, torch.randn(len(sampled), 20, generator=g), None, do_sample=True)
        assert bool(torch.isfinite(sampled.scores[walk.nodes]).all())


def test_a_lone_root_walks_to_its_argmax_as_the_node_walk_does():
    """A plain step's tree (the root alone) skips the greedy walk's tensor ops: the same node, token, device
    tensors and kept scores as the node-by-node walk."""
    g = torch.Generator().manual_seed(3)
    tree = DraftTree.chain(5, torch.tensor([], dtype=torch.long))
    for _ in range(5):
        logits = torch.randn(1, 50, generator=g)
        fast = verify_tree(tree, logits, None, do_sample=False, keep_scores=True)
        walked = verify_tree(tree, logits, lambda node, raw: raw, do_sample=False, keep_scores=True)
        assert (fast.nodes, fast.tokens) == (walked.nodes, walked.tokens) == ([0], [int(logits[0].argmax())])
        assert fast.node_tensor("cpu").tolist() == [0] and fast.token_tensor("cpu").tolist() == fast.tokens
        torch.testing.assert_close(fast.scores[0], walked.scores[0])


def _all_scores(table, root_logq, depth, top_k):
    """Every node score the growth can create (independent re-implementation for the check)."""
    values, tokens = root_logq.topk(top_k)
    level = [(float(v), int(t), 1) for v, t in zip(values, tokens)]
    scores = [s for s, _, _ in level]
    for _ in range(depth - 1):
        frontier = sorted(level, key=lambda x: -x[0])[:top_k]
        level = []
        for s, t, d in frontier:
            v, c = table[t, d].topk(top_k)
            level += [(s + float(vv), int(cc), d + 1) for vv, cc in zip(v, c)]
        scores += [s for s, _, _ in level]
    return torch.tensor(scores)


@pytest.mark.parametrize("sample", [False, True])
@pytest.mark.parametrize("min_prob", [0.02, 0.1, 0.3])
def test_min_prob_keeps_confident_nodes_and_stops_growing_below_the_floor(sample, min_prob):
    """With tree_min_prob, greedy keeps exactly the nodes of the unfloored tree scoring >= log(min_prob) (up to the
    budget), growth stops at the first depth whose best node is below it, and sampling still pins expanded nodes."""
    table, expand, calls = fake_expand()
    shape, floored = TreeShape(5, 3, 30), TreeShape(5, 3, 30, min_prob=min_prob)
    torch.manual_seed(0)
    full = grow_dynamic_tree(3, table[3, 0], expand, shape, sample=sample)
    full_calls = len(calls)
    calls.clear()
    torch.manual_seed(0)
    tree = grow_dynamic_tree(3, table[3, 0], expand, floored, sample=sample)
    floor = math.log(min_prob)
    assert torch.all(tree.parents[1:] < torch.arange(1, len(tree)))
    below = tree.scores[1:] < floor
    if not sample:
        assert not below.any()
        confident = [(int(t), int(p), int(d)) for t, p, d, s in zip(full.tokens, full.parents, full.depths, full.scores)
                     if s >= floor]  # fmt: skip
        assert len(tree) == len(confident)  # the root scores 0 and is always kept
        assert sorted(tree.depths.tolist()) == sorted(d for _, _, d in confident)
    else:  # only pinned (expanded) nodes may sit below the floor
        expanded = set(tree.expanded.tolist())
        assert all(i + 1 in expanded for i in torch.nonzero(below).view(-1).tolist())
    # growth: a depth is expanded only while its best node reaches the floor
    depths_grown = 1 + len(calls)
    assert len(calls) <= full_calls
    if depths_grown < shape.depth and not sample:
        assert not bool((tree.depths == depths_grown).any())  # its best node was below the floor
    if min_prob == 0.3 and not sample:
        assert depths_grown < shape.depth  # this table's paths fall below 0.3 early: the check above is exercised
    with pytest.raises(ValueError, match="tree_min_prob"):
        TreeShape(5, 3, 30, min_prob=1.0).validate(sampling=False)


def test_frontier_attends_to_its_expanded_ancestors_only():
    table, expand, calls = fake_expand()
    grow_dynamic_tree(3, table[3, 0], expand, TreeShape(4, 3, 30), sample=False)
    assert [c.attend.shape for c in calls] == [(3, 3), (3, 6), (3, 9)]
    last = calls[-1]
    # each depth-3 frontier node sees exactly 2 earlier slots (its depth-1 and depth-2 ancestors) and itself
    assert last.attend.sum(1).tolist() == [3, 3, 3]
    assert torch.equal(last.attend[:, 6:], torch.eye(3, dtype=torch.bool))


def test_sampling_pins_expanded_nodes_and_checks_budget():
    table, expand, _ = fake_expand()
    torch.manual_seed(0)
    tree = grow_dynamic_tree(3, table[3, 0], expand, TreeShape(4, 3, 9), sample=True)
    assert tree.draft_probs is not None and tree.draft_probs.shape == (1 + 3 * 3, 20)
    assert len(tree.expanded) == 1 + 3 * 3  # root + every frontier node survived the re-ranking
    with pytest.raises(ValueError, match="tree_total_tokens must be >="):
        TreeShape(4, 3, 8).validate(sampling=True)
    TreeShape(4, 3, 8).validate(sampling=False)


@pytest.mark.parametrize("sample", [False, True])
def test_growing_over_draft_vocabulary_columns_equals_growing_over_full_rows(sample):
    """A drafter with a draft vocabulary returns (R, D) rows over its ids: the tree is the one grown over the
    (R, V) rows that are -inf outside those ids (greedy), and in sampling the kept draft distributions are
    the same (R, V) probabilities."""
    ids = torch.tensor([1, 4, 5, 9, 12, 17])
    g = torch.Generator().manual_seed(1)
    table = torch.log_softmax(torch.randn(20, 8, ids.numel(), generator=g) * 2, dim=-1)  # (token, depth, D)
    full_table = torch.full((20, 8, 20), float("-inf"))
    full_table[..., ids] = table

    def grow(rows, vocab_ids=None):
        torch.manual_seed(0)
        return grow_dynamic_tree(3, rows[3, 0], lambda f: rows[f.tokens, f.depths], TreeShape(3, 3, 9), sample,
                                 vocab_ids=vocab_ids, vocab_size=20)  # fmt: skip

    draft, full = grow(table, ids), grow(full_table)
    assert set(draft.tokens[1:].tolist()) <= set(ids.tolist())
    if not sample:
        for name in ("tokens", "parents", "depths", "scores", "expanded", "candidate_tokens", "candidate_nodes"):
            assert torch.equal(getattr(draft, name), getattr(full, name)), name
    else:
        assert draft.draft_probs.shape == (len(draft.expanded), 20)
        expanded_tokens = draft.tokens[draft.expanded]
        expected = full_table[expanded_tokens, draft.depths[draft.expanded]].exp()
        torch.testing.assert_close(draft.draft_probs, expected)


def test_gumbel_top_k_draws_without_replacement_from_q():
    logq = torch.log_softmax(torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0]), dim=-1)
    q = logq.exp()
    g = torch.Generator().manual_seed(0)
    n = 20000
    tokens, values = draw_candidates(logq.expand(n, -1), 2, sample=True, generator=g)
    assert torch.all(tokens[:, 0] != tokens[:, 1])
    assert torch.allclose(values, logq[tokens])
    first = torch.bincount(tokens[:, 0], minlength=5) / n
    assert (first - q).abs().max() < 0.015
    # second draw given the first equals q without it, renormalised
    given_zero = tokens[tokens[:, 0] == 0, 1]
    rest = q.clone()
    rest[0] = 0
    rest /= rest.sum()
    assert (torch.bincount(given_zero, minlength=5) / given_zero.numel() - rest).abs().max() < 0.02
