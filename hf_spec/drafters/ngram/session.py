"""Drafting session of :class:`~hf_spec.NGramDrafter`: the n-gram index of prompt + generated tokens, one scored
trie per cycle."""

from __future__ import annotations

import torch

from ...tree.dynamic import TreeShape
from ...tree.tree import DraftTree
from ..session import DraftingSession
from .config import NGramDrafterConfig
from .index import NGramIndex
from .trie import (FALLBACK_NODE_COST, copy_budget, ranked_continuations, relative_node_costs, scored_trie,
                   trie_to_draft_tree)


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

    def use_verify_costs(self, verify_ms: dict[int, float]) -> None:
        """Size the tries by this machine's measured verification costs of the target (``verify_ms``: tree size ->
        milliseconds, :func:`hf_spec.verify_cost.verify_cost_curve`): :func:`relative_node_costs`."""
        self.node_cost = relative_node_costs(verify_ms, self.max_nodes)

    def propose(self, features: torch.Tensor | None, next_tokens: torch.Tensor) -> DraftTree:
        """Index ``next_tokens`` and draft the trie of continuations under ``next_tokens[-1]``."""
        start = self.start_timing(next_tokens.device)
        self.index.extend(next_tokens.tolist())
        shape = self.shape
        longest = self.copy_depth if self.copy_nodes else shape.depth  # continuations long enough for a copy
        continuations = ranked_continuations(self.index, self.datastore, longest, self.max_occurrences)
        first = continuations[0] if continuations else None
        copy = copy_budget(first, self.index.max_match, self.copy_nodes)  # 0 unless the context repeats its suffix
        nodes, depth = (max(shape.total_tokens, copy), longest) if copy else (shape.total_tokens, shape.depth)
        trie = scored_trie(continuations, nodes, depth, shape.top_k, self.node_cost)
        tree = trie_to_draft_tree(int(next_tokens[-1]), trie, device=next_tokens.device)
        self.stop_timing(start)
        return tree

