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

    @property
    def num_accepted_drafts(self) -> int:
        return len(self.nodes) - 1


ProcessFn = Callable[[int, torch.Tensor], torch.Tensor]
"""(node index, raw logits (V,)) -> processed scores (V,) for that node's context."""


def verify_tree(
    tree: DraftTree,
    target_logits: Callable[[int], torch.Tensor],
    process: ProcessFn,
    do_sample: bool,
    keep_scores: bool = False,
    generator: torch.Generator | None = None,
) -> WalkResult:
    """Walk the verified tree and return the emitted tokens and accepted nodes.

    ``target_logits(node)``: the raw target logits (V,) at a tree node; the walk asks only for
    the nodes it visits (at most depth + 1), so the LM head never runs over the whole tree.
    ``process`` applies the
    generation's logits processors and warpers with the node's own context, exactly as
    transformers' ``_sample`` does for one position.
    """
    walk = walk_tree(tree, process, do_sample, keep_scores, generator)
    node = next(walk)
    try:
        while True:
            node = walk.send(target_logits(node))
    except StopIteration as stop:
        return stop.value


def walk_tree(
    tree: DraftTree,
    process: ProcessFn,
    do_sample: bool,
    keep_scores: bool = False,
    generator: torch.Generator | None = None,
) -> Generator[int, torch.Tensor, WalkResult]:
    """:func:`verify_tree` as a generator: yields the node whose raw logits (V,) it needs next,
    is sent them, and returns the :class:`WalkResult`. Lets a batch of walks share one LM-head
    call per step (:mod:`hf_spec.batched`)."""
    result = WalkResult()
    slot_of_node = torch.full((len(tree),), -1, dtype=torch.long)
    slot_of_node[tree.expanded.cpu()] = torch.arange(tree.expanded.shape[0])
    node = 0
    while True:
        raw = yield node
        scores = process(node, raw)
        if keep_scores:
            result.scores.append(scores)
            result.logits.append(raw)
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
                token, child = _rejection_sample(probs, q, tree.candidate_tokens[slot], tree.candidate_nodes[slot],
                                                 generator)  # fmt: skip
            else:
                token, child = int(torch.multinomial(probs, 1, generator=generator)), -1
        result.tokens.append(token)
        if child < 0:
            return result
        result.nodes.append(child)
        node = child


def _rejection_sample(p, q, candidates, candidate_nodes, generator):
    """Recursive rejection sampling without replacement over one node's candidates.

    ``q`` None: every candidate is a point-mass draft (q_i = delta(c_i), see the module docstring).
    Returns (emitted token, tree node of the accepted candidate or -1).
    """
    if q is None:
        for i in range(candidates.shape[0]):
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
        return int(torch.multinomial(p, 1, generator=generator)), -1
    q = q.clone()
    for i in range(candidates.shape[0]):
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
