"""Fixed-shape draft trees: per-depth widths, one draft distribution per depth (ParallelSpec).

A parallel drafter produces, in one forward, one distribution per depth: ``q_1`` (the root
pair's output) and ``q_2 .. q_D`` (the ``[MASK]_1 .. [MASK]_{D-1}`` outputs). None of them
depends on which tokens were drafted at shallower depths. The tree is the full product
shape: every node at depth d-1 whose own draw was valid is expanded with ``widths[d-1]``
children drawn from ``q_d``; greedy takes the top-w tokens of ``q_d`` under every parent,
sampling draws w tokens *without replacement* from ``q_d`` independently for every parent
(Gumbel-top-k with fresh noise per row).

Why sampling stays lossless (the conditions of :mod:`hf_spec.verify`):

1. Each expanded node u at depth d-1 stores ``q_d`` as its ``draft_probs`` row, and its
   candidates are exactly the ordered draws without replacement from that row. ``q_d`` is a
   function of the committed prefix only (the drafter saw the committed pairs, the root and
   the masks, never a drafted token), so it is fixed before any candidate of the cycle is
   drawn and the candidates of u are fresh Gumbel noise, independent of every other node's
   draws and of the verifier's uniforms. Conditioned on the walk reaching u, the candidates
   of u are therefore still draws without replacement from the stored row, which is all the
   recursive rejection step needs: it emits a token distributed as the target's p_u for any
   fixed q (a poor q, such as ``q_d`` being "off" for this particular parent path, costs
   acceptance only, never correctness). Sharing one ``q_d`` between siblings' subtrees is the
   same situation as Alg. 1 of the ParallelSpec paper, which compares p(x | x_<n, V) with
   q(x | x_<n, [MASK]_1..[MASK]_{t-1}) whatever path V was accepted.
2. Whether u is expanded never depends on u's own candidates: the shape is fixed before the
   draws (every node above the last depth is expanded). A node whose own draw had zero
   probability (score -inf) is expanded too, so the tree's size is fixed, but no candidate
   row leads to it (nor to its children, which score -inf): it is verified, never accepted,
   and that depends on the draw *of its parent*, not on its own children. With
   ``pin_expanded`` every expanded node of finite score stays in the tree even when
   ``total_tokens`` prunes leaves, as in the dynamic tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .dynamic import TreeShape, _select, draw_candidates
from .tree import DraftTree


def static_tree_size(widths) -> tuple[int, int]:
    """(draft nodes, expanded non-root nodes) of the full product tree with ``widths``."""
    nodes, level, expanded = 0, 1, 0
    for i, width in enumerate(widths):
        level *= int(width)
        nodes += level
        if i + 1 < len(widths):
            expanded += level
    return nodes, expanded


@dataclass
class StaticTreeShape(TreeShape):
    """A fixed tree: ``widths[d-1]`` children per expanded node at depth d (``depth == len(widths)``)."""

    widths: tuple[int, ...] = field(default_factory=lambda: (4, 2, 2, 1, 1))

    def validate(self, sampling: bool) -> None:
        if not self.widths or any(not isinstance(w, int) or w < 1 for w in self.widths):
            raise ValueError(f"tree widths must be a non-empty list of positive integers, got {self.widths!r}.")
        if not isinstance(self.total_tokens, int) or self.total_tokens < 1:
            raise ValueError(f"tree_total_tokens must be a positive integer, got {self.total_tokens!r}.")
        _, expanded = static_tree_size(self.widths)
        if sampling and self.total_tokens < expanded:
            raise ValueError(
                f"In sampling mode every expanded node stays in the tree (that keeps rejection sampling lossless); "
                f"the static tree with widths {tuple(self.widths)} expands {expanded} drafted nodes, so "
                f"tree_total_tokens must be >= {expanded}; got {self.total_tokens}. Raise tree_total_tokens or use "
                "smaller widths."
            )


def build_static_tree(
    root_token: int | torch.Tensor,
    logq: torch.Tensor,
    widths,
    sample: bool,
    total_tokens: int | None = None,
    generator: torch.Generator | None = None,
) -> DraftTree:
    """The static tree for per-depth log-probabilities ``logq`` (D, V), ``D >= len(widths)``.

    Depth-d children of every depth-(d-1) node are drawn from ``logq[d-1]``: the full product shape, whatever
    the draws (no host sync; a zero-probability draw is an unreachable node, see the module docstring). Nodes
    are kept in BFS order; ``total_tokens`` (default: all) keeps the best-scoring draft nodes, pinning every
    expanded node when sampling.
    """
    device = logq.device
    widths = [min(int(w), logq.shape[-1]) for w in widths]  # never more candidates than tokens
    if logq.shape[0] < len(widths):
        raise ValueError(f"{len(widths)} tree depths need as many draft distributions, got {logq.shape[0]}.")
    tokens = [torch.as_tensor(root_token, dtype=torch.long, device=device).view(1)]
    parents = [torch.tensor([-1], dtype=torch.long, device=device)]
    depths = [torch.zeros(1, dtype=torch.long, device=device)]
    scores = [torch.zeros(1, dtype=torch.float32, device=device)]
    expanded, candidate_rows, expanded_depth = [], [], []
    max_width = max(widths)
    count = 1
    level = torch.zeros(1, dtype=torch.long, device=device)  # the nodes of the newest depth
    level_scores = scores[0]
    for d, width in enumerate(widths, start=1):
        n_parents = level.numel()
        child_tokens, child_logq = draw_candidates(logq[d - 1].view(1, -1).expand(n_parents, -1), width, sample,
                                                   generator)  # fmt: skip
        ids = torch.arange(count, count + n_parents * width, device=device)
        tokens.append(child_tokens.reshape(-1))
        parents.append(level.repeat_interleave(width))
        depths.append(torch.full((ids.numel(),), d, dtype=torch.long, device=device))
        child_scores = (level_scores.view(-1, 1) + child_logq.float()).reshape(-1)
        scores.append(child_scores)
        expanded.append(level)
        expanded_depth.append(torch.full((n_parents,), d - 1, dtype=torch.long, device=device))
        candidate_rows.append(ids.view(n_parents, width))
        count += ids.numel()
        level, level_scores = ids, child_scores

    # Candidate rows are padded to the widest depth with a sentinel node (score -inf, never kept).
    sentinel = count
    tokens.append(torch.zeros(1, dtype=torch.long, device=device))
    parents.append(torch.zeros(1, dtype=torch.long, device=device))
    depths.append(torch.ones(1, dtype=torch.long, device=device))
    scores.append(torch.full((1,), float("-inf"), device=device))
    candidates = torch.cat(
        [torch.nn.functional.pad(rows, (0, max_width - rows.shape[1]), value=sentinel) for rows in candidate_rows]
    )
    expanded_depth = torch.cat(expanded_depth)
    draft_probs = logq.float().exp()[expanded_depth] if sample else None
    total = count - 1 if total_tokens is None else min(int(total_tokens), count - 1)
    return _select(
        torch.cat(tokens), torch.cat(parents), torch.cat(depths), torch.cat(scores), torch.cat(expanded),
        candidates, draft_probs, total, pin_expanded=sample,
    )  # fmt: skip
