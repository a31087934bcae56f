"""Config of the EAGLE family (:class:`EagleDrafterConfig`, also HASS and CORAL checkpoints; the base of EAGLE-3's
and ParallelSpec's) and the target families its decoder layers come from (:data:`DECODER_LAYERS`)."""

from __future__ import annotations

from transformers import PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
from transformers.models.mistral.modeling_mistral import MistralDecoderLayer, MistralRotaryEmbedding
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

from ..base import SpecDrafterConfig
from ..layer_config import _NOT_LAYER_FIELDS, decoder_layer_config


DECODER_LAYERS = {
    "llama": (LlamaDecoderLayer, LlamaRotaryEmbedding),
    "qwen2": (Qwen2DecoderLayer, Qwen2RotaryEmbedding),
    "mistral": (MistralDecoderLayer, MistralRotaryEmbedding),
}
"""model_type -> (decoder layer class, rotary embedding class) taken from transformers."""


class EagleDrafterConfig(SpecDrafterConfig):
    """Config of :class:`EagleDrafter`.

    Args:
        num_layers: decoder layers in the drafter (EAGLE/HASS/CORAL: 1).
        layer_config: the target's decoder settings (heads, intermediate size, RoPE, norm eps…)
            as a dict; the layers are built with the target family's own transformers classes.
        router_num_groups: vocabulary groups of CORAL's LM-head router (None: no router;
            CORAL: 16). See :mod:`hf_spec.drafters.eagle.router`.
        router_top_n: groups whose LM-head rows are computed per draft row (CORAL: 2).
        use_router: draft through the router when the checkpoint has one (``generate(...,
            use_router=False)`` turns it off for one call).
    """

    model_type = "hf_spec_eagle"
    default_training_method = "eagle"

    def __init__(
        self,
        num_layers: int = 1,
        layer_config: dict | None = None,
        router_num_groups: int | None = None,
        router_top_n: int = 2,
        use_router: bool = True,
        **kwargs,
    ):
        self.num_layers = num_layers
        self.layer_config = layer_config or {}
        self.router_num_groups = router_num_groups
        self.router_top_n = router_top_n
        self.use_router = use_router
        super().__init__(**kwargs)

    @classmethod
    def for_target(cls, target_config: PretrainedConfig, name_or_path: str | None = None, **kwargs):
        """A config shaped for ``target_config`` (the target's ``config``); ``kwargs`` override its fields."""
        text_config = target_config.get_text_config()
        if text_config.model_type not in DECODER_LAYERS:
            raise ValueError(
                f"EagleDrafter supports targets of types {sorted(DECODER_LAYERS)}, got {text_config.model_type!r}. "
                "Fix: add the family's decoder layer and rotary classes to hf_spec.drafters.eagle.config.DECODER_LAYERS."
            )
        layer_config = {k: v for k, v in text_config.to_dict().items() if k not in _NOT_LAYER_FIELDS}
        layer_config["model_type"] = text_config.model_type
        return cls(**{"layer_config": layer_config, **cls.target_fields(target_config, name_or_path), **kwargs})

    def decoder_layer_config(self) -> PretrainedConfig:
        """The transformers config the drafter's decoder layers are built from."""
        fields = dict(self.layer_config)
        model_type = fields.pop("model_type", self.target_model_type)
        if model_type not in DECODER_LAYERS:
            raise ValueError(f"Unsupported drafter layer family {model_type!r}; supported: {sorted(DECODER_LAYERS)}.")
        return decoder_layer_config(model_type, fields, self.num_layers)

