"""hf-spec: lossless tree speculative decoding with trained drafters inside ``generate()``.

``import hf_spec`` registers the drafter classes with ``AutoConfig``/``AutoModel`` and installs
the one integration point (see :mod:`hf_spec.generation`): afterwards
``target.generate(input_ids, assistant_model=drafter)`` runs hf-spec's tree decoding.
"""

from .hardware import configure_mkl

configure_mkl()  # before any float32 product: MKL reads it at its first call (hf_spec.hardware)

from transformers import AutoConfig, AutoModel  # noqa: E402

from .drafters import (
    Eagle3Drafter,
    Eagle3DrafterConfig,
    EagleDrafter,
    EagleDrafterConfig,
    NGramDrafter,
    NGramDrafterConfig,
    ParallelDrafter,
    ParallelDrafterConfig,
    SortedDrafter,
    SortedDrafterConfig,
    SpecDrafterConfig,
    SpecDrafterModel,
)
from .hub.convert import AutoDrafter
from .generation import install, speculative_decode, uninstall
from .resources import PACKAGED_MODELS, load_packaged_model, packaged_model_path
from .stats import GenerationStats
from .tree.dynamic import TreeShape
from .tree.tree import DraftTree

__version__ = "0.1.0"

DRAFTER_CLASSES = {
    EagleDrafterConfig.model_type: (EagleDrafterConfig, EagleDrafter),
    Eagle3DrafterConfig.model_type: (Eagle3DrafterConfig, Eagle3Drafter),
    SortedDrafterConfig.model_type: (SortedDrafterConfig, SortedDrafter),
    ParallelDrafterConfig.model_type: (ParallelDrafterConfig, ParallelDrafter),
}
"""model_type -> (config class, model class) of every drafter family."""

for _model_type, (_config_class, _model_class) in DRAFTER_CLASSES.items():
    AutoConfig.register(_model_type, _config_class, exist_ok=True)
    AutoModel.register(_config_class, _model_class, exist_ok=True)

install()

__all__ = [
    "AutoDrafter",
    "EagleDrafter",
    "EagleDrafterConfig",
    "Eagle3Drafter",
    "Eagle3DrafterConfig",
    "NGramDrafter",
    "NGramDrafterConfig",
    "SortedDrafter",
    "SortedDrafterConfig",
    "ParallelDrafter",
    "ParallelDrafterConfig",
    "SpecDrafterConfig",
    "SpecDrafterModel",
    "GenerationStats",
    "DraftTree",
    "TreeShape",
    "DRAFTER_CLASSES",
    "install",
    "uninstall",
    "speculative_decode",
    "load_packaged_model",
    "packaged_model_path",
    "PACKAGED_MODELS",
]
