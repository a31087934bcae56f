"""Config of the S2D family (:class:`SortedDrafterConfig`): the kept layers, the exits and each target's
thresholds."""

from __future__ import annotations

import warnings

from transformers import PreTrainedModel, PretrainedConfig

from ... import compat
from ..base import SpecDrafterConfig
from ..eagle.config import DECODER_LAYERS
from ..layer_config import decoder_layer_config


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

