"""hf-spec: lossless tree speculative decoding with trained drafters inside ``generate()``.

``import hf_spec`` registers the drafter classes with ``AutoConfig``/``AutoModel`` (:mod:`hf_spec.drafters`)
and installs the one integration point (see :mod:`hf_spec.generation`): afterwards
``target.generate(input_ids, assistant_model=drafter)`` runs hf-spec's tree decoding.
"""

from .hardware import configure_mkl, cpu_name, dtype_name, resolve_dtype

configure_mkl()  # before any float32 product: MKL reads it at its first call (hf_spec.hardware)

from .drafters import (  # noqa: E402
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
from .attention_kernels import attention_choices, few_query_attention
from .controller import SpeedController
from .drafters.auto import AutoDrafter
from .drafters.session import DraftingSession
from .drafters.registry import DRAFTER_CLASSES
from .generation import install, speculative_decode, uninstall
from .linear_kernels import few_row_linears, kernel_choices
from .resources import PACKAGED_MODELS, load_packaged_model, packaged_model_path
from .stats import GenerationStats
from .tree.dynamic import TreeShape
from .tree.tree import DraftTree
from .version import __version__

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
    "DraftingSession",
    "GenerationStats",
    "SpeedController",
    "DraftTree",
    "TreeShape",
    "DRAFTER_CLASSES",
    "install",
    "uninstall",
    "speculative_decode",
    "few_row_linears",
    "few_query_attention",
    "kernel_choices",
    "attention_choices",
    "load_packaged_model",
    "packaged_model_path",
    "PACKAGED_MODELS",
    "resolve_dtype",
    "dtype_name",
    "cpu_name",
]
