"""N-gram branches grafted into a trained drafter's trees (:class:`NGramBranches`, used by
:mod:`hf_spec.drafters.hybrid`)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from ...tree.dynamic import TreeShape
from ...tree.tree import DraftTree
from .index import Continuation, NGramIndex
from .trie import (DEFAULT_DRAFT_BRANCHES, TrieNodes, copy_budget, graft_trie, ranked_continuations, scored_trie,
                   trie_to_draft_tree)


class NGramBranches:
    """Context n-gram branches for a trained drafter's trees (the ``ngram_nodes`` option).

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
        ``node_cost`` as :class:`~hf_spec.NGramDrafter` cuts its trees (:func:`scored_trie`)."""
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

