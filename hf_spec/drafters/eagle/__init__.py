"""The EAGLE family: EAGLE-1/2, HASS and CORAL checkpoints share one architecture, :class:`EagleDrafter`.

- :mod:`.config`: :class:`EagleDrafterConfig` and the target families its layers come from;
- :mod:`.model`: :class:`EagleDrafter` (``fc([emb; feat])`` -> decoder layers -> the target's LM head);
- :mod:`.session`: :class:`EagleDraftingSession`, the dynamic-tree drafting of one sequence;
- :mod:`.router`: CORAL's LM-head router.

The modules import each other by module (never this package), so remote code copies them as they are.
"""

from .config import DECODER_LAYERS, EagleDrafterConfig
from .model import EagleDrafter, EagleDrafterOutput, positions_and_mask
from .session import EagleDraftingSession

__all__ = ["DECODER_LAYERS", "EagleDrafter", "EagleDrafterConfig", "EagleDrafterOutput", "EagleDraftingSession",
           "positions_and_mask"]
