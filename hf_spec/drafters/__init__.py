"""Drafter families: one module per family, each a PretrainedConfig + PreTrainedModel.

Importing this package registers every family in :mod:`.registry` (the table
``model_type`` -> classes) and with transformers' ``AutoConfig``/``AutoModel``.
:class:`~hf_spec.AutoDrafter` lives in :mod:`.auto`, which this package does not import (it imports the
Hub converters, :mod:`hf_spec.hub.convert`); ``hf_spec`` exports it.
"""

from .base import SpecDrafterConfig, SpecDrafterModel
from .eagle import EagleDrafter, EagleDrafterConfig
from .eagle3 import Eagle3Drafter, Eagle3DrafterConfig
from .ngram import NGramDrafter, NGramDrafterConfig
from .parallelspec import ParallelDrafter, ParallelDrafterConfig
from .registry import DRAFTER_CLASSES, register
from .s2d import SortedDrafter, SortedDrafterConfig

for _config_class, _model_class in (
    (EagleDrafterConfig, EagleDrafter),
    (Eagle3DrafterConfig, Eagle3Drafter),
    (SortedDrafterConfig, SortedDrafter),
    (ParallelDrafterConfig, ParallelDrafter),
    (NGramDrafterConfig, NGramDrafter),
):
    register(_config_class, _model_class)
del _config_class, _model_class

__all__ = [
    "SpecDrafterConfig",
    "SpecDrafterModel",
    "EagleDrafter",
    "EagleDrafterConfig",
    "Eagle3Drafter",
    "Eagle3DrafterConfig",
    "NGramDrafter",
    "NGramDrafterConfig",
    "ParallelDrafter",
    "ParallelDrafterConfig",
    "SortedDrafter",
    "SortedDrafterConfig",
    "DRAFTER_CLASSES",
]
