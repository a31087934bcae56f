""":class:`AutoDrafter`: load any drafter hf-spec understands, from a local directory or a Hub repo id.

hf-spec's own checkpoints load through transformers' ``AutoModel`` (every family is registered with it when
:mod:`hf_spec.drafters` is imported, which Python does before this module runs); EAGLE-1/2, HASS, EAGLE-3 and
speculators ``eagle3`` checkpoints are converted in memory by :mod:`hf_spec.hub.convert` (its ``CONVERTERS``
table). That module looks the families up in :mod:`hf_spec.drafters.registry` and never imports this one, so
the import goes one way: ``drafters.auto`` -> ``hub.convert`` -> ``drafters.registry``/``drafters.layer_config``.
"""

from __future__ import annotations

from ..hub.convert import CONVERTERS, resolve, split_hub_kwargs

__all__ = ["AutoDrafter"]


class AutoDrafter:
    """Loads any drafter hf-spec understands: its own checkpoints through ``AutoModel``, EAGLE-1/2 and
    HASS checkpoints converted to :class:`~hf_spec.EagleDrafter`, EAGLE-3 and speculators ``eagle3``
    ones to :class:`~hf_spec.Eagle3Drafter` (see :mod:`hf_spec.hub.convert`)."""

    def __init__(self):
        raise TypeError("AutoDrafter is not instantiated; use AutoDrafter.from_pretrained(path, target=...).")

    @classmethod
    def from_pretrained(cls, name_or_path, target=None, *, target_config=None, **kwargs):
        """The drafter at a local directory or Hub repo id, bound to ``target`` when given.

        Args:
            target: the loaded target model (required for EAGLE/HASS checkpoints unless ``target_config``).
            target_config: the target's config, name or path (EAGLE/HASS without ``target``).
            kwargs: ``from_pretrained`` options (``dtype``, ``revision``…); EAGLE/HASS: those of
                :func:`~hf_spec.hub.convert.convert_eagle` and the Hub download options.
        """
        hub_kwargs = split_hub_kwargs(kwargs)
        layout, path = resolve(name_or_path, **hub_kwargs)
        if layout in CONVERTERS:
            return CONVERTERS[layout][1](path, target, target_config, source=str(name_or_path), **kwargs)
        from transformers import AutoModel  # the drafter classes are registered with it (hf_spec.drafters)

        drafter = AutoModel.from_pretrained(str(path or name_or_path), **hub_kwargs, **kwargs)
        return drafter.bind(target) if target is not None else drafter
