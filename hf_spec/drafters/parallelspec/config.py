"""Config of the ParallelSpec family (:class:`ParallelDrafterConfig`): the EAGLE config plus the ``[MASK]`` count
and the static tree's widths."""

from __future__ import annotations

from ...tree.static import static_tree_size
from ..eagle.config import EagleDrafterConfig


DEFAULT_TREE_WIDTHS = (4, 2, 2, 1, 1)
"""Children per expanded node at depths 1..5 (paper A.3: wide near the root, narrowing)."""


class ParallelDrafterConfig(EagleDrafterConfig):
    """Config of :class:`ParallelDrafter`.

    Args:
        num_mask_tokens: k, the number of ``[MASK]`` embeddings; one forward drafts k+1 depths.
        tree_widths: children per expanded node at depths 1..len(tree_widths) (<= k+1) of the
            static draft tree. Every drafted node above the last depth is expanded, so the tree
            has w1 + w1*w2 + ... nodes (default (4, 2, 2, 1, 1): 60).
        Other fields: as :class:`EagleDrafterConfig`. ``tree_depth``/``tree_top_k``/
        ``tree_total_tokens`` default to the widths' depth, first width and tree size.
    """

    model_type = "hf_spec_parallel"
    default_training_method = "parallelspec"

    def __init__(self, num_mask_tokens: int = 4, tree_widths=None, **kwargs):
        self.num_mask_tokens = int(num_mask_tokens)
        if self.num_mask_tokens < 1:
            raise ValueError(f"num_mask_tokens must be >= 1, got {num_mask_tokens!r}.")
        widths = list(tree_widths) if tree_widths is not None else list(DEFAULT_TREE_WIDTHS[: self.num_mask_tokens + 1])
        if len(widths) > self.num_mask_tokens + 1:
            raise ValueError(
                f"tree_widths has {len(widths)} depths but {self.num_mask_tokens} [MASK] tokens draft at most "
                f"{self.num_mask_tokens + 1}. Fix: shorten tree_widths or raise num_mask_tokens."
            )
        self.tree_widths = widths
        kwargs.setdefault("tree_depth", len(widths))
        kwargs.setdefault("tree_top_k", widths[0] if widths else 1)
        kwargs.setdefault("tree_total_tokens", static_tree_size(widths)[0])
        super().__init__(**kwargs)

