"""Drafter families: one package per family (:mod:`.eagle`, :mod:`.eagle3`, :mod:`.parallelspec`, :mod:`.s2d`,
:mod:`.ngram`), each with its config (a PretrainedConfig), model (a PreTrainedModel) and drafting session; the
shared pieces (:mod:`.base`, :mod:`.session`, :mod:`.hybrid`, :mod:`.registry`, :mod:`.auto`) beside them.

Importing this package registers every family in :mod:`.registry` (the table
``model_type`` -> classes) and with transformers' ``AutoConfig``/``AutoModel``.
:class:`~hf_spec.AutoDrafter` lives in :mod:`.auto`, which this package does not import (it imports the
Hub converters, :mod:`hf_spec.hub.convert`); ``hf_spec`` exports it.
"""

from .base import SpecDrafterConfig, SpecDrafterModel
from .eagle.config import EagleDrafterConfig
from .eagle.model import EagleDrafter
from .eagle3.config import Eagle3DrafterConfig
from .eagle3.model import Eagle3Drafter
from .ngram.config import NGramDrafterConfig
from .ngram.model import NGramDrafter
from .parallelspec.config import ParallelDrafterConfig
from .parallelspec.model import ParallelDrafter
from .registry import DRAFTER_CLASSES, register
from .s2d.config import SortedDrafterConfig
from .s2d.model import SortedDrafter

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
