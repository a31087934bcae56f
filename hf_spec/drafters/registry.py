"""The table of drafter families: ``model_type`` -> (config class, model class).

One table that loading (:class:`~hf_spec.AutoDrafter`), checkpoint conversion (:mod:`hf_spec.hub.convert`) and
model cards (:mod:`hf_spec.hub.cards`) read, so they look a family up by its ``model_type`` without importing the
drafter modules (which import the Hub code back when they save or load). This module imports nothing of hf_spec;
:mod:`hf_spec.drafters` fills it when the package is imported, which Python does before any of its modules,
this one included, runs.
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModel

__all__ = ["DRAFTER_CLASSES", "drafter_classes", "register"]

DRAFTER_CLASSES: dict[str, tuple[type, type]] = {}
"""model_type -> (config class, model class) of every drafter family."""


def register(config_class: type, model_class: type) -> None:
    """Add a family to :data:`DRAFTER_CLASSES` and to transformers' ``AutoConfig``/``AutoModel``."""
    DRAFTER_CLASSES[config_class.model_type] = (config_class, model_class)
    AutoConfig.register(config_class.model_type, config_class, exist_ok=True)
    AutoModel.register(config_class, model_class, exist_ok=True)


def drafter_classes(model_type: str) -> tuple[type, type]:
    """(config class, model class) of the family ``model_type``; a ValueError naming the registered types if none."""
    try:
        return DRAFTER_CLASSES[model_type]
    except KeyError:
        raise ValueError(f"{model_type!r} is not a registered hf-spec drafter type ({sorted(DRAFTER_CLASSES)}).") from None
