"""EAGLE-2 dynamic draft trees.

Growth: the root's top_k children form depth 1. At every later step the top_k
highest-scoring nodes of the newest depth (score = cumulative draft log-probability) are
expanded by one drafter forward, each proposing top_k children. After ``depth`` levels
all nodes are re-ranked by score and the best ``total_tokens`` are kept; a child never
scores above its parent, so the kept set always contains every kept node's ancestors.

Greedy drafting takes each node's top_k tokens. Sampling draws them *without
replacement* from the draft distribution (Gumbel-top-k) and pins every expanded node in
the final tree, which is what keeps recursive rejection sampling lossless (see
:func:`hf_spec.verify.verify_tree`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from ..draft_vocab import full_vocab_probs
from .tree import DraftTree


@dataclass
class TreeShape:
    """How big a draft tree grows: ``depth`` levels, ``top_k`` children per expanded node,
    ``total_tokens`` draft nodes kept for verification (the root excluded).

    ``min_prob`` (0: off) sizes each tree by the drafter's confidence: a node whose cumulative draft
    probability (the product along its path) is below it is not verified, and growth stops at the
    first depth whose best node is below it. On confident text the tree keeps its full depth; on
    uncertain text it shrinks, saving drafting forwards and verified tokens. Any value is lossless."""

    depth: int = 6
    top_k: int = 8
    total_tokens: int = 60
    min_prob: float = 0.0

    @property
    def max_nodes(self) -> int:
        """Nodes the growth can create before re-ranking, the root included."""
        return 1 + self.top_k + (self.depth - 1) * self.top_k * self.top_k

    def validate(self, sampling: bool) -> None:
        for name in ("depth", "top_k", "total_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"tree_{name} must be a positive integer, got {value!r}.")
        if sampling and self.total_tokens < self.top_k * (self.depth - 1):
            raise ValueError(
                f"In sampling mode every expanded node stays in the tree (that keeps rejection sampling "
                f"lossless), so tree_total_tokens must be >= tree_top_k * (tree_depth - 1) = "
                f"{self.top_k * (self.depth - 1)}; got tree_total_tokens={self.total_tokens}. Raise "
                f"tree_total_tokens or lower tree_depth / tree_top_k."
            )
        if not isinstance(self.min_prob, (int, float)) or not 0.0 <= self.min_prob < 1.0:
            raise ValueError(f"tree_min_prob must be a number in [0, 1) (0: off), got {self.min_prob!r}.")

    @property
    def min_score(self) -> float | None:
        """log(min_prob), the floor on a node's cumulative draft log-probability; None when off."""
        return math.log(self.min_prob) if self.min_prob > 0 else None


@dataclass
class Frontier:
    """The nodes one drafter forward expands.

    ``nodes``: (k,) indices in the growing tree; ``parents``: (k,) their parents;
    ``tokens``: (k,); ``depths``: (k,); ``attend``: (k, slots + k) bool, which earlier
    expanded nodes (in the order they entered the drafter's cache) and which frontier
    nodes each frontier node may attend to.
    """

    nodes: torch.Tensor
    parents: torch.Tensor
    tokens: torch.Tensor
    depths: torch.Tensor
    attend: torch.Tensor


ExpandFn = Callable[[Frontier], torch.Tensor]
"""Runs the drafter on a frontier and returns its (k, V) next-token log-probabilities."""


def draw_candidates(logq: torch.Tensor, k: int, sample: bool, generator: torch.Generator | None = None):
    """k candidates per row of log-probabilities ``logq`` (rows, V).

    Greedy: the top-k tokens. Sampling: k draws without replacement, in draw order, by the
    Gumbel-top-k trick. Returns (tokens, their log-probabilities), each (rows, k); a draw from
    a zero-probability token has log-probability -inf and must be treated as absent.
    """
    if not sample:
        values, tokens = logq.topk(k, dim=-1)
        return tokens, values
    exponential = torch.empty(logq.shape, device=logq.device, dtype=torch.float32).exponential_(generator=generator)
    gumbel = -torch.log(exponential.clamp_(min=1e-30))  # Gumbel(0, 1) noise
    _, tokens = (logq.float() + gumbel).topk(k, dim=-1)
    return tokens, logq.gather(-1, tokens)


def grow_dynamic_tree(
    root_token: int | torch.Tensor,
    root_logq: torch.Tensor,
    expand: ExpandFn,
    shape: TreeShape,
    sample: bool,
    generator: torch.Generator | None = None,
    vocab_ids: torch.Tensor | None = None,
    vocab_size: int | None = None,
) -> DraftTree:
    """Grow an EAGLE-2 tree from the root's draft log-probabilities ``root_logq`` (V,).

    With ``vocab_ids`` (D,) every log-probability row (the root's and ``expand``'s) is over those
    target ids only (a draft vocabulary, -inf elsewhere implied): candidates are drawn among the D
    columns and mapped to target ids, and in sampling the kept draft distributions are scattered
    back to ``vocab_size`` columns for verification. The tree is the same as over the full rows.

    Without ``shape.min_prob`` nothing is read back to the host and every shape is fixed: every
    frontier has min(top_k, newest) nodes, and a frontier node with a non-finite score (a draw the
    drafter gave probability 0) is still run through ``expand`` but its children score -inf, so
    :func:`_select` makes it and them unreachable, exactly as if it had not been expanded. With it,
    one host read per depth stops the growth when the newest depth's best score is below the floor
    (no descendant could pass it), and the tree drops the nodes below it.
    """
    device = root_logq.device
    k = shape.top_k
    max_nodes = shape.max_nodes
    tokens = torch.empty(max_nodes, dtype=torch.long, device=device)
    parents = torch.empty(max_nodes, dtype=torch.long, device=device)
    depths = torch.empty(max_nodes, dtype=torch.long, device=device)
    scores = torch.empty(max_nodes, dtype=torch.float32, device=device)
    tokens[0], parents[0], depths[0], scores[0] = root_token, -1, 0, 0.0

    expanded_nodes = [torch.zeros(1, dtype=torch.long, device=device)]
    candidate_lists = []
    draft_logq = [root_logq.view(1, -1)] if sample else None

    def add_children(parent_nodes: torch.Tensor, logq: torch.Tensor, start: int) -> torch.Tensor:
        child_tokens, child_logq = draw_candidates(logq, k, sample, generator)
        if vocab_ids is not None:
            child_tokens = vocab_ids[child_tokens]
        count = child_tokens.numel()
        ids = torch.arange(start, start + count, device=device)
        tokens[ids] = child_tokens.reshape(-1)
        parents[ids] = parent_nodes.repeat_interleave(k)
        depths[ids] = depths[parent_nodes].repeat_interleave(k) + 1
        scores[ids] = (scores[parent_nodes].view(-1, 1) + child_logq.float()).reshape(-1)
        candidate_lists.append(ids.view(-1, k))
        return ids

    newest = add_children(expanded_nodes[0], root_logq.view(1, -1), 1)
    count = 1 + k
    # ancestry[i, j]: expanded slot j (drafter cache order) is an ancestor-or-self of slot i.
    max_slots = (shape.depth - 1) * k
    slot_of_node = torch.full((max_nodes,), -1, dtype=torch.long, device=device)
    ancestry = torch.zeros(max_slots, max_slots, dtype=torch.bool, device=device)
    num_slots = 0
    min_score = shape.min_score
    for _ in range(shape.depth - 1):
        newest_scores = scores[newest]
        newest_scores = newest_scores.masked_fill(~torch.isfinite(newest_scores), float("-inf"))
        if min_score is not None and float(newest_scores.max()) < min_score:
            break  # a child never scores above its parent: nothing deeper could be kept
        order = newest_scores.topk(min(k, newest.numel())).indices
        frontier_nodes = newest[order]
        f = frontier_nodes.numel()
        rows = slice(num_slots, num_slots + f)
        if num_slots:
            parent_slots = slot_of_node[parents[frontier_nodes]]
            inherited = ancestry[parent_slots.clamp(min=0), :num_slots] & (parent_slots >= 0).view(-1, 1)
            ancestry[rows, :num_slots] = inherited
        ancestry[rows, rows] = torch.eye(f, dtype=torch.bool, device=device)
        logq = expand(
            Frontier(
                nodes=frontier_nodes,
                parents=parents[frontier_nodes],
                tokens=tokens[frontier_nodes],
                depths=depths[frontier_nodes],
                attend=ancestry[rows, : num_slots + f],
            )
        )
        slot_of_node[frontier_nodes] = torch.arange(num_slots, num_slots + f, device=device)
        num_slots += f
        expanded_nodes.append(frontier_nodes)
        if sample:
            draft_logq.append(logq)
        newest = add_children(frontier_nodes, logq, count)
        count += newest.numel()

    return _select(
        tokens[:count],
        parents[:count],
        depths[:count],
        scores[:count],
        torch.cat(expanded_nodes),
        torch.cat(candidate_lists),
        full_vocab_probs(torch.cat(draft_logq), vocab_ids, vocab_size) if sample else None,
        shape.total_tokens,
        pin_expanded=sample,
        min_score=shape.min_score,
    )


def _select(tokens, parents, depths, scores, expanded, candidates, draft_probs, total_tokens, pin_expanded,
            min_score: float | None = None):  # fmt: skip
    """Keep the root and the ``total_tokens`` best nodes, renumbered in BFS order. A child never scores above its
    parent (ties: the parent's lower index wins), so ancestors of kept nodes are kept.

    Without ``min_score`` every shape is fixed (no host sync): the tree has ``1 + min(total_tokens, n - 1)``
    nodes, and always one candidate row per ``expanded`` node (``expanded`` -1 where that node was pruned). A
    kept node of priority -inf (non-finite score: a draw the drafter gave probability 0, whose candidate token
    is already -1) is unreachable: no candidate row leads to it, so verification never accepts it; it is there
    only when fewer nodes can be reached. With ``min_score``, nodes below it (pinned ones aside) are dropped
    instead: that floor exists to shrink the tree, and its growth reads the host anyway."""
    n = tokens.shape[0]
    device = tokens.device
    priority = scores.clone()
    priority[0] = float("inf")
    if pin_expanded:  # non-finite "expanded" nodes are frontier padding (see grow_dynamic_tree): never pinned
        priority[expanded] = torch.where(torch.isfinite(scores[expanded]), float("inf"), scores[expanded])
    if min_score is not None:
        priority = priority.masked_fill(priority < min_score, float("-inf"))
    # Stable sort: among equal scores the lower index (a parent before its child) wins.
    order = torch.sort(-priority, stable=True).indices
    keep = order[: 1 + total_tokens]
    if min_score is not None:
        keep = keep[priority[keep] > float("-inf")]  # the floor shrinks the tree: a data-dependent size
    keep = keep.sort().values  # BFS order survives: parents keep smaller indices
    new_index = torch.full((n,), -1, dtype=torch.long, device=device)
    new_index[keep] = torch.arange(keep.numel(), device=device)
    reachable = torch.where(priority > float("-inf"), new_index, -1)  # a candidate row leads only to these
    kept_parents = parents[keep]
    kept_parents = torch.where(kept_parents >= 0, new_index[kept_parents.clamp(min=0)], kept_parents)
    candidate_tokens = torch.where(
        torch.isfinite(scores[candidates]), tokens[candidates], torch.full_like(candidates, -1)
    )
    return DraftTree(
        tokens=tokens[keep],
        parents=kept_parents,
        depths=depths[keep],
        scores=scores[keep],
        expanded=new_index[expanded],
        candidate_tokens=candidate_tokens,
        candidate_nodes=reachable[candidates],
        draft_probs=draft_probs,
    )
