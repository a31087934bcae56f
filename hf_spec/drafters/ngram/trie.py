"""Ranking continuations and turning them into draft tries: the acceptance model, the size cut by verification
cost, and grafting a trie into another tree."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ...shape_select import interpolate_cost
from ...tree.tree import DraftTree
from .index import Continuation, NGramIndex, continuations_with_datastore


@dataclass
class TrieNodes:
    """A draft trie below a root (not included): node i has ``tokens[i]``, parent ``parents[i]``
    (-1: the root), ``depths[i]`` >= 1 and ``counts[i]`` occurrences passing through it, in
    BFS order (parents first), ``ranks[i]`` its rank (0 = best; a child ranks below its parent).
    ``occurrences``: continuations the trie was built from."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    occurrences: int = 0
    ranks: list[int] = field(default_factory=list)
    probabilities: list[float] | None = None
    """:func:`scored_trie`'s estimated probability that the target accepts each node (None: counts only)."""

    def __len__(self) -> int:
        return len(self.tokens)

    def first(self, n: int) -> TrieNodes:
        """The trie of this one's ``n`` best nodes (ranks below ``n``; a parent ranks above its children)."""
        kept = [i for i, rank in enumerate(self.ranks) if rank < n]
        new_index = {old: new for new, old in enumerate(kept)}
        return TrieNodes(
            tokens=[self.tokens[i] for i in kept],
            parents=[new_index[self.parents[i]] if self.parents[i] >= 0 else -1 for i in kept],
            depths=[self.depths[i] for i in kept],
            counts=[self.counts[i] for i in kept],
            occurrences=self.occurrences,
            ranks=[self.ranks[i] for i in kept],
            probabilities=None if self.probabilities is None else [self.probabilities[i] for i in kept],
        )


# The acceptance model of :func:`scored_trie`. Fitted on replays of SmolLM2-135M-Instruct's greedy
# answers to 168 prompts of four data sets (benchmarks/ngram_policy/README.md): a drafted node that follows
# an occurrence matching the context's last m tokens is what the target writes next with probability about
# share * (1 - 0.7 * m ** -0.75), where share is the fraction of that match length's occurrences (through the
# parent) that continue with this token. m grows by one with every drafted token along the occurrence: an
# occurrence that has kept agreeing for longer is copied for longer.
ACCEPTANCE_SCALE, ACCEPTANCE_DECAY = 0.7, 0.75
SHORTER_MATCH_FACTOR = 0.25
"""A node that leaves its parent's longer-match continuations for a shorter match's is 4x less likely."""
CONTEXT_WEIGHT = 0.75
"""Where both the context and a datastore's corpus have occurrences of a match length, a node's share is
0.75 x its share among the context's occurrences + 0.25 x its share among the corpus's: the text being written
predicts its own continuation better than the corpus does, however often the corpus repeats a phrase."""
DATASTORE_FACTOR = 0.7
"""A node only a corpus (a datastore) continues at its match length is accepted less often than the context's own."""
MEASURED_MATCH = 32
"""How far back :func:`measure_match_lengths` compares a full-length match (a longer one counts as 32)."""


COST_MARGIN = 1.2
""":func:`relative_node_costs` prices every verified node 1.2x what this machine's measured curve says: the
acceptance model is optimistic on text it was not fitted on, and a slightly dearer node makes up for it (on
SmolLM2-135M bf16 on a 2-core Zen 4 this gives the fitted 0.035 per node; benchmarks/ngram_policy/)."""
FALLBACK_NODE_COST = 0.035
"""Per-node cost where no target can be timed (a drafting session made without one, as the replays make)."""


DEFAULT_DRAFT_NODES = DEFAULT_DRAFT_DEPTH = 16
DEFAULT_DRAFT_BRANCHES = 4
""":class:`~hf_spec.NGramDrafter`'s node budget (``num_draft_tokens``), depth (``max_depth``) and branching
(``max_branches``); the cost gate's tries take them too (its copy cycles a larger budget)."""


def relative_node_costs(verify_ms: dict[int, float], max_nodes: int, margin: float = COST_MARGIN) -> list[float]:
    """``[cost of a cycle verifying n draft nodes / cost of a one-token step for n in 0..max_nodes]`` from a
    verification cost curve ``{tokens: ms}`` (:meth:`hf_spec.verify_cost.VerifyCosts.curve`; n draft nodes and
    the root are n + 1 tokens), the increase over one token scaled by ``margin``: what :func:`scored_trie`'s size
    cut weighs expected accepted tokens against. Flat where verifying more tokens is almost free (a GPU, a CPU with
    AMX), so the trees grow there; steeper on CPUs without AMX."""
    one = interpolate_cost(verify_ms, 1)
    return [1.0 + margin * (interpolate_cost(verify_ms, n + 1) - one) / one for n in range(max_nodes + 1)]


def match_acceptance(matched: int) -> float:
    """Estimated probability that the target continues as an occurrence that has matched the context's last
    ``matched`` tokens does: 1 - 0.7 * matched ** -0.75 (0.30 at 1 token, 0.75 at 4, 0.87 at 9, 0.95 at 32)."""
    return 1.0 - ACCEPTANCE_SCALE * matched**-ACCEPTANCE_DECAY


def measure_match_lengths(index: NGramIndex, continuations: list[Continuation], cap: int = MEASURED_MATCH) -> list[Continuation]:
    """``continuations`` (modified) with each context occurrence that matched the whole ``max_match`` suffix
    given its real match length, up to ``cap`` tokens (compared backwards: at most ``cap`` comparisons each),
    re-ordered longest match first (the order is otherwise kept). Looking up only ``max_match``-grams keeps the
    index small; telling a 30-token match from a 4-token one is what says the text is being copied."""
    tokens, length, full = index.tokens, len(index.tokens), index.max_match
    longer = False
    for cont in continuations:
        if cont.position >= 0 and cont.match_length == full:
            n, pos = full, cont.position
            while n < cap and pos - n - 1 >= 0 and tokens[pos - n - 1] == tokens[length - n - 1]:
                n += 1
            cont.match_length, longer = n, longer or n > full
    if longer:
        continuations.sort(key=lambda c: -c.match_length)
    return continuations


def ranked_continuations(index: NGramIndex, datastore, max_depth: int, max_occurrences: int) -> list[Continuation]:
    """This cycle's continuations as :func:`scored_trie` takes them, for :class:`~hf_spec.NGramDrafter` and the hybrids' branches
    alike: :func:`continuations_with_datastore` (``datastore`` None: the context's alone), full-length context matches
    measured (:func:`measure_match_lengths`), longest match first."""
    found = list(continuations_with_datastore(index, datastore, max_depth, max_occurrences))
    return measure_match_lengths(index, found)


def scored_trie(continuations, num_nodes: int, max_depth: int, max_branches: int,
                node_cost: float | Sequence[float] = 0.0) -> TrieNodes:  # fmt: skip
    """The draft trie of ``continuations`` (longest match first) ranked by estimated acceptance probability.

    Every node u of the full trie (``max_depth`` deep) gets q(u) = share * :func:`match_acceptance` (L + depth - 1),
    L being the longest match length through u and share the fraction of L's occurrences through u's parent
    that go on to u (occurrences whose continuation stops at the parent, where the text ends, do not count;
    with a corpus: ``CONTEXT_WEIGHT``'s mixture of the context's and the corpus's shares, or the corpus's x
    ``DATASTORE_FACTOR`` where the context has no such occurrence), x ``SHORTER_MATCH_FACTOR`` when
    continuations that matched longer go on below the parent elsewhere; its probability of being accepted is
    the product of q along its path. The best ``num_nodes`` nodes (at most ``max_branches`` children per node;
    ties: shallower, then more recent) are taken best first; with a ``node_cost`` only the first n of them are
    kept, n maximizing (1 + expected accepted tokens) / cost(n), cost(n) being what a cycle verifying n draft
    nodes costs relative to a one-token decoding step: 1 + c * n for a number c (0: no cut), ``node_cost[n]`` for
    a sequence (:func:`relative_node_costs`; its last value past its end). So a cycle drafts deep where the text
    is being copied and little or nothing where no occurrence is likely to be followed."""
    # Best first: a node's probability is at most its parent's, so only the children of kept nodes are scored (a
    # heap of candidates), each from the continuations through its parent, never the whole trie.
    conts = list(continuations)
    paths = [c.tokens[:max_depth] for c in conts]
    token_of, parent_of, depth_of, probability, members = [], [], [], [], []
    heap: list[tuple[float, int, int, int, int]] = []  # (-probability, depth, -recency, first continuation, node)

    def push_children(parent: int, through: list[int], depth: int, parent_probability: float) -> None:
        """Score the children of ``parent`` (-1: the root) at ``depth`` + 1, from the continuations ``through`` it."""
        going_on: dict[tuple[int, int], int] = {}  # (match length, source) -> continuations going on below parent
        groups: dict[int, list[int]] = {}
        for c in through:
            if depth < len(paths[c]) or parent < 0:
                length = conts[c].match_length
                if conts[c].position >= 0:
                    going_on[(length, 0)] = going_on.get((length, 0), 0) + 1
                going_on[(length, 1)] = going_on.get((length, 1), 0) + 1
            if depth < len(paths[c]):
                groups.setdefault(paths[c][depth], []).append(c)
        longest = max((n for n, _ in going_on), default=0)  # the longest match length going on below parent
        for token, group in groups.items():
            first = conts[group[0]]  # continuations come longest match first: the child's match length
            length = first.match_length
            context, everything = going_on.get((length, 0), 0), going_on[(length, 1)]
            in_context = sum(1 for c in group if conts[c].match_length == length and conts[c].position >= 0)
            corpus = everything - context
            if not corpus:
                share = in_context / context
            else:
                of_length = sum(1 for c in group if conts[c].match_length == length)
                corpus_share = (of_length - in_context) / corpus
                share = (corpus_share * DATASTORE_FACTOR if not context
                         else CONTEXT_WEIGHT * in_context / context + (1 - CONTEXT_WEIGHT) * corpus_share)  # fmt: skip
            q = share * match_acceptance(length + depth)
            if length < longest:
                q *= SHORTER_MATCH_FACTOR
            node = len(token_of)
            token_of.append(token), parent_of.append(parent), depth_of.append(depth + 1), members.append(group)
            probability.append(q * parent_probability)
            heapq.heappush(heap, (-probability[node], depth + 1, -first.position, group[0], node))

    push_children(-1, list(range(len(conts))), 0, 1.0)
    kept: list[int] = []
    branches: dict[int, int] = {}
    while heap and len(kept) < num_nodes:
        i = heapq.heappop(heap)[4]
        parent = parent_of[i]
        if branches.get(parent, 0) >= max_branches:
            continue
        kept.append(i)
        branches[parent] = branches.get(parent, 0) + 1
        if depth_of[i] < max_depth:
            push_children(i, members[i], depth_of[i], probability[i])
    if not isinstance(node_cost, (int, float)) or node_cost > 0:
        kept = kept[:best_size([probability[i] for i in kept], node_cost)]
    rank = {node: r for r, node in enumerate(kept)}
    bfs = sorted(kept, key=lambda i: (depth_of[i], rank[i]))
    new_index = {old: new for new, old in enumerate(bfs)}
    return TrieNodes(
        tokens=[token_of[i] for i in bfs],
        parents=[new_index[parent_of[i]] if parent_of[i] >= 0 else -1 for i in bfs],
        depths=[depth_of[i] for i in bfs],
        counts=[len(members[i]) for i in bfs],
        occurrences=len(conts),
        ranks=[rank[i] for i in bfs],
        probabilities=[probability[i] for i in bfs],
    )


def best_size(probabilities: Sequence[float], node_cost: float | Sequence[float]) -> int:
    """How many of a trie's best-first nodes (their estimated acceptance ``probabilities``) to keep: the n that
    maximizes (1 + the first n probabilities' sum) / cost(n), cost(n) being 1 + c * n for a number c,
    ``node_cost[n]`` for a sequence (its last value past its end)."""
    if isinstance(node_cost, (int, float)):
        cost = [1.0 + node_cost * n for n in range(len(probabilities) + 1)]
    else:
        cost = list(node_cost) + [node_cost[-1]] * max(len(probabilities) + 1 - len(node_cost), 0)
    best, size, gain = 1.0 / cost[0], 0, 1.0
    for n, p in enumerate(probabilities, start=1):
        gain += p
        if gain / cost[n] > best:
            best, size = gain / cost[n], n
    return size


def trie_to_draft_tree(root_token: int, trie: TrieNodes, device=None) -> DraftTree:
    """The :class:`DraftTree` of ``trie`` under ``root_token``, with point-mass candidates
    (``draft_probs = None``); scores are log empirical frequencies of the paths."""
    n = len(trie)
    tokens = torch.tensor([root_token, *trie.tokens], dtype=torch.long, device=device)
    parents = torch.tensor([-1, *(p + 1 for p in trie.parents)], dtype=torch.long, device=device)
    depths = torch.tensor([0, *trie.depths], dtype=torch.long, device=device)
    occurrences = max(trie.occurrences, 1)
    weights = trie.probabilities if trie.probabilities is not None else [c / occurrences for c in trie.counts]
    scores = torch.tensor([0.0, *weights], dtype=torch.float32, device=device).log()
    kids: dict[int, list[int]] = {}
    for child in range(1, n + 1):
        kids.setdefault(int(parents[child]), []).append(child)
    expanded = sorted(kids)
    width = max((len(v) for v in kids.values()), default=1)
    candidate_nodes = torch.full((len(expanded), width), -1, dtype=torch.long)
    for row, node in enumerate(expanded):
        candidate_nodes[row, : len(kids[node])] = torch.tensor(kids[node])
    candidate_nodes = candidate_nodes.to(device)
    candidate_tokens = torch.where(candidate_nodes >= 0, tokens[candidate_nodes.clamp(min=0)], -1)
    return DraftTree(tokens=tokens, parents=parents, depths=depths, scores=scores,
                     expanded=torch.tensor(expanded, dtype=torch.long, device=device),
                     candidate_tokens=candidate_tokens, candidate_nodes=candidate_nodes, draft_probs=None)  # fmt: skip


def graft_trie(tree: DraftTree, trie: TrieNodes, max_new: int | None = None) -> DraftTree:
    """``tree`` (a trained drafter's) with the branches of ``trie`` grafted under its root.

    Trie nodes are taken best rank first (parents before children). A trie token that equals
    an existing child is followed, not duplicated; any other becomes a new node (parent,
    depth, its nearest drafted ancestor's score), at most ``max_new`` of them (None: all).
    At every tree node u under a kept trie node, the tokens of u's kept trie children lead
    u's candidate row as point-mass drafts (``num_point_mass``), shared or new node alike,
    then u's drafter candidates as before; nodes without a row get one. The result is
    renumbered in BFS order; ``from_ngram`` marks the new nodes. One host read of the tree.
    """
    device = tree.tokens.device
    n, m, k = len(tree), tree.expanded.shape[0], tree.candidate_tokens.shape[1]
    flat = torch.cat([tree.tokens, tree.parents, tree.depths, tree.expanded,
                      tree.candidate_tokens.reshape(-1), tree.candidate_nodes.reshape(-1)]).tolist()  # fmt: skip
    tokens, parents, depths = flat[:n], flat[n : 2 * n], flat[2 * n : 3 * n]
    old_expanded = flat[3 * n : 3 * n + m]
    cand = flat[3 * n + m :]
    old_tokens = [cand[r * k : (r + 1) * k] for r in range(m)]
    old_nodes = [cand[(m + r) * k : (m + r + 1) * k] for r in range(m)]
    reachable = set(cand[m * k :])  # nodes a candidate row leads to (-1 included, never a child)
    kids: list[dict[int, int]] = [{} for _ in range(n)]
    for child in range(1, n):
        if child in reachable:  # an unreachable node (drafted with probability 0) is never followed
            kids[parents[child]].setdefault(tokens[child], child)
    score_from = list(range(n))  # the drafted node whose score a node takes
    mapped, point_mass, added = {-1: 0}, {}, 0
    order = sorted(range(len(trie)), key=trie.ranks.__getitem__) if trie.ranks else range(len(trie))
    for i in order:
        parent = mapped.get(trie.parents[i])
        if parent is None:
            continue
        token = trie.tokens[i]
        node = kids[parent].get(token)
        if node is None:
            if max_new is not None and added >= max_new:
                continue
            node, added = len(tokens), added + 1
            tokens.append(token), parents.append(parent), depths.append(depths[parent] + 1)
            score_from.append(score_from[parent]), kids.append({})
            kids[parent][token] = node
        mapped[i] = node
        point_mass.setdefault(parent, []).append(node)
    if not point_mass:
        return tree
    slot = {node: s for s, node in enumerate(old_expanded)}
    expanded = old_expanded + sorted(v for v in point_mass if v not in slot)
    rows_tokens, rows_nodes = [], []
    for s, v in enumerate(expanded):
        pm = point_mass.get(v, [])
        rows_tokens.append([tokens[c] for c in pm] + (old_tokens[s] if s < m else []))
        rows_nodes.append(pm + (old_nodes[s] if s < m else []))
    width = max(len(row) for row in rows_tokens)
    total = len(tokens)
    bfs = sorted(range(total), key=lambda i: (depths[i], i))
    new_index = [0] * total
    for new, old in enumerate(bfs):
        new_index[old] = new

    def remap(nodes):
        return [new_index[v] if v >= 0 else -1 for v in nodes] + [-1] * (width - len(nodes))

    def tensor(values, dtype=torch.long):
        return torch.tensor(values, dtype=dtype, device=device)

    draft_probs = tree.draft_probs
    if draft_probs is not None and len(expanded) > m:
        draft_probs = torch.cat([draft_probs, draft_probs.new_zeros(len(expanded) - m, draft_probs.shape[1])])
    return DraftTree(
        tokens=tensor([tokens[i] for i in bfs]),
        parents=tensor([new_index[parents[i]] if parents[i] >= 0 else -1 for i in bfs]),
        depths=tensor([depths[i] for i in bfs]),
        scores=tree.scores[tensor([score_from[i] for i in bfs])],
        expanded=tensor([new_index[v] if v >= 0 else -1 for v in expanded]),
        candidate_tokens=tensor([row + [-1] * (width - len(row)) for row in rows_tokens]),
        candidate_nodes=tensor([remap(row) for row in rows_nodes]),
        draft_probs=draft_probs,
        num_point_mass=tensor([len(point_mass.get(v, [])) for v in expanded]),
        from_ngram=torch.tensor([i >= n for i in bfs], dtype=torch.bool),
    )


def copy_budget(first: Continuation | None, max_match: int, copy_nodes: int) -> int:
    """Nodes to draft if the best continuation ``first`` makes this a copy cycle, else 0: it is in the context and
    its match covers the whole ``max_match``-token suffix (``copy_nodes``; 0: no copy cycles)."""
    if first is None or first.position < 0 or first.match_length < max_match:
        return 0
    return copy_nodes

