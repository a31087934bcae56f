"""The table of drafter families: ``model_type`` -> (config class, model class).

One table that loading (:class:`~hf_spec.AutoDrafter`), checkpoint conversion (:mod:`hf_spec.hub.convert`) and
model cards (:mod:`hf_spec.hub.cards`) read, so they look a family up by its ``model_type`` without importing the
drafter modules; and the Hub hooks (:data:`HUB_HOOKS`) that the drafters call when they save, push or load.
This module imports nothing of hf_spec; :mod:`hf_spec.drafters` fills the table when the package is imported,
which Python does before any of its modules, this one included, runs.
"""

from __future__ import annotations

from collections.abc import Callable

from transformers import AutoConfig, AutoModel

__all__ = ["DRAFTER_CLASSES", "HUB_HOOKS", "drafter_classes", "register"]

DRAFTER_CLASSES: dict[str, tuple[type, type]] = {}
"""model_type -> (config class, model class) of every drafter family."""


HUB_HOOKS: dict[str, Callable] = {}
"""What :class:`~hf_spec.drafters.base.SpecDrafterModel` asks of the Hub code without importing it, so that the
drafter modules stay free of :mod:`hf_spec.hub` and their remote-code copies need no cut. :mod:`hf_spec.hub`
fills it when imported (``import hf_spec`` imports it):

- ``"save"``: ``(model, save_directory, *, bench_results, training_info, is_main_process)``, after transformers'
  ``save_pretrained`` (remote code, ``auto_map``, model card);
- ``"push"``: ``(model, repo_id, **kwargs) -> url``, ``push_to_hub``;
- ``"convert"``: ``(model_class, name_or_path, target, target_config, kwargs) -> drafter | None``, a checkpoint
  of another format converted to ``model_class`` (None: an hf-spec checkpoint, loaded by transformers).

Empty (a remote-code copy), the drafters save, push and load as transformers' own classes do."""


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
