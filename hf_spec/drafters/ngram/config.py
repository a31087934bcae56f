"""Config of :class:`~hf_spec.NGramDrafter` and its tree shape."""

from __future__ import annotations

from ...tree.dynamic import TreeShape
from ..base import SpecDrafterConfig
from ..session import check_node_count
from .trie import DEFAULT_DRAFT_BRANCHES, DEFAULT_DRAFT_DEPTH, DEFAULT_DRAFT_NODES


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
            of 1-64 tokens on the target (:func:`hf_spec.verify_cost.verify_costs`: a curve timed once in a few
            seconds, corrected by the verifications decoding runs; :func:`relative_node_costs`), so the trees grow
            where verifying more tokens is almost free (a GPU, a CPU with AMX) and shrink where it is not. A number
            c: every verified node costs c one-token decoding steps (0.035 suits SmolLM2-135M bf16 on a 2-core Zen
            4). Each cycle keeps the best-first prefix of its tree that maximizes (1 + expected accepted tokens) /
            cost (:func:`scored_trie`); 0: always ``num_draft_tokens`` nodes.
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
        self.copy_nodes = check_node_count(copy_nodes, "copy_nodes")
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

