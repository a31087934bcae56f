"""Choosing the accepted path of a verified draft tree.

The walk starts at the root and, at each node u, emits exactly one token distributed as
the target's (processed) next-token distribution p_u given the text so far; if that token
is a child of u kept in the tree, the walk moves there, else it stops. The last emitted
token is the "bonus" token that becomes the next root.

Greedy: the token is argmax p_u, so the output equals plain greedy decoding.

Sampling, recursive rejection sampling without replacement (proof sketch). At an expanded
node u the drafter drew candidates c_1, c_2, ... without replacement from q_u (Gumbel-top-k,
:func:`hf_spec.tree.dynamic.draw_candidates`), so c_i given c_1..c_{i-1} follows q_i = q_u
with c_1..c_{i-1} removed and renormalised. For i = 1, 2, ...: accept c_i with probability
min(1, p_i(c_i) / q_i(c_i)); on rejection set p_{i+1} = norm(max(p_i - q_i, 0)). One such
step emits a token distributed as p_i whatever q_i is (the classic speculative-sampling
lemma: P(x) = min(p(x), q(x)) + (1 - sum_y min(p(y), q(y))) * norm(max(p - q, 0))(x) = p(x)),
and the rejected branch needs only *some* draw from p_{i+1}, which the next step provides
from its own fresh candidate; if candidates run out, we sample p_{i+1} directly. By
induction the emitted token follows p_1 = p_u. Every candidate takes part, including those
pruned from the tree (if one is accepted we emit it and stop, since its subtree was not
verified): pruning then never biases the token, only how far the walk goes.
What remains is that the event "we reach u and u is expanded" must not depend on u's own
candidates: expansion decisions are taken before u's candidates are drawn, and in sampling
mode every expanded node is pinned in the final tree (see
:func:`hf_spec.tree.dynamic.grow_dynamic_tree`), so it holds. A node that is not expanded
simply samples p_u. Hence every emitted token has exactly the target's distribution.

Point-mass drafts (``draft_probs is None`` in sampling mode): a drafter whose candidates are
a deterministic function of the committed text (e.g. :mod:`hf_spec.drafters.ngram`) drew
each c_i from q_i = delta(c_i). The same step then accepts c_i with probability p_i(c_i) and
on rejection leaves p_{i+1} = norm(max(p_i - delta(c_i), 0)) = p_i with c_i removed; the lemma
holds for any q_i, so the emitted token still follows p_u. (Equivalently: the walk emits a
draw x ~ p_u and follows x's child if x is a candidate, the best acceptance any lossless
scheme can get from fixed candidates.)

Mixed rows (``num_point_mass``: n-gram branches grafted into a trained drafter's tree, see
:func:`hf_spec.drafters.ngram.graft_trie`): a row's first c candidates t_1..t_c are point
masses fixed by the committed text, the rest d_1, d_2, ... were drawn without replacement
from q_u. The point-mass steps run first: accept t_i with p_i(t_i), else remove t_i and
renormalise. If all are rejected (probability 1 - p_u(T), T = {t_1..t_c}), p' = p_u with T
removed and renormalised, and the usual min(1, p'/q) steps run over the d_j (a d_j in T has
p'(d_j) = 0 and is always rejected). Both stages are instances of the lemma above, so the
emitted token is t_i with probability p_u(t_i) and otherwise a draw from p', i.e. follows
p_u. This needs T, and whether u is reached and has a row, to be independent of u's own
draws d_j: the grafted trie is a function of the committed text alone in sampling mode, and
sharing a node with an equal drafter child changes only which node a token leads to, never
which tokens are candidates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generator

import torch

from .tree.tree import DraftTree


@dataclass
class WalkResult:
    """What one verification walk produced.

    ``tokens``: emitted tokens (accepted drafts, then the bonus token); ``nodes``: tree
    indices of the root and the accepted drafts (whose KV entries and features are kept);
    ``scores`` / ``logits``: processed and raw target scores for each emitted token.
    """

    tokens: list[int] = field(default_factory=list)
    nodes: list[int] = field(default_factory=lambda: [0])
    scores: list[torch.Tensor] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    _node_tensor: torch.Tensor | None = field(default=None, repr=False)
    _token_tensor: torch.Tensor | None = field(default=None, repr=False)

    @property
    def num_accepted_drafts(self) -> int:
        return len(self.nodes) - 1

    def node_tensor(self, device) -> torch.Tensor:
        """``nodes`` as a long tensor on ``device`` (no host-to-device copy after a greedy walk)."""
        if self._node_tensor is None:
            self._node_tensor = torch.tensor(self.nodes, dtype=torch.long, device=device)
        return self._node_tensor

    def token_tensor(self, device) -> torch.Tensor:
        """``tokens`` as a long tensor on ``device``."""
        if self._token_tensor is None:
            self._token_tensor = torch.tensor(self.tokens, dtype=torch.long, device=device)
        return self._token_tensor

    @property
    def accepted_contiguously(self) -> bool:
        """True when the accepted nodes are 0, 1, ..., a (their KV entries need no moving)."""
        return self.nodes[-1] == len(self.nodes) - 1


ProcessFn = Callable[[int, torch.Tensor], torch.Tensor]
"""(node index, raw logits (V,)) -> processed scores (V,) for that node's context."""


def verify_tree(
    tree: DraftTree,
    logits: torch.Tensor,
    process: ProcessFn | None,
    do_sample: bool,
    keep_scores: bool = False,
    generator: torch.Generator | None = None,
) -> WalkResult:
    """Walk the verified tree and return the emitted tokens and accepted nodes.

    ``logits``: the raw float32 target logits (n, V) of every tree node, computed by one
    LM-head matmul (one read of the head's weights per cycle). ``process`` applies the
    generation's logits processors and warpers with the node's own context, exactly as
    transformers' ``_sample`` does for one position; ``None`` means there are none, and then
    a greedy walk runs as tensor ops with one host transfer (:func:`greedy_plan`).
    """
    if process is None and not do_sample:
        packed = greedy_plan(tree, logits)
        return greedy_result(packed.tolist(), len(tree), logits if keep_scores else None, packed)
    walk = walk_tree(tree, process or _identity, do_sample, keep_scores, generator)
    node = next(walk)
    try:
        while True:
            node = walk.send(logits[node])
    except StopIteration as stop:
        return stop.value


def _identity(node: int, raw: torch.Tensor) -> torch.Tensor:
    return raw


def _row_nodes(expanded: torch.Tensor, n: int) -> torch.Tensor:
    """The node of each of a tree's expanded rows, ``n`` (a spare slot past the tree's nodes) for the rows of a
    fixed-size tree that expanded no node (-1), so that writes indexed by it need no data-dependent shape."""
    return torch.where(expanded >= 0, expanded, n)


def greedy_plan(tree: DraftTree, logits: torch.Tensor) -> torch.Tensor:
    """The greedy walk of :func:`walk_tree` (no logits processors) as device tensor ops.

    Each node's next token is the argmax of its logits (n, V); node u's chosen child is its
    first candidate (in draw order) holding that token; a node is accepted when it and
    every ancestor were chosen. Returns ``packed`` (2n + 1,) = [count of accepted nodes (root
    included), accepted nodes in depth order padded with n, emitted tokens (accepted drafts
    then the bonus token) padded], for :func:`greedy_result` after one host transfer.
    """
    n = len(tree)
    if n == 1:
        # the root alone (a plain step): [1, node 0, its argmax], on the logits' device, without the dozen small
        # tensor ops below (about half a millisecond a cycle on a CPU)
        token = logits[0].argmax().view(1)
        return torch.cat([torch.ones_like(token), torch.zeros_like(token), token])
    device = logits.device
    best = logits.argmax(dim=-1)  # (n,)
    arange = torch.arange(n, device=device)
    chosen = torch.full((n + 1,), -1, dtype=torch.long, device=device)  # [n]: rows of pruned nodes write there
    expanded = tree.expanded.to(device)
    if expanded.numel():
        hits = tree.candidate_tokens.to(device) == best[expanded].view(-1, 1)  # (m, k)
        first = hits.to(torch.uint8).argmax(dim=1, keepdim=True)  # first hit in draw order
        child = tree.candidate_nodes.to(device).gather(1, first).view(-1)
        chosen[_row_nodes(expanded, n)] = torch.where(hits.any(dim=1), child, -1)
    chosen = chosen[:n]
    parents = tree.parents.to(device)
    was_chosen = chosen[parents.clamp(min=0)] == arange
    was_chosen[0] = True
    accepted = ~(tree.ancestor_matrix().to(device) & ~was_chosen.view(1, n)).any(dim=1)
    nodes = torch.where(accepted, arange, n).sort().values  # accepted first, by depth (BFS order)
    count = accepted.sum()
    last = torch.where(accepted, arange, -1).max()
    token_of = torch.cat([tree.tokens.to(device), best[last].view(1)])  # index n -> the bonus token
    emitted = token_of[torch.cat([nodes[1:], nodes.new_full((1,), n)])]
    return torch.cat([count.view(1), nodes, emitted])


def greedy_result(packed: list[int], n: int, logits: torch.Tensor | None = None, packed_tensor=None) -> WalkResult:
    """A :class:`WalkResult` from :func:`greedy_plan`'s ``packed`` after its host transfer.

    ``logits`` (n, V): pass them when the scores must be kept (processed = raw without
    processors). The device tensors of nodes and tokens are slices of ``packed_tensor``.
    """
    count = packed[0]
    result = WalkResult(tokens=packed[1 + n : 1 + n + count], nodes=packed[1 : 1 + count])
    if packed_tensor is not None:
        result._node_tensor = packed_tensor[1 : 1 + count]
        result._token_tensor = packed_tensor[1 + n : 1 + n + count]
    if logits is not None:
        rows = logits.index_select(0, result.node_tensor(logits.device)).unbind(0)  # copies: no view pins all rows
        result.scores, result.logits = list(rows), list(rows)
    return result


def walk_tree(
    tree: DraftTree,
    process: ProcessFn,
    do_sample: bool,
    keep_scores: bool = False,
    generator: torch.Generator | None = None,
) -> Generator[int, torch.Tensor, WalkResult]:
    """The walk node by node, as a generator: yields the node whose raw logits (V,) it needs
    next, is sent them, and returns the :class:`WalkResult`. Used for sampling and when
    logits processors need each node's own context."""
    result = WalkResult()
    n = len(tree)
    slot_of_node = torch.full((n + 1,), -1, dtype=torch.long)  # [n]: rows of pruned nodes
    expanded = tree.expanded.cpu()
    slot_of_node[_row_nodes(expanded, n)] = torch.arange(expanded.shape[0])
    node = 0
    while True:
        raw = yield node
        scores = process(node, raw)
        if keep_scores:
            result.scores.append(scores if scores is not raw else scores.clone())
            result.logits.append(raw.clone())
        slot = int(slot_of_node[node])
        if not do_sample:
            token = int(scores.argmax())
            child = -1
            if slot >= 0:
                hits = (tree.candidate_tokens[slot] == token).nonzero()
                if hits.numel():
                    child = int(tree.candidate_nodes[slot, int(hits[0])])
        else:
            probs = torch.softmax(scores.float(), dim=-1)
            if slot >= 0:
                q = tree.draft_probs[slot].float() if tree.draft_probs is not None else None  # None: point masses
                point_mass = int(tree.num_point_mass[slot]) if tree.num_point_mass is not None else 0
                token, child = _rejection_sample(probs, q, tree.candidate_tokens[slot], tree.candidate_nodes[slot],
                                                 generator, point_mass)  # fmt: skip
            else:
                token, child = int(torch.multinomial(probs, 1, generator=generator)), -1
        result.tokens.append(token)
        if child < 0:
            return result
        result.nodes.append(child)
        node = child


def _rejection_sample(p, q, candidates, candidate_nodes, generator, num_point_mass: int = 0):
    """Recursive rejection sampling without replacement over one node's candidates.

    ``q`` None: every candidate is a point-mass draft (q_i = delta(c_i), see the module docstring);
    else the first ``num_point_mass`` are, and the rest were drawn from ``q`` (mixed rows).
    Returns (emitted token, tree node of the accepted candidate or -1).
    """
    point_mass = candidates.shape[0] if q is None else num_point_mass
    for i in range(point_mass):
        token = int(candidates[i])
        if token < 0:
            break
        if float(torch.rand((), generator=generator, device=p.device)) < float(p[token]):
            return token, int(candidate_nodes[i])
        residual = p.clone()
        residual[token] = 0.0
        total = float(residual.sum())
        if total <= 0.0:
            break
        p = residual / total
    if q is None:
        return int(torch.multinomial(p, 1, generator=generator)), -1
    q = q.clone()
    for i in range(point_mass, candidates.shape[0]):
        token = int(candidates[i])
        if token < 0:
            break
        q_token = float(q[token])
        if q_token <= 0.0:  # numerically vanished after renormalisations
            break
        accept_prob = min(1.0, float(p[token]) / q_token)
        if float(torch.rand((), generator=generator, device=p.device)) < accept_prob:
            return token, int(candidate_nodes[i])
        residual = (p - q).clamp_(min=0.0)
        total = float(residual.sum())
        p = residual / total if total > 0 else p
        q[token] = 0.0
        q_total = float(q.sum())
        if q_total <= 0.0:
            break
        q /= q_total
    return int(torch.multinomial(p, 1, generator=generator)), -1
