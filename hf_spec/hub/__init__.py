"""Hub integration: remote code + ``auto_map`` (:mod:`.remote_code`), model cards (:mod:`.cards`),
``push_to_hub`` (:mod:`.push`) and export to other formats (:mod:`.export`).

:class:`~hf_spec.drafters.base.SpecDrafterModel` calls :func:`after_save_pretrained` from its
``save_pretrained`` and :func:`push_drafter_to_hub` from its ``push_to_hub``.
"""

from __future__ import annotations

import os


def after_save_pretrained(model, save_directory: str | os.PathLike, *, bench_results=None, training_info=None,
                          is_main_process: bool = True) -> None:  # fmt: skip
    """What hf-spec adds to transformers' ``save_pretrained``: remote code, ``auto_map``, README.md."""
    if not is_main_process:
        return
    from .cards import write_model_card
    from .remote_code import write_remote_code

    write_remote_code(model, save_directory)
    write_model_card(model.config, save_directory, bench_results=bench_results, training_info=training_info)


def push_drafter_to_hub(model, repo_id: str, **kwargs) -> str:
    from .push import push_drafter_to_hub as push

    return push(model, repo_id, **kwargs)


__all__ = ["after_save_pretrained", "push_drafter_to_hub"]
