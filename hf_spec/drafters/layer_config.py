"""The one builder of the transformers config a drafter's decoder layers are made from.

EAGLE drafters, S2D sorted drafters (their layers and their plain causal-LM form) and the
speculators export all build "a target family's config, with N full-attention layers" the same
way; the sliding-window and attention-implementation policy lives here only.
"""

from __future__ import annotations

from transformers import AutoConfig, PretrainedConfig

from .. import compat

_NOT_LAYER_FIELDS = {
    "architectures", "auto_map", "quantization_config", "_name_or_path", "transformers_version", "dtype",
    "torch_dtype", "model_type", "num_hidden_layers", "layer_types", "id2label", "label2id", "tie_word_embeddings",
    "max_window_layers", "use_sliding_window", "_attn_implementation_autoset", "output_attentions",
}  # fmt: skip
"""Fields of a target's (or an EAGLE checkpoint's) config that a drafter's ``layer_config`` leaves out."""


def decoder_layer_config(
    model_type: str,
    fields: dict,
    num_layers: int,
    *,
    attn_implementation: str | None = "sdpa",
    drop_sliding_window: bool = True,
) -> PretrainedConfig:
    """``AutoConfig.for_model(model_type, **fields)`` with ``num_layers`` full-attention layers.

    Args:
        model_type: the transformers family (``llama``, ``qwen2``, ``mistral``…).
        fields: the config fields (without ``model_type``).
        num_layers: ``num_hidden_layers``; ``layer_types`` (where the family has it) becomes
            ``num_layers`` times ``"full_attention"``.
        attn_implementation: set on the config (drafter layers attend through explicit 4D masks,
            hence ``"sdpa"``); None leaves transformers' default.
        drop_sliding_window: Mistral keeps its window in ``sliding_window`` rather than in
            ``layer_types``; drafters attend through explicit masks only, so it is cleared.
            ``SortedDrafter.to_causal_lm`` keeps it (False), as it always has.
    """
    config = AutoConfig.for_model(model_type, **fields)
    config.num_hidden_layers = num_layers
    if hasattr(config, "layer_types"):
        config.layer_types = ["full_attention"] * num_layers
    if drop_sliding_window and model_type == "mistral":
        config.sliding_window = None
    if attn_implementation is not None:
        compat.set_attn_implementation(config, attn_implementation)
    return config
