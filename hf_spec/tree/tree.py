"""The draft tree: a flat, BFS-ordered set of nodes that one target forward verifies.

Node 0 is the root: the last emitted token, which the target has not seen yet. Every other
node is a drafted token whose parent has a smaller index (BFS order), so a node's
root-to-node path is the text the target would see if that node were accepted.

For lossless sampling the tree also remembers, for every *expanded* node (a node whose
children were drafted from one draft distribution), that distribution and the full ordered
list of candidates drawn from it, including candidates that the final re-ranking pruned
from the tree (see :mod:`hf_spec.verify`).

Verification reaches a node only through its parent's candidate row (``candidate_nodes``). A
tree may hold nodes that no row leads to (drafted with probability 0, kept so that a drafter's
trees have a fixed size whatever the draws): they are verified, never accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftTree:
    """Flat draft tree.

    Attributes:
        tokens: (n,) token ids; ``tokens[0]`` is the root.
        parents: (n,) parent index of each node, ``-1`` for the root.
        depths: (n,) depth of each node, 0 for the root.
        scores: (n,) cumulative draft log-probability of the root-to-node path (root: 0).
        expanded: (m,) indices of the nodes whose children were drafted, ``-1`` for a row whose node
            was pruned (its ``candidate_nodes`` are all ``-1``; rows stay so that m is fixed).
        candidate_tokens: (m, k) candidates drawn at each expanded node, in draw order,
            ``-1`` where fewer than k exist.
        candidate_nodes: (m, k) the tree node holding each candidate, ``-1`` if pruned (or
            unreachable: a draw of probability 0, whose candidate token is ``-1`` too).
        draft_probs: (m, V) the draft distribution each expanded node's candidates came
            from, or ``None`` (greedy drafting does not need it; in sampling mode ``None``
            means every candidate is a point-mass draft).
        num_point_mass: (m,) how many leading candidates of each row are point-mass drafts
            (fixed by the committed text, e.g. grafted n-gram branches) before the ones drawn
            from ``draft_probs``; ``None``: none (or all, when ``draft_probs`` is None).
        from_ngram: (n,) bool on the host, True for nodes that only n-gram grafting drafted
            (for statistics); ``None``: no such nodes.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor
    expanded: torch.Tensor
    candidate_tokens: torch.Tensor
    candidate_nodes: torch.Tensor
    draft_probs: torch.Tensor | None = None
    num_point_mass: torch.Tensor | None = None
    from_ngram: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def max_depth(self) -> int:
        return int(self.depths.max().item())

    @classmethod
    def chain(cls, root_token: int | torch.Tensor, draft_tokens: torch.Tensor) -> "DraftTree":
        """A chain (top_k=1 tree): root followed by ``draft_tokens`` in order."""
        device = draft_tokens.device
        n = 1 + draft_tokens.shape[0]
        tokens = torch.cat([torch.as_tensor([root_token], device=device).long().view(1), draft_tokens.long()])
        parents = torch.arange(-1, n - 1, device=device)
        depths = torch.arange(n, device=device)
        expanded = torch.arange(n - 1, device=device)
        return cls(
            tokens=tokens,
            parents=parents,
            depths=depths,
            scores=torch.zeros(n, device=device),
            expanded=expanded,
            candidate_tokens=tokens[1:].view(-1, 1),
            candidate_nodes=torch.arange(1, n, device=device).view(-1, 1),
        )

    def ancestor_matrix(self) -> torch.Tensor:
        """(n, n) bool: ``A[i, j]`` is True when node j is node i or one of its ancestors.

        Pointer jumping: after step s every row holds its ancestors less than 2**s levels up,
        so ceil(log2 n) steps suffice and the loop count needs no host read of the depth.
        """
        n = len(self)
        device = self.tokens.device
        jump = self.parents.clone()
        jump[0] = 0
        anc = torch.eye(n, dtype=torch.bool, device=device)
        for _ in range((n - 1).bit_length()):
            anc |= anc[jump]
            jump = jump[jump]
        return anc

    def position_ids(self, past_length: int) -> torch.Tensor:
        """(1, n) position of every node: past length + depth."""
        return (self.depths + past_length).view(1, -1)

    def attention_mask(
        self, past_length: int, dtype: torch.dtype, sliding_window: int | None = None
    ) -> torch.Tensor:
        """Additive float mask (1, 1, n, past_length + n) for one target forward over the tree.

        0 where a node may attend (the whole cached prefix and its own ancestors), the dtype's
        minimum elsewhere. Float, not bool: eager attention adds the mask.
        """
        allowed = torch.cat(
            [
                torch.ones(len(self), past_length, dtype=torch.bool, device=self.tokens.device),
                self.ancestor_matrix(),
            ],
            dim=1,
        )
        if sliding_window is not None:
            query_pos = self.position_ids(past_length).view(-1, 1)
            key_pos = torch.cat([torch.arange(past_length, device=self.tokens.device), query_pos.view(-1)])
            allowed &= key_pos.view(1, -1) > query_pos - sliding_window
        return additive_mask(allowed, dtype)

    def root_to_leaf_paths(self) -> torch.Tensor:
        """(num_leaves, max_depth + 1) node indices of every root-to-leaf path, ``-1`` padded."""
        n = len(self)
        is_parent = torch.zeros(n, dtype=torch.bool, device=self.tokens.device)
        is_parent[self.parents[1:]] = True
        leaves = (~is_parent).nonzero().view(-1)
        anc = self.ancestor_matrix()[leaves]  # (L, n)
        paths = torch.full((leaves.shape[0], self.max_depth + 1), -1, dtype=torch.long, device=self.tokens.device)
        rows, cols = anc.nonzero(as_tuple=True)
        paths[rows, self.depths[cols]] = cols
        return paths

    def children(self, node: int) -> torch.Tensor:
        """Indices of the tree nodes whose parent is ``node``."""
        return (self.parents == node).nonzero().view(-1)

    def path_tokens(self, node: int) -> torch.Tensor:
        """Tokens on the path from the root's first child down to ``node`` (root excluded)."""
        ids = []
        while node > 0:
            ids.append(node)
            node = int(self.parents[node])
        ids.reverse()
        return self.tokens[torch.as_tensor(ids, dtype=torch.long, device=self.tokens.device)]


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Turn a bool (q, k) "may attend" matrix into a (1, 1, q, k) additive float mask."""
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.view(1, 1, *allowed.shape)


def causal_mask(past_length: int, new_length: int, dtype: torch.dtype, device, sliding_window: int | None = None):
    """Additive (1, 1, new, past + new) causal mask for ``new_length`` tokens after a cache."""
    q = torch.arange(past_length, past_length + new_length, device=device).view(-1, 1)
    k = torch.arange(past_length + new_length, device=device).view(1, -1)
    allowed = k <= q
    if sliding_window is not None:
        allowed &= k > q - sliding_window
    return additive_mask(allowed, dtype)
