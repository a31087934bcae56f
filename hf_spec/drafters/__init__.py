"""Drafter families: one module per family, each a PretrainedConfig + PreTrainedModel."""

from .base import SpecDrafterConfig, SpecDrafterModel
from .eagle import EagleDrafter, EagleDrafterConfig
from .eagle3 import Eagle3Drafter, Eagle3DrafterConfig
from .ngram import NGramDrafter, NGramDrafterConfig
from .parallel import ParallelDrafter, ParallelDrafterConfig
from .sorted import SortedDrafter, SortedDrafterConfig

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
]
