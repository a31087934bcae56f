"""The weightless n-gram drafter, :class:`NGramDrafter` (see :mod:`hf_spec.drafters.ngram`)."""

from __future__ import annotations

import os

from ...tree.dynamic import TreeShape
from ..base import SpecDrafterModel
from ..datastore import find_datastore
from .config import NGramDrafterConfig, NGramTreeShape
from .session import NGramDraftingSession


class NGramDrafter(SpecDrafterModel):
    """Weightless drafter: trees of continuations of the context's suffix found earlier in the
    context (see :mod:`hf_spec.drafters.ngram`), and with a ``datastore``
    (:class:`~hf_spec.drafters.datastore.NGramDatastore`, e.g. of the target's own earlier answers) also
    found in that corpus. ``target.generate(ids, assistant_model=NGramDrafter())``;
    ``tree_depth`` / ``tree_top_k`` / ``tree_total_tokens`` override max_depth / max_branches /
    num_draft_tokens for one call."""

    config_class = NGramDrafterConfig
    supports_ngram_branches = False  # its trees are n-gram tries already

    def __init__(self, config: NGramDrafterConfig | None = None, datastore=None, **config_kwargs):
        if config is None:
            config = NGramDrafterConfig(**config_kwargs)
        elif config_kwargs:
            raise ValueError("Pass either a config or config keyword arguments to NGramDrafter, not both.")
        super().__init__(config)
        self.ngram_datastore = datastore
        self.post_init()

    def save_pretrained(self, save_directory, *args, is_main_process: bool = True, **kwargs):
        """Write the config (and ``ngram_datastore.safetensors`` when the drafter has a datastore): a weightless
        drafter has nothing else to save. :class:`~hf_spec.AutoDrafter` and :meth:`from_pretrained` read it back."""
        if not is_main_process:
            return
        os.makedirs(save_directory, exist_ok=True)
        self.config.save_pretrained(save_directory)
        if self.ngram_datastore is not None:
            self.ngram_datastore.save(save_directory)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config=None, **kwargs):
        """The drafter saved by :meth:`save_pretrained` (local directory or Hub repo): its config and datastore."""
        if not isinstance(config, NGramDrafterConfig):
            hub = {k: kwargs[k] for k in ("revision", "cache_dir", "token", "local_files_only", "force_download")
                   if k in kwargs}  # fmt: skip
            config = NGramDrafterConfig.from_pretrained(pretrained_model_name_or_path, **hub)
        return cls(config, datastore=find_datastore(pretrained_model_name_or_path, **kwargs))

    def bind(self, target):
        """Any target works: nothing to check, borrow or move (there are no weights)."""
        self._borrowed = (target.get_input_embeddings(), target.get_output_embeddings())
        self._bound_target_config = target.config
        return self

    def tree_shape(self, depth=None, top_k=None, total_tokens=None) -> NGramTreeShape:
        shape = super().tree_shape(depth, top_k, total_tokens)
        return NGramTreeShape(depth=shape.depth, top_k=shape.top_k, total_tokens=shape.total_tokens)

    def new_drafting_session(self, target, shape: TreeShape, do_sample: bool, temperature: float = 1.0, prompt_ids=None):
        """The n-gram session of one sequence; with ``config.node_cost`` None it sizes its trees by the relative
        costs :data:`FALLBACK_NODE_COST` until the loop hands it the target's measured verification costs
        (:meth:`NGramDraftingSession.use_verify_costs`)."""
        if prompt_ids is None:
            raise ValueError("NGramDrafter drafts from tokens and needs the prompt (prompt_ids).")
        return NGramDraftingSession(self.config, shape, prompt_ids, datastore=self.ngram_datastore)

