"""Context n-gram drafting without weights: draft TREES of continuations from the text so far.

transformers' prompt lookup drafts one continuation of the longest matching n-gram. Since
hf-spec verifies a whole tree in one target forward, :class:`NGramDrafter` drafts several:
every earlier occurrence of the context's suffix contributes the tokens that followed it,
and the distinct continuations are merged into a trie (shared prefixes become one branch).

Per generation, a session keeps an incremental hashed n-gram index
(:class:`NGramIndex`: for each n in [min_match, max_match], n-gram tuple -> positions of the
token that followed it) over prompt + generated tokens; each cycle adds the newly committed
tokens in O(new tokens x max_match) dict updates, never rebuilding. Drafting a tree scans at
most ``max_occurrences`` occurrences per match length, each for at most ``max_depth``
tokens, so a cycle's cost does not grow with the context.

Ranking (:func:`ranked_continuations`, :func:`scored_trie`): occurrences of
the longest matching suffix come first; an occurrence that matches the whole ``max_match`` suffix has its real
match length measured (up to 32 tokens back), so a passage being copied outranks a common 4-gram. Every trie
node gets an estimated probability that the target accepts it (:func:`match_acceptance`: the longer an
occurrence has matched, the likelier the target keeps following it; split between occurrences that disagree;
the context weighs more than a datastore's corpus), the product along its path; nodes are taken best first (at
most ``max_branches`` children per node, ``max_depth`` deep, ``num_draft_tokens`` nodes) and, with
``node_cost`` > 0, the tree keeps only as many as pay for their verification: deep chains where text is being
copied, the root alone where no occurrence is likely to be followed (the cycle is then one plain decoding
step). The model, its fit and what it gained over count-ranked, fixed-size trees:
benchmarks/ngram_policy/README.md. These functions take plain token lists, not a session, so the same
trie can be grafted into a trained drafter's tree (:class:`NGramBranches`, without the size cut: the hybrid's
budgets decide there).

Why sampling stays exact. The tree is a deterministic function of the committed text, so
every candidate c_i of an expanded node u is a point-mass draft: q_i = delta(c_i). Trees
carry ``draft_probs = None`` for that, and :func:`hf_spec.verify.verify_tree` then accepts c_i
with probability p_i(c_i) and on rejection continues with p_{i+1} = p_i with c_i removed and
renormalised; the last step samples the residual. Step i emits c_i with probability
p_i(c_i) and, otherwise, a draw from p_{i+1}; so by induction over the candidates, each token
x is emitted with probability p_u(x) (x = c_i: prod_{j<i}(1 - p_j(c_j)) p_i(c_i) = p_u(c_i),
as p_i = p_u / (1 - sum_{j<i} p_u(c_j))). Whether u is in the tree and expanded depends on
the committed text only, never on the verifier's draws, so conditioning on reaching u keeps
this law: every emitted token follows the target's distribution exactly.
"""

from __future__ import annotations

import copy
import heapq
import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ... import timing
from ...shape_select import interpolate_cost
from ...tree.dynamic import TreeShape
from ...tree.tree import DraftTree
from ..base import SpecDrafterConfig, SpecDrafterModel
from ..session import DraftingSession, check_ngram_branches


class NGramIndex:
    """Incremental hashed n-gram index of a growing token list.

    ``tables[n][ngram]`` lists, oldest first, the positions p with ``tokens[p-n:p] == ngram``
    (p is where the continuation starts). ``operations`` counts index updates (one per
    appended token and n), for tests that the cost per token is flat.
    """

    def __init__(self, min_match: int, max_match: int):
        if not 1 <= min_match <= max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got min_match={min_match}, max_match={max_match}.")
        self.min_match, self.max_match = min_match, max_match
        self.tokens: list[int] = []
        self.tables: dict[int, dict[tuple, list[int]]] = {n: {} for n in range(min_match, max_match + 1)}
        self.operations = 0

    def extend(self, new_tokens) -> None:
        """Append tokens; each one becomes the known follower of the n-grams just before it."""
        tokens = self.tokens
        for token in new_tokens:
            pos = len(tokens)
            for n, table in self.tables.items():
                if pos < n:
                    break
                key = tuple(tokens[pos - n : pos])
                positions = table.get(key)
                if positions is None:
                    table[key] = [pos]
                else:
                    positions.append(pos)
                self.operations += 1
            tokens.append(int(token))

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class Continuation:
    """The ``tokens`` that followed an earlier occurrence of the context's suffix.

    ``match_length``: how many suffix tokens matched there; ``position``: where the
    continuation starts in the context (larger = more recent).
    """

    tokens: list[int]
    match_length: int
    position: int


def find_continuations(index: NGramIndex, max_depth: int, max_occurrences: int):
    """Yield the continuations of the index's whole token list, longest match first, then most
    recent first (lazily: a consumer that has enough stops the scan).

    Scans each match length n from ``max_match`` down to ``min_match``, at most
    ``max_occurrences`` new occurrences per n (a position found with a longer match is not
    yielded again), each continuation at most ``max_depth`` tokens.
    """
    tokens = index.tokens
    length = len(tokens)
    seen: set[int] = set()
    for n in range(min(index.max_match, length), index.min_match - 1, -1):
        positions = index.tables[n].get(tuple(tokens[length - n :]))
        if not positions:
            continue
        taken = 0
        for pos in reversed(positions):
            if taken >= max_occurrences:
                break
            if pos in seen:
                continue
            seen.add(pos)
            taken += 1
            yield Continuation(tokens[pos : pos + max_depth], n, pos)


def continuations_with_datastore(index: NGramIndex, datastore, max_depth: int, max_occurrences: int):
    """:func:`find_continuations` of the context merged with a :class:`~hf_spec.drafters.datastore.NGramDatastore`'s
    corpus continuations of the same suffix (None: the context's alone). Per match length, longest first,
    the context's occurrences come before the corpus's; corpus occurrences rank as older than any context one
    (position -1). Drafted tokens stay a deterministic function of the committed text (point-mass drafts)."""
    context = find_continuations(index, max_depth, max_occurrences)
    if datastore is None:
        yield from context
        return
    context = list(context)
    stored = [Continuation(tokens, n, -1) for tokens, n in datastore.continuations(index.tokens, max_depth, max_occurrences)]
    for n in sorted({c.match_length for c in context} | {c.match_length for c in stored}, reverse=True):
        yield from (c for c in context if c.match_length == n)
        yield from (c for c in stored if c.match_length == n)


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
""":class:`NGramDrafter`'s node budget (``num_draft_tokens``), depth (``max_depth``) and branching
(``max_branches``); the cost gate's tries take them too (its copy cycles a larger budget)."""


def relative_node_costs(verify_ms: dict[int, float], max_nodes: int, margin: float = COST_MARGIN) -> list[float]:
    """``[cost of a cycle verifying n draft nodes / cost of a one-token step for n in 0..max_nodes]`` from a
    verification cost curve ``{tokens: ms}`` (:func:`hf_spec.verify_cost.verify_cost_curve`; n draft nodes and
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
    """This cycle's continuations as :func:`scored_trie` takes them, for :class:`NGramDrafter` and the hybrids' branches
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
    kids: list[dict[int, int]] = [{} for _ in range(n)]
    for child in range(1, n):
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
        expanded=tensor([new_index[v] for v in expanded]),
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


@dataclass
class _Tally:
    """A running sum and count (a mean with ``prior`` weighted as ``weight`` observations)."""

    total: float = 0.0
    count: float = 0.0

    def add(self, value: float) -> None:
        self.total += value
        self.count += 1

    def mean(self, prior: float = 0.0, weight: float = 0.0) -> float:
        return (self.total + prior * weight) / (self.count + weight) if self.count + weight else prior

    def capped(self, count: float) -> _Tally:
        """The same mean weighted as at most ``count`` observations."""
        scale = min(1.0, count / self.count) if self.count else 1.0
        return _Tally(self.total * scale, self.count * scale)


@dataclass
class _CopyTrial:
    """A copy cycle's trie as a counterfactual: its (parent, token) -> (child, rank) map, how many of its best
    nodes the smaller budget keeps, both versions' relative costs, and the text committed since."""

    children: dict[tuple[int, int], tuple[int, int]]
    small_nodes: int
    big_cost: float
    small_cost: float
    text: list[int] = field(default_factory=list)

    def outcome(self) -> tuple[int, int] | None:
        """Tokens the whole trie and its ``small_nodes`` best would have committed (1 + their longest path that
        the committed text follows), or None while the text may still follow a path further."""
        node, big, small, on_small = -1, 0, 0, True
        for token in self.text:
            child = self.children.get((node, token))
            if child is None:
                return 1 + big, 1 + small
            node, big = child[0], big + 1
            on_small = on_small and child[1] < self.small_nodes
            small += on_small
        return None


@dataclass
class _Rate:
    """Tokens committed for a cost, over some cycles."""

    tokens: float = 0.0
    cost: float = 0.0
    cycles: int = 0

    def add(self, tokens: float, cost: float) -> None:
        self.tokens, self.cost, self.cycles = self.tokens + tokens, self.cost + cost, self.cycles + 1


class CycleGate:
    """Per-cycle choice of a hybrid drafter (``ngram_cost_gate``): the n-gram trie alone, or the drafter's tree
    with that trie grafted in.

    The n-gram trie, cut as :class:`NGramDrafter` cuts it, is expected to commit ``expected`` tokens (1 + its
    nodes' estimated acceptance probabilities) for the cost of verifying its n nodes. Running the drafter as well
    adds ``gain`` tokens, for the cost of its forwards and its m more nodes. Both are measured in this generation,
    separately for each *bucket* of ``expected`` (:attr:`BUCKET_EDGES`): where the trie expects little, the
    drafter adds most; on a copied passage it adds almost nothing (measured on SmolLM2: +0.6-1.1 tokens a cycle
    below 2 expected, +0.1-0.2 above 3). The gain of a drafted cycle is exact in greedy decoding: the committed
    tokens minus what the trie alone would have committed (1 + the longest prefix of the committed tokens that is a
    path of the trie, which was grafted whole into the verified tree); the same count estimates it when sampling.
    The trie's own outcomes (drafted cycles' counterfactuals, n-gram cycles' commits) correct ``expected`` per
    bucket too. Costs are relative to a one-token step on this machine (:func:`relative_node_costs` of the
    target's measured verification curve; drafting time as measured in this generation, host work included).

    The drafter runs when (expected + bias + gain) / (cost(n + m) + drafting) beats (expected + bias) / cost(n):
    where nothing matches it drafts; on a copied passage the trie alone goes to verification. A function of the
    committed text and of earlier cycles only, never of this cycle's verification: sampling stays exact.

    It also sizes *copy cycles* (:meth:`copy_trie`): a trie of up to the copy budget (``ngram_copy_nodes``) is
    verified only while, on this generation's earlier copy cycles, the whole trie would have committed more
    tokens per unit of cost than its best :data:`DEFAULT_DRAFT_NODES` nodes (each counted exactly in greedy
    decoding once the text has gone past it; not carried over: how far a text copies is its own); a copied passage
    of code goes on deep, a restated sentence that soon departs from its source stops where :class:`NGramDrafter`
    does."""

    PRIOR_CYCLES = 4
    """Each bucket's gain starts from the mean over all buckets (at first ``prior_gain``) weighted as this many
    drafted cycles, and its bias from 0 weighted as this many cycles."""
    BUCKET_EDGES = (1.25, 1.75, 2.5, 4.0)
    """Upper edges of the ``expected``-token buckets (the last bucket is open-ended)."""
    MIN_COPY_TRIALS = 2
    """Copy cycles verify their whole trie until this many have been counted."""
    MEMORY_CYCLES = 200
    """A gate carried over to the drafter's next call (:meth:`carried_over`) weighs each bucket's past as at most
    this many cycles (and the drafting time as at most this many drafted cycles), so it keeps adapting."""

    def __init__(self, verify_ms: dict[int, float], max_nodes: int, prior_gain: float = 1.0):
        self.node_costs = relative_node_costs(verify_ms, max_nodes)
        self._cost_curve = dict(enumerate(self.node_costs))  # relative cost by node count, for interpolate_cost
        self.step_ms = interpolate_cost(verify_ms, 1)
        self.prior_gain = prior_gain
        buckets = len(self.BUCKET_EDGES) + 1
        self._gain = [_Tally() for _ in range(buckets)]
        """Per bucket: tokens the drafter added on drafted cycles."""
        self._bias = [_Tally() for _ in range(buckets)]
        """Per bucket: what the trie alone committed (or would have) minus what it was expected to."""
        self._drafter_nodes, self._draft_ms = _Tally(), _Tally()
        self._pending: tuple[float, dict[tuple[int, int], int] | None] | None = None
        """The last cycle's trie: its expected tokens and, after a drafted cycle, its (parent, token) -> child map."""
        self._copy_trials: list[_CopyTrial] = []
        """Copy cycles whose counterfactuals wait for the text to go past them."""
        self._copy_big, self._copy_small = _Rate(), _Rate()
        """What copy cycles' whole tries, and their best :data:`DEFAULT_DRAFT_NODES` nodes, would have committed."""

    def _cost(self, nodes: float) -> float:
        """Relative cost of verifying ``nodes`` (a mean, so fractional) nodes; past ``max_nodes`` extended linearly."""
        return interpolate_cost(self._cost_curve, nodes)

    def carried_over(self) -> CycleGate:
        """This gate's statistics for the drafter's next call with the same target (nothing pending), each
        weighted as at most :attr:`MEMORY_CYCLES` cycles. The choice stays a function of earlier cycles only:
        sampling stays exact."""
        gate = copy.copy(self)
        gate._pending = None
        gate._gain = [tally.capped(self.MEMORY_CYCLES) for tally in self._gain]
        gate._bias = [tally.capped(self.MEMORY_CYCLES) for tally in self._bias]
        gate._drafter_nodes = self._drafter_nodes.capped(self.MEMORY_CYCLES)
        gate._draft_ms = self._draft_ms.capped(self.MEMORY_CYCLES)
        gate._copy_trials, gate._copy_big, gate._copy_small = [], _Rate(), _Rate()  # how far a text copies is its own
        return gate

    def bucket(self, expected_tokens: float) -> int:
        """The bucket of a trie that expects ``expected_tokens``."""
        return sum(expected_tokens >= edge for edge in self.BUCKET_EDGES)

    def gain(self, expected_tokens: float) -> float:
        """Tokens the drafter is expected to add to a trie that expects ``expected_tokens``."""
        overall = _Tally(sum(t.total for t in self._gain), sum(t.count for t in self._gain))
        prior = overall.mean(self.prior_gain, self.PRIOR_CYCLES)
        return self._gain[self.bucket(expected_tokens)].mean(prior, self.PRIOR_CYCLES)

    def trie_tokens(self, expected_tokens: float) -> float:
        """Tokens the trie alone is expected to commit: ``expected_tokens`` corrected by its bucket's outcomes."""
        return max(1.0, expected_tokens + self._bias[self.bucket(expected_tokens)].mean(0.0, self.PRIOR_CYCLES))

    def prefers_ngram(self, expected_tokens: float, nodes: int) -> bool:
        """Whether the n-gram trie alone (``nodes`` nodes, ``expected_tokens``) beats drafting as well. Until a
        drafted cycle has been timed, the drafter runs."""
        if not self._draft_ms.count:
            return False
        alone = self.trie_tokens(expected_tokens)
        drafted_cost = self._cost(nodes + self._drafter_nodes.mean()) + self._draft_ms.mean() / self.step_ms
        return alone / self._cost(nodes) >= (alone + self.gain(expected_tokens)) / drafted_cost

    def record_ngram(self, expected_tokens: float) -> None:
        """A cycle that verified the trie alone (``expected_tokens``); its commit calibrates the bucket."""
        self._pending = (expected_tokens, None)

    def record_drafted(self, drafter_nodes: int, draft_ms: float | None, expected_tokens: float,
                       trie: DraftTree) -> None:  # fmt: skip
        """A drafted cycle: the drafter's own nodes (root and grafted n-gram nodes excluded), its drafting time
        (None: not a cycle's cost, e.g. the first cycle, whose drafter reads the whole prompt), and the trie it
        weighed (grafted whole), with what that trie was expected to commit."""
        self._drafter_nodes.add(drafter_nodes)
        if draft_ms is not None:
            self._draft_ms.add(draft_ms)
        tokens, parents = trie.tokens.tolist(), trie.parents.tolist()
        children = {(parents[i], tokens[i]): i for i in range(1, len(tokens))}
        self._pending = (expected_tokens, children)

    def copy_trie(self, trie: TrieNodes, nodes: int = DEFAULT_DRAFT_NODES) -> TrieNodes:
        """What a copy cycle verifies of ``trie`` (cut to this gate's costs, up to the copy budget): all of it,
        or, once earlier copy cycles say the nodes past the best ``nodes`` did not pay for themselves, those best
        ``nodes`` cut again to the costs. Either way the trie is kept as a counterfactual (:class:`_CopyTrial`)."""
        if len(trie) <= nodes:  # both budgets keep the same nodes
            return trie
        order = sorted(range(len(trie)), key=trie.ranks.__getitem__)
        small = best_size([trie.probabilities[i] for i in order[:nodes]], self.node_costs)
        children = {(trie.parents[i], trie.tokens[i]): (i, trie.ranks[i]) for i in range(len(trie))}
        self._copy_trials.append(_CopyTrial(children, small, self._cost(len(trie)), self._cost(small)))
        big, cut = self._copy_big, self._copy_small
        if big.cycles < self.MIN_COPY_TRIALS or big.tokens * cut.cost >= cut.tokens * big.cost:
            return trie
        return trie.first(small)

    def _record_copy_outcomes(self, tokens: Sequence[int]) -> None:
        waiting = []
        for trial in self._copy_trials:
            trial.text.extend(tokens)
            outcome = trial.outcome()
            if outcome is None:
                waiting.append(trial)
            else:
                self._copy_big.add(outcome[0], trial.big_cost)
                self._copy_small.add(outcome[1], trial.small_cost)
        self._copy_trials = waiting

    def record_committed(self, tokens: Sequence[int]) -> None:
        """The tokens the last cycle committed (accepted + the target's own), after :meth:`record_ngram` or
        :meth:`record_drafted`."""
        if self._copy_trials:
            self._record_copy_outcomes(tokens)
        if self._pending is None:
            return
        expected, children = self._pending
        self._pending = None
        bucket = self.bucket(expected)
        if children is None:
            alone = len(tokens)
        else:
            node, matched = 0, 0
            for token in tokens:
                node = children.get((node, token))
                if node is None:
                    break
                matched += 1
            alone = matched + 1
            self._gain[bucket].add(len(tokens) - alone)
        self._bias[bucket].add(alone - expected)


class NGramBranches:
    """Context n-gram branches for a trained drafter's trees (the ``ngram_branches`` option).

    Keeps the :class:`NGramIndex` of prompt + committed tokens (:meth:`extend`, fed the same
    committed tokens as the drafter) and grafts continuation tries into each tree
    (:meth:`graft`); with a ``datastore`` (the drafter's ``ngram_datastore``) the tries also hold
    the corpus's continuations of the same suffix. Greedy: up to ``branches`` NEW nodes, taken from a trie big enough that
    nodes shared with the drafter's tree cost nothing. Sampling: the trie of ``branches``
    nodes alone, grafted whole (so at most ``branches`` new nodes too): it then depends on the
    committed text only, never on the drafter's draws, which is what keeps the mixed
    point-mass/sampled rejection sampling of :mod:`hf_spec.verify` exact.
    """

    def __init__(self, prompt_ids: torch.Tensor, max_match: int = 4, min_match: int = 1, max_occurrences: int = 16,
                 datastore=None, copy_nodes: int = 0):  # fmt: skip
        self.max_occurrences = max_occurrences
        self.datastore = datastore
        self.copy_nodes = copy_nodes
        """The copy-cycle budget of :func:`copy_budget`: the hybrid's ``ngram_copy_nodes``."""
        self.index = NGramIndex(min_match, max_match)
        self.index.extend(prompt_ids[0, :1].tolist())
        self._scanned: tuple[int, int, list[Continuation]] | None = None
        """The last scan: the text's length, the depth scanned, the continuations."""

    def extend(self, next_tokens: torch.Tensor) -> list[int]:
        """Index newly committed tokens (one host read); returns them as a list."""
        tokens = next_tokens.tolist()
        self.index.extend(tokens)
        return tokens

    def continuations(self, depth: int):
        """An iterator over this cycle's continuations (:func:`ranked_continuations`, at least ``depth`` tokens
        each where the text goes on), scanned once per cycle however many budgets and tries read them (a trie
        reads a continuation's first ``max_depth`` tokens only, so a deeper scan serves a shallower trie)."""
        length = len(self.index.tokens)
        if self._scanned is None or self._scanned[0] != length or self._scanned[1] < depth:
            self._scanned = (length, depth, ranked_continuations(self.index, self.datastore, depth, self.max_occurrences))
        return iter(self._scanned[2])

    def copy_budget(self, depth: int) -> int:
        """Nodes to draft on this cycle if it is a copy, else 0. A copy: the context repeats its whole
        ``max_match``-token suffix (the answer is copying earlier text; ``copy_nodes``; :func:`copy_budget`).
        A function of the committed text only."""
        return self._copy_budget(next(self.continuations(depth), None))

    def _copy_budget(self, first: Continuation | None) -> int:
        return copy_budget(first, self.index.max_match, self.copy_nodes)

    def sized_trie(self, num_nodes: int, depth: int, node_cost: float | Sequence[float],
                   max_branches: int = DEFAULT_DRAFT_BRANCHES) -> TrieNodes:  # fmt: skip
        """This cycle's trie of up to ``num_nodes`` nodes to ``depth``, ``max_branches`` per node, cut by
        ``node_cost`` as :class:`NGramDrafter` cuts its trees (:func:`scored_trie`)."""
        return scored_trie(self.continuations(depth), num_nodes, depth, max_branches, node_cost)

    @staticmethod
    def trie_tree(root_token: int, trie: TrieNodes, device=None) -> tuple[DraftTree, float]:
        """``trie`` under ``root_token`` as a draft tree of n-gram nodes only, and the tokens such a cycle is
        expected to commit: 1 + the expected number of accepted nodes."""
        tree = trie_to_draft_tree(root_token, trie, device=device)
        tree.from_ngram = torch.arange(len(tree)) > 0
        return tree, 1.0 + sum(trie.probabilities)

    def graft(self, tree: DraftTree, shape: TreeShape, branches: int, sample: bool, depth: int | None = None) -> DraftTree:
        """``tree`` with up to ``branches`` n-gram nodes grafted (``shape``: branching, and depth unless
        ``depth`` reaches deeper); on a copy cycle (:meth:`copy_budget`) up to the copy budget if larger. The
        budget depends on the committed text only."""
        if branches <= 0:
            return tree
        depth = max(shape.depth, depth or 0)
        continuations = self.continuations(depth)
        first = next(continuations, None)
        if first is None:
            return tree
        branches = max(branches, self._copy_budget(first))
        num_nodes = branches if sample else branches + len(tree) - 1
        trie = scored_trie(itertools.chain([first], continuations), num_nodes, depth, shape.top_k)
        return graft_trie(tree, trie, max_new=None if sample else branches)


class NGramDrafterConfig(SpecDrafterConfig):
    """Config of :class:`NGramDrafter` (no target fields: it serves any target).

    Args:
        max_match: longest context suffix looked up (default 4).
        min_match: shortest suffix that counts as a match (default 1; 2 drafts less on
            unrelated text).
        num_draft_tokens: most draft nodes per tree, root excluded (``tree_total_tokens``; default 16); with
            ``node_cost`` a cycle drafts fewer where they are unlikely to be accepted.
        max_depth: deepest draft node (``tree_depth``; default 16).
        max_branches: most children per node (``tree_top_k``; default 4; 1 gives a single
            chain, like prompt lookup).
        max_occurrences: most recent occurrences scanned per match length (default 16); bounds
            a cycle's cost on very repetitive text.
        copy_nodes: draft nodes on a *copy* cycle, one whose context repeats its whole ``max_match``-token
            suffix earlier (the answer is copying earlier text, as in code edits); 0 (default): no copy cycles.
            The hybrid drafters' ``ngram_copy_nodes`` for the n-gram drafter alone.
        copy_depth: deepest node on a copy cycle (None: ``max(copy_nodes, max_depth)``).
        node_cost: how a cycle's tree is sized. None (default): from this machine's measured verification cost
            of 1-64 tokens on the target (:func:`hf_spec.verify_cost.verify_cost_curve`, timed once in a few seconds and
            cached; :func:`relative_node_costs`), so the trees grow where verifying more tokens is almost free (a
            GPU, a CPU with AMX) and shrink where it is not. A number c: every verified node costs c one-token
            decoding steps (0.035 suits SmolLM2-135M bf16 on a 2-core Zen 4). Each cycle keeps the best-first
            prefix of its tree that maximizes (1 + expected accepted tokens) / cost (:func:`scored_trie`); 0: always
            ``num_draft_tokens`` nodes.
    """

    model_type = "hf_spec_ngram"
    default_training_method = None

    def __init__(self, max_match: int = 4, min_match: int = 1, num_draft_tokens: int | None = None,
                 max_depth: int | None = None, max_branches: int | None = None, max_occurrences: int = 16,
                 copy_nodes: int = 0, copy_depth: int | None = None, node_cost: float | None = None, **kwargs):  # fmt: skip
        kwargs["tree_total_tokens"] = (num_draft_tokens if num_draft_tokens is not None
                                       else kwargs.get("tree_total_tokens", DEFAULT_DRAFT_NODES))  # fmt: skip
        kwargs["tree_depth"] = max_depth if max_depth is not None else kwargs.get("tree_depth", DEFAULT_DRAFT_DEPTH)
        kwargs["tree_top_k"] = max_branches if max_branches is not None else kwargs.get("tree_top_k", DEFAULT_DRAFT_BRANCHES)
        if not 1 <= min_match <= max_match:
            raise ValueError(f"NGramDrafterConfig needs 1 <= min_match <= max_match, got {min_match} and {max_match}.")
        if not isinstance(max_occurrences, int) or max_occurrences < 1:
            raise ValueError(f"max_occurrences must be a positive integer, got {max_occurrences!r}.")
        self.max_match = max_match
        self.min_match = min_match
        self.max_occurrences = max_occurrences
        self.copy_nodes = check_ngram_branches(copy_nodes, "copy_nodes")
        if copy_depth is not None and (not isinstance(copy_depth, int) or copy_depth < 1):
            raise ValueError(f"copy_depth must be a positive integer or None (max(copy_nodes, max_depth)), got {copy_depth!r}.")
        self.copy_depth = copy_depth
        if node_cost is not None and (isinstance(node_cost, bool) or not isinstance(node_cost, (int, float))
                                      or not 0 <= node_cost < float("inf")):  # fmt: skip
            raise ValueError(f"node_cost must be None (this machine's measured costs), or a finite number >= 0 "
                             f"(0: always draft num_draft_tokens nodes), got {node_cost!r}.")  # fmt: skip
        self.node_cost = None if node_cost is None else float(node_cost)
        super().__init__(**kwargs)

    @property
    def num_draft_tokens(self) -> int:
        return self.tree_total_tokens

    @property
    def max_depth(self) -> int:
        return self.tree_depth

    @property
    def max_branches(self) -> int:
        return self.tree_top_k


class NGramTreeShape(TreeShape):
    """Tree budget of n-gram drafting: any positive depth/top_k/total_tokens, greedy or
    sampling (point-mass drafts need no pinned expanded nodes)."""

    def validate(self, sampling: bool) -> None:
        super().validate(sampling=False)


class NGramDrafter(SpecDrafterModel):
    """Weightless drafter: trees of continuations of the context's suffix found earlier in the
    context (see the module docstring), and with a ``datastore``
    (:class:`~hf_spec.drafters.datastore.NGramDatastore`, e.g. of the target's own earlier answers) also
    found in that corpus. ``target.generate(ids, assistant_model=NGramDrafter())``;
    ``tree_depth`` / ``tree_top_k`` / ``tree_total_tokens`` override max_depth / max_branches /
    num_draft_tokens for one call."""

    config_class = NGramDrafterConfig
    supports_ngram_branches = False  # its trees are n-gram tries already

    def __init__(self, config: NGramDrafterConfig | None = None, datastore=None, **config_kwargs):
        if config is None:
            config = NGramDrafterConfig(**config_kwargs)
        elif config_kwargs:
            raise ValueError("Pass either a config or config keyword arguments to NGramDrafter, not both.")
        super().__init__(config)
        self.ngram_datastore = datastore
        self.post_init()

    def save_pretrained(self, save_directory, *args, is_main_process: bool = True, **kwargs):
        """Write the config (and ``ngram_datastore.safetensors`` when the drafter has a datastore): a weightless
        drafter has nothing else to save. :class:`~hf_spec.AutoDrafter` and :meth:`from_pretrained` read it back."""
        if not is_main_process:
            return
        os.makedirs(save_directory, exist_ok=True)
        self.config.save_pretrained(save_directory)
        if self.ngram_datastore is not None:
            self.ngram_datastore.save(save_directory)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config=None, **kwargs):
        """The drafter saved by :meth:`save_pretrained` (local directory or Hub repo): its config and datastore."""
        from ..datastore import find_datastore

        if not isinstance(config, NGramDrafterConfig):
            hub = {k: kwargs[k] for k in ("revision", "cache_dir", "token", "local_files_only", "force_download")
                   if k in kwargs}  # fmt: skip
            config = NGramDrafterConfig.from_pretrained(pretrained_model_name_or_path, **hub)
        return cls(config, datastore=find_datastore(pretrained_model_name_or_path, **kwargs))

    def bind(self, target):
        """Any target works: nothing to check, borrow or move (there are no weights)."""
        self._borrowed = (target.get_input_embeddings(), target.get_output_embeddings())
        self._bound_target_config = target.config
        return self

    def tree_shape(self, depth=None, top_k=None, total_tokens=None) -> NGramTreeShape:
        shape = super().tree_shape(depth, top_k, total_tokens)
        return NGramTreeShape(depth=shape.depth, top_k=shape.top_k, total_tokens=shape.total_tokens)

    def new_drafting_session(self, target, shape: TreeShape, do_sample: bool, temperature: float = 1.0, prompt_ids=None):
        """The n-gram session of one sequence; with ``config.node_cost`` None it sizes its trees by the relative
        costs :data:`FALLBACK_NODE_COST` until the loop hands it the target's measured verification costs
        (:meth:`NGramDraftingSession.use_verify_costs`)."""
        if prompt_ids is None:
            raise ValueError("NGramDrafter drafts from tokens and needs the prompt (prompt_ids).")
        return NGramDraftingSession(self.config, shape, prompt_ids, datastore=self.ngram_datastore)


class NGramDraftingSession(DraftingSession):
    """Drafting state of one generate() call: the n-gram index of prompt + generated tokens.

    :meth:`propose` gets the committed tokens of each cycle (on the first call: the prompt
    after its first token, then the first generated token); the last one is the new root.
    ``forward_seconds`` accumulates the drafting time (there is no forward).
    """

    def __init__(self, config: NGramDrafterConfig, shape: TreeShape, prompt_ids: torch.Tensor, datastore=None):
        self.shape = shape
        self.datastore = datastore
        self.max_occurrences = config.max_occurrences
        self.copy_nodes = config.copy_nodes
        self.copy_depth = max(shape.depth, config.copy_depth or config.copy_nodes)
        self.node_cost = FALLBACK_NODE_COST if config.node_cost is None else config.node_cost
        self.wants_verify_costs = config.node_cost is None
        self.max_nodes = max(shape.total_tokens, config.copy_nodes)  # the largest trie it drafts
        self.index = NGramIndex(config.min_match, config.max_match)
        self.index.extend(prompt_ids[0, :1].tolist())
        self.forward_seconds = 0.0

    def use_verify_costs(self, verify_ms: dict[int, float]) -> None:
        """Size the tries by this machine's measured verification costs of the target (``verify_ms``: tree size ->
        milliseconds, :func:`hf_spec.verify_cost.verify_cost_curve`): :func:`relative_node_costs`."""
        self.node_cost = relative_node_costs(verify_ms, self.max_nodes)

    def propose(self, features: torch.Tensor | None, next_tokens: torch.Tensor) -> DraftTree:
        """Index ``next_tokens`` and draft the trie of continuations under ``next_tokens[-1]``."""
        start = timing.clock(next_tokens.device)
        self.index.extend(next_tokens.tolist())
        shape = self.shape
        longest = self.copy_depth if self.copy_nodes else shape.depth  # continuations long enough for a copy
        continuations = ranked_continuations(self.index, self.datastore, longest, self.max_occurrences)
        first = continuations[0] if continuations else None
        copy = copy_budget(first, self.index.max_match, self.copy_nodes)  # 0 unless the context repeats its suffix
        nodes, depth = (max(shape.total_tokens, copy), longest) if copy else (shape.total_tokens, shape.depth)
        trie = scored_trie(continuations, nodes, depth, shape.top_k, self.node_cost)
        tree = trie_to_draft_tree(int(next_tokens[-1]), trie, device=next_tokens.device)
        self.forward_seconds += timing.clock(next_tokens.device) - start
        return tree
