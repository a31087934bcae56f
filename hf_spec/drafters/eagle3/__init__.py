"""The EAGLE-3 family: :class:`Eagle3Drafter` fuses several target layers and scores its own draft head.

- :mod:`.config`: :class:`Eagle3DrafterConfig` (the EAGLE config's fields plus the fused layers);
- :mod:`.model`: :class:`Eagle3Drafter`. Its drafting session is the EAGLE family's
  (:class:`~hf_spec.drafters.eagle.session.EagleDraftingSession`).
"""

from .config import Eagle3DrafterConfig, default_aux_layer_ids
from .model import Eagle3DecoderLayer, Eagle3Drafter

__all__ = ["Eagle3DecoderLayer", "Eagle3Drafter", "Eagle3DrafterConfig", "default_aux_layer_ids"]
