"""The ParallelSpec family: an EAGLE drafter plus k learned ``[MASK]`` embeddings, k+1 depths from one forward.

- :mod:`.config`: :class:`ParallelDrafterConfig`;
- :mod:`.model`: :class:`ParallelDrafter`;
- :mod:`.session`: :class:`ParallelDraftingSession`.
"""

from .config import DEFAULT_TREE_WIDTHS, ParallelDrafterConfig
from .model import ParallelDrafter
from .session import ParallelDraftingSession

__all__ = ["DEFAULT_TREE_WIDTHS", "ParallelDrafter", "ParallelDrafterConfig", "ParallelDraftingSession"]
