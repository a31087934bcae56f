"""What every hf-spec drafter shares: the target it was made for, binding to that target,
validation with clear errors, and the tree-shape defaults used by ``generate()``."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from transformers import GenerationConfig, PretrainedConfig, PreTrainedModel

from .. import compat, draft_vocab
from ..shape_select import check_candidates, renamed_options
from ..tree.dynamic import TreeShape
from .datastore import find_datastore
from .registry import HUB_HOOKS
from .session import DraftingSession, check_node_count


CHECKPOINT_FORMAT_VERSION = "0.1"
"""Version of the drafter checkpoint format written into every config (``hf_spec_version``)."""


def _check_format_version(saved: str | None, config_name: str) -> None:
    """Refuse configs written by a newer checkpoint format than this package understands."""
    if saved is None:
        return
    try:
        saved_key = tuple(int(part) for part in str(saved).split(".")[:2])
    except ValueError:
        raise ValueError(f"{config_name}: unreadable hf_spec_version {saved!r} in the drafter config.") from None
    ours = tuple(int(part) for part in CHECKPOINT_FORMAT_VERSION.split("."))
    if saved_key > ours:
        raise ValueError(
            f"This drafter was saved with hf-spec checkpoint format {saved}, newer than the {CHECKPOINT_FORMAT_VERSION} "
            "this installation reads. Fix: upgrade hf-spec (`pip install -U hf-spec`)."
        )


def _suffix_length(value, name: str) -> int:
    """``value`` if it is a positive integer (a count of context suffix tokens), else a ValueError naming ``name``."""
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer (suffix tokens), got {value!r}.")
    return value


class SpecDrafterConfig(PretrainedConfig):
    """Base config: names the target a drafter was made for and the default tree shape.

    Args:
        target_model_name_or_path: name or path of the target model (informative).
        target_model_type: the target's ``model_type`` (``llama``, ``qwen2``, ``mistral``…).
        target_architectures: the target's ``architectures``.
        target_hidden_size / target_vocab_size: must equal the target's; checked at bind time.
        tree_depth / tree_top_k / tree_total_tokens: default draft-tree shape for generate().
        tree_min_prob: default confidence floor of dynamic trees (0: off; :class:`~hf_spec.tree.dynamic.TreeShape`):
            nodes whose cumulative draft probability is below it are neither grown nor verified.
        tree_shape_candidates: optional list of shapes (``generate()`` options ``tree_depth``,
            ``tree_top_k``, ``tree_total_tokens``, ``tree_min_prob``, ``ngram_nodes``) with the ``tau`` and
            ``verified_nodes`` each achieved on held-aside prompts (:mod:`hf_spec.shape_select`): the rungs the
            online controller (:mod:`hf_spec.controller`) chooses among at run time, its measured cycles deciding.
        auto_tree_shape: use the candidates when a call sets none of those options (None: true
            when there are candidates); false keeps the configured shape.
        training_method: how the checkpoint was trained (``eagle``, ``hass``, ``coral``, ``s2d``,
            ``parallelspec``); picks the model card and citation. None: the family's default
            (:attr:`default_training_method`).
        draft_vocab_size: D, the size of the draft vocabulary (:mod:`hf_spec.draft_vocab`): the
            drafter scores only D target ids, held in its ``d2t``/``t2d`` buffers. None: the full
            target vocabulary.
        ngram_nodes: up to this many nodes of context n-gram continuations are grafted into each drafted
            tree, whatever the family (:mod:`hf_spec.drafters.hybrid`; 0: off). ``generate(...,
            ngram_nodes=N)`` overrides it for one call. (:class:`~hf_spec.NGramDrafter` drafts n-gram trees
            alone and ignores the ``ngram_*`` fields.)
        ngram_depth: deepest grafted n-gram node (None: the drafter tree's depth). N-gram continuations cost no
            drafter forward, only verification rows, so they may reach deeper than the drafter's own tree.
        ngram_max_match: the longest context suffix the n-gram index matches (default 4). Continuations of longer
            matches rank first, and a match of the whole ``ngram_max_match`` tokens makes a copy cycle.
        ngram_copy_nodes: on a cycle whose context repeats the whole ``ngram_max_match``-token suffix (the text is
            being copied, e.g. an edit of code in the prompt), up to this many n-gram nodes are grafted instead of
            ``ngram_nodes`` (0: no such boost); under ``ngram_cost_gate``, the budget of a copy cycle's trie.
        ngram_cost_gate: decide each cycle by expected value whether to run the drafter at all. Every cycle builds
            the n-gram trie as :class:`~hf_spec.NGramDrafter` would (up to ``ngram_copy_nodes``, else 16, nodes to
            ``ngram_depth``, cut by this machine's measured verification cost); the drafter runs, its tree taking
            that trie's nodes as branches (at most ``ngram_nodes`` of them but on a copy cycle: no node the cost
            cut dropped), only when the tokens it has added so far to tries of the same expected yield (exact in
            greedy decoding) pay for its forwards and nodes (:class:`~hf_spec.drafters.ngram.CycleGate`); else the
            trie alone is verified. Needs ``ngram_nodes`` > 0. Default False.
        ngram_branches: the old name of ``ngram_nodes`` (it counted nodes), still read with a FutureWarning.
    """

    model_type = "hf_spec_drafter"
    default_training_method: str | None = None
    """Training method assumed when ``training_method`` is None (set by each family)."""

    def __init__(
        self,
        target_model_name_or_path: str | None = None,
        target_model_type: str | None = None,
        target_architectures: list[str] | None = None,
        target_hidden_size: int | None = None,
        target_vocab_size: int | None = None,
        tree_depth: int = 6,
        tree_top_k: int = 8,
        tree_total_tokens: int = 60,
        initializer_range: float = 0.02,
        training_method: str | None = None,
        draft_vocab_size: int | None = None,
        hf_spec_version: str | None = None,
        tree_shape_candidates: list[dict] | None = None,
        auto_tree_shape: bool | None = None,
        tree_min_prob: float = 0.0,
        ngram_nodes: int | None = None,
        ngram_depth: int | None = None,
        ngram_max_match: int = 4,
        ngram_copy_nodes: int = 0,
        ngram_cost_gate: bool = False,
        ngram_branches: int | None = None,
        **kwargs,
    ):
        _check_format_version(hf_spec_version, type(self).__name__)
        self.hf_spec_version = hf_spec_version or CHECKPOINT_FORMAT_VERSION
        self.target_model_name_or_path = target_model_name_or_path
        self.target_model_type = target_model_type
        self.target_architectures = target_architectures
        self.target_hidden_size = target_hidden_size
        self.target_vocab_size = target_vocab_size
        self.tree_depth = tree_depth
        self.tree_top_k = tree_top_k
        self.tree_total_tokens = tree_total_tokens
        self.tree_min_prob = tree_min_prob
        self.initializer_range = initializer_range
        self.training_method = training_method
        if draft_vocab_size is not None and (not isinstance(draft_vocab_size, int) or draft_vocab_size < 1):
            raise ValueError(f"draft_vocab_size must be a positive integer or None (full vocabulary), got {draft_vocab_size!r}.")
        self.draft_vocab_size = draft_vocab_size
        self.tree_shape_candidates = check_candidates(tree_shape_candidates) or None
        self.auto_tree_shape = auto_tree_shape
        nodes = renamed_options(dict(ngram_nodes=ngram_nodes, ngram_branches=ngram_branches), type(self).__name__)
        self.ngram_nodes = check_node_count(nodes.get("ngram_nodes") or 0)
        self.ngram_max_match = _suffix_length(ngram_max_match, "ngram_max_match")
        self.ngram_copy_nodes = check_node_count(ngram_copy_nodes, "ngram_copy_nodes")
        if ngram_depth is not None and (not isinstance(ngram_depth, int) or ngram_depth < 1):
            raise ValueError(f"ngram_depth must be a positive integer or None (the tree depth), got {ngram_depth!r}.")
        self.ngram_depth = ngram_depth
        self.ngram_cost_gate = bool(ngram_cost_gate)
        super().__init__(**kwargs)

    @property
    def resolved_training_method(self) -> str | None:
        """``training_method``, or the family default when it is None."""
        return self.training_method or self.default_training_method

    @staticmethod
    def target_fields(target_config: PretrainedConfig, name_or_path: str | None = None) -> dict:
        """The ``target_*`` fields describing ``target_config``."""
        text_config = target_config.get_text_config()
        return dict(
            target_model_name_or_path=name_or_path or compat.model_name_or_path(target_config) or None,
            target_model_type=text_config.model_type,
            target_architectures=list(getattr(target_config, "architectures", None) or []),
            target_hidden_size=text_config.hidden_size,
            target_vocab_size=text_config.vocab_size,
        )

    def check_target(self, target: PreTrainedModel) -> None:
        """Raise ``ValueError`` naming the mismatch and the fix if ``target`` is not this drafter's target."""
        text_config = target.config.get_text_config()
        made_for = self.target_model_name_or_path or "its original target"
        problems = []
        if self.target_hidden_size is not None and text_config.hidden_size != self.target_hidden_size:
            problems.append(f"hidden size {text_config.hidden_size} != drafter's {self.target_hidden_size}")
        if self.target_vocab_size is not None and text_config.vocab_size != self.target_vocab_size:
            problems.append(f"vocab size {text_config.vocab_size} != drafter's {self.target_vocab_size}")
        if self.target_model_type is not None and text_config.model_type != self.target_model_type:
            problems.append(f"architecture {text_config.model_type!r} != drafter's {self.target_model_type!r}")
        if problems:
            raise ValueError(
                f"This {type(self).__name__} drafter was made for {made_for} and cannot serve the given target "
                f"({compat.model_name_or_path(target.config) or type(target).__name__}): "
                + "; ".join(problems)
                + f". Fix: load the target the drafter was trained for ({made_for}), or train a drafter for this "
                "target (training_scripts/, or `from_target(target)` for a fresh one)."
            )
        target_name = compat.model_name_or_path(target.config)
        if self.target_model_name_or_path and target_name and target_name != self.target_model_name_or_path:
            warnings.warn(
                f"Drafter was trained for {self.target_model_name_or_path!r} but is bound to {target_name!r}; "
                "shapes match, so it will run, but acceptance may be low.",
                stacklevel=3,
            )

    def tree_shape(self) -> TreeShape:
        return TreeShape(depth=self.tree_depth, top_k=self.tree_top_k, total_tokens=self.tree_total_tokens)


class SpecDrafterModel(PreTrainedModel):
    """Base class of hf-spec drafters.

    The target's input embedding and LM head are *borrowed* at :meth:`bind` time: they are
    not submodules, never trained and never saved. ``generate()`` binds an unbound drafter to
    the model it is called on. After a generation, :attr:`last_generation_stats` holds
    cycles, accepted drafts per cycle and τ.

    With ``config.draft_vocab_size`` set the drafter has a draft vocabulary
    (:mod:`hf_spec.draft_vocab`): persistent ``d2t``/``t2d`` buffers, and :meth:`draft_logits`
    scores only those rows of the borrowed head. :meth:`set_draft_vocab` attaches one.
    """

    config_class = SpecDrafterConfig
    base_model_prefix = "drafter"
    supports_gradient_checkpointing = False
    _supports_sdpa = True
    _no_split_modules = []
    supports_tree_min_prob = False
    """Whether the family grows dynamic trees that honour ``tree_min_prob`` (EAGLE family)."""
    supports_ngram_branches = True
    """Whether context n-gram branches can be grafted into the family's trees (``ngram_nodes``): every trained
    family; not :class:`~hf_spec.NGramDrafter`, whose trees are n-gram tries already."""

    def __init__(self, config: SpecDrafterConfig):
        super().__init__(config)
        self._borrowed = None  # (embedding, lm_head) of the bound target
        self._draft_head = None  # (key, DraftHead): cached rows of the head at the draft ids
        self.last_generation_stats = None
        self.ngram_datastore = None
        """An :class:`~hf_spec.drafters.datastore.NGramDatastore` whose corpus continuations join the n-gram
        branches (``ngram_nodes``); saved as ``ngram_datastore.safetensors`` beside the weights and loaded
        back by ``from_pretrained``. Set it to None to draft n-gram branches from the context alone."""
        if config.draft_vocab_size is not None:  # placeholder map; the checkpoint's buffers replace it
            self._register_draft_vocab(torch.arange(config.draft_vocab_size))
        self.generation_config = GenerationConfig(
            tree_depth=config.tree_depth, tree_top_k=config.tree_top_k, tree_total_tokens=config.tree_total_tokens
        )

    # -- binding ---------------------------------------------------------------------------
    @classmethod
    def from_target(cls, target: PreTrainedModel, name_or_path: str | None = None, **config_kwargs):
        """A fresh (untrained) drafter shaped for ``target`` and bound to it."""
        config = cls.config_class.for_target(target.config, name_or_path=name_or_path, **config_kwargs)
        drafter = cls(config).to(device=target.device, dtype=target.dtype)
        return drafter.bind(target)

    def bind(self, target: PreTrainedModel):
        """Make the drafter serve ``target`` (``generate()`` does it for an unbound drafter): the family's
        step (:meth:`_attach_target`: validate ``target`` and borrow its embedding and LM head), then the
        draft vocabulary is checked against its vocabulary and the drafter moves to its device and dtype."""
        self._attach_target(target)
        if self.has_draft_vocab:
            draft_vocab.validate(self.d2t, self.t2d, target.config.get_text_config().vocab_size)
        if self.device != target.device or self.dtype != target.dtype:
            self.to(device=target.device, dtype=target.dtype)
        self._bound_target_config = target.config
        return self

    def _attach_target(self, target: PreTrainedModel) -> None:
        """What :meth:`bind` takes from ``target``, per family: here, check that it is this drafter's
        target and borrow its input embedding and LM head (a family that borrows nothing overrides it)."""
        self.config.check_target(target)
        embedding = target.get_input_embeddings()
        lm_head = target.get_output_embeddings()
        if embedding is None or lm_head is None:
            raise ValueError(f"{type(target).__name__} has no input embedding or LM head; it cannot be a target.")
        self._borrowed = (embedding, lm_head)

    @property
    def is_bound(self) -> bool:
        return self._borrowed is not None

    def is_bound_to(self, target: PreTrainedModel) -> bool:
        return self._borrowed is not None and self._borrowed[0] is target.get_input_embeddings()

    def _require_bound(self):
        if self._borrowed is None:
            raise RuntimeError(
                f"{type(self).__name__} is not bound to a target. Call `drafter.bind(target)` (generate() does it "
                "for you when you pass the drafter as `assistant_model`)."
            )
        return self._borrowed

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The target's (frozen) token embedding."""
        embedding, _ = self._require_bound()
        with torch.no_grad():
            return embedding(input_ids)

    def lm_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The target's (frozen) LM head; gradients flow to ``hidden_states`` only. Without autograd (decoding) the
        head module itself runs, so that it takes the few-row kernel chosen for it (:func:`hf_spec.few_row_linears`)."""
        _, lm_head = self._require_bound()
        if not torch.is_grad_enabled():
            return lm_head(hidden_states)
        bias = lm_head.bias.detach() if getattr(lm_head, "bias", None) is not None else None
        return F.linear(hidden_states, lm_head.weight.detach(), bias)

    # -- draft vocabulary (hf_spec.draft_vocab) ---------------------------------------------
    def clear_draft_vocab(self):
        """Draft over the full target vocabulary again (drops ``d2t``/``t2d``); returns self."""
        for name in ("d2t", "t2d"):
            if name in self._buffers:
                del self._buffers[name]
        self._draft_head = None
        self.config.draft_vocab_size = None
        return self

    def _register_draft_vocab(self, draft_ids: torch.Tensor) -> None:
        vocab = self.config.target_vocab_size
        if vocab is None:
            raise ValueError("A draft vocabulary needs the drafter config's target_vocab_size.")
        device = self.d2t.device if getattr(self, "d2t", None) is not None else None
        draft_ids = torch.as_tensor(draft_ids, dtype=torch.long, device=device)
        self.register_buffer("d2t", draft_vocab.d2t_from_ids(draft_ids), persistent=True)
        self.register_buffer("t2d", draft_vocab.t2d_from_ids(draft_ids, vocab), persistent=True)
        self._draft_head = None

    def set_draft_vocab(self, counts_or_ids, size: int | None = None):
        """Attach a draft vocabulary: the ``size`` most frequent ids of token counts (V,) (ties by lower id),
        or, with ``size`` None, exactly the given token ids. Sets ``config.draft_vocab_size``; returns self."""
        ids = draft_vocab.draft_ids_from(counts_or_ids, size, self.config.target_vocab_size)
        self._register_draft_vocab(ids)
        self.config.draft_vocab_size = int(ids.numel())
        return self

    @property
    def has_draft_vocab(self) -> bool:
        return getattr(self, "d2t", None) is not None

    @property
    def draft_ids(self) -> torch.Tensor | None:
        """Target ids of the draft vocabulary (D,), ascending; None without one."""
        return draft_vocab.ids_from_d2t(self.d2t) if self.has_draft_vocab else None

    def _draft_lm_head(self) -> torch.nn.Module:
        """The LM head whose rows the draft vocabulary selects: the borrowed target head."""
        return self._require_bound()[1]

    def draft_head(self) -> draft_vocab.DraftHead:
        """The borrowed LM head's rows at the draft ids, copied once per (head, dtype, device, map)."""
        lm_head = self._draft_lm_head()
        weight = lm_head.weight  # _version: an in-place update (a trained head) invalidates the copy
        key = (weight.data_ptr(), weight._version, weight.dtype, weight.device, self.d2t.data_ptr(), self.d2t._version)
        if self._draft_head is None or self._draft_head[0] != key:
            self._draft_head = (key, draft_vocab.DraftHead(weight, getattr(lm_head, "bias", None), self.draft_ids))
        return self._draft_head[1]

    def decoding_modules(self) -> tuple[torch.nn.Module, ...]:
        """Modules the drafter runs while decoding that are not its submodules: with a draft vocabulary, the copy of
        the head's rows at the draft ids (:meth:`draft_head`). ``generate()`` runs them through the few-row kernels
        with the drafter's own layers (:func:`hf_spec.few_row_linears`)."""
        return (self.draft_head().linear,) if self.has_draft_vocab else ()

    def draft_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary (..., D) (the full head (..., V) without one); gradients flow
        to ``hidden_states`` only."""
        return self.draft_head().logits(hidden_states) if self.has_draft_vocab else self.lm_logits(hidden_states)

    @torch.no_grad()
    def training_targets(self, target_features: torch.Tensor, argmax_ids: torch.Tensor | None = None):
        """(target logits in :meth:`draft_logits`' space, classification mask or None) of target features.

        With a draft vocabulary: the target's logits at the draft ids, and a mask of positions whose
        full-vocabulary argmax is a draft id (EAGLE-3: the others leave the classification terms).
        ``argmax_ids``: the target's full-vocabulary argmax at each position when it is already known
        (self-distilled data, whose next tokens are the target's own greedy choices); then only the
        draft rows of the head are computed, not the full head."""
        if not self.has_draft_vocab:
            return self.lm_logits(target_features), None
        if argmax_ids is not None:
            return self.draft_head().logits(target_features), self.t2d.to(argmax_ids.device)[argmax_ids]
        return draft_vocab.restrict_target_logits(self.lm_logits(target_features), self.draft_ids, self.t2d)

    # -- training/saving helpers -------------------------------------------------------------
    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, torch.nn.Linear):
            module.weight.data.normal_(mean=0.0, std=std)
            if module.bias is not None:
                module.bias.data.zero_()
        elif hasattr(module, "weight") and isinstance(getattr(module, "weight", None), torch.nn.Parameter):
            if module.weight.dim() == 1:  # norms
                module.weight.data.fill_(1.0)
        elif hasattr(module, "inv_freq"):  # rotary embeddings
            # inv_freq is a non-persistent buffer: from_pretrained builds the model on the meta device and
            # relies on _init_weights to recompute it; without this it stays uninitialized memory.
            super()._init_weights(module)

    def tree_shape(self, depth=None, top_k=None, total_tokens=None) -> TreeShape:
        """Tree shape for one generation: explicit values, else the drafter's generation_config."""
        gc = self.generation_config
        return TreeShape(
            depth=depth if depth is not None else getattr(gc, "tree_depth", self.config.tree_depth),
            top_k=top_k if top_k is not None else getattr(gc, "tree_top_k", self.config.tree_top_k),
            total_tokens=total_tokens
            if total_tokens is not None
            else getattr(gc, "tree_total_tokens", self.config.tree_total_tokens),
        )

    def target_feature_layers(self) -> tuple[int, ...] | None:
        """Target layers whose inputs (HF ``hidden_states[i]``) the drafter reads, concatenated, as its
        features; None (the default): the target's last, post-norm hidden state."""
        return None

    def new_drafting_session(
        self, target: PreTrainedModel, shape: TreeShape, do_sample: bool, temperature: float, prompt_ids: torch.Tensor
    ) -> DraftingSession:
        """Per-generation drafting state of one sequence; each drafter family implements it.

        Returns a :class:`~hf_spec.drafters.session.DraftingSession` subclass, whose
        ``propose(features, next_tokens) -> DraftTree`` is called once per cycle with the target
        features of the newly committed positions and, for each, the token that follows it (the
        last one is the new root). ``prompt_ids`` (1, L) is the prompt, for token-level drafters
        that also need its first token.
        """
        raise NotImplementedError

    # -- Hub: hooks that hf_spec.hub fills (registry.HUB_HOOKS); without them, transformers' own behaviour --------
    def save_pretrained(self, save_directory, *args, bench_results=None, training_info=None, **kwargs):
        """transformers' ``save_pretrained``, the n-gram datastore, then (with :mod:`hf_spec.hub`) the remote code,
        ``auto_map`` and README.md card.

        Args:
            bench_results: path to, or dict of, a benchmark JSON (``hf_spec.hub.cards`` schema) whose
                results go into the card's ``model-index``; None: the card says "not measured yet".
            training_info: dict of training metadata for the card (datasets, command, epochs…).
        """
        super().save_pretrained(save_directory, *args, **kwargs)
        is_main_process = kwargs.get("is_main_process", True)
        if self.ngram_datastore is not None and is_main_process:
            self.ngram_datastore.save(save_directory)
        if "save" in HUB_HOOKS:
            HUB_HOOKS["save"](self, save_directory, bench_results=bench_results, training_info=training_info,
                              is_main_process=is_main_process)  # fmt: skip

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, target=None, target_config=None, **kwargs):
        """transformers' ``from_pretrained`` plus the checkpoint's ``ngram_datastore.safetensors`` when it has one;
        checkpoints of other formats that convert to this family (EAGLE-1/2/HASS to :class:`~hf_spec.EagleDrafter`,
        EAGLE-3 and speculators ``eagle3`` to :class:`~hf_spec.Eagle3Drafter`: :mod:`hf_spec.hub.convert`, which
        needs ``target`` or ``target_config``) are converted. With ``target`` the drafter comes back bound to it."""
        if "convert" in HUB_HOOKS:
            converted = HUB_HOOKS["convert"](cls, pretrained_model_name_or_path, target, target_config, kwargs)
            if converted is not None:
                return converted
        model = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        model.ngram_datastore = find_datastore(pretrained_model_name_or_path, **kwargs)
        return model.bind(target) if target is not None else model

    def push_to_hub(self, repo_id: str, *args, **kwargs) -> str:
        """Save (weights, config, remote code, card) and upload through huggingface_hub; see
        :func:`hf_spec.hub.push_drafter_to_hub` (transformers' own version replaces README.md). Options:
        ``bench_results``, ``training_info`` (as :meth:`save_pretrained`), ``commit_message``, ``private``…"""
        if "push" in HUB_HOOKS:
            return HUB_HOOKS["push"](self, repo_id, *args, **kwargs)
        return super().push_to_hub(repo_id, *args, **kwargs)
