"""Hub integration: remote code + ``auto_map`` (:mod:`.remote_code`), model cards (:mod:`.cards`),
``push_to_hub`` (:mod:`.push`), conversion of other formats (:mod:`.convert`) and export to them (:mod:`.export`).

The drafters never import this package: importing it fills their Hub hooks
(:data:`hf_spec.drafters.registry.HUB_HOOKS`), which :class:`~hf_spec.drafters.base.SpecDrafterModel`'s
``save_pretrained`` (:func:`after_save_pretrained`), ``push_to_hub`` (:func:`push_drafter_to_hub`) and
``from_pretrained`` (:func:`hf_spec.hub.convert.convert_to_family`) call. ``import hf_spec`` imports it.
"""

from __future__ import annotations

import os

from ..drafters.registry import HUB_HOOKS
from .convert import convert_to_family


def after_save_pretrained(model, save_directory: str | os.PathLike, *, bench_results=None, training_info=None,
                          is_main_process: bool = True) -> None:  # fmt: skip
    """What hf-spec adds to transformers' ``save_pretrained``: remote code, ``auto_map``, README.md and the card's
    inputs (:func:`hf_spec.hub.cards.write_model_card`)."""
    if not is_main_process:
        return
    from .cards import write_model_card
    from .remote_code import write_remote_code

    write_remote_code(model, save_directory)
    write_model_card(model.config, save_directory, bench_results=bench_results, training_info=training_info)


def push_drafter_to_hub(model, repo_id: str, **kwargs) -> str:
    from .push import push_drafter_to_hub as push

    return push(model, repo_id, **kwargs)


HUB_HOOKS.update(save=after_save_pretrained, push=push_drafter_to_hub, convert=convert_to_family)

__all__ = ["after_save_pretrained", "push_drafter_to_hub"]
