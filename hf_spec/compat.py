"""Every touch of transformers internals lives here (tested against transformers>=5.23,<5.24).

- ``DynamicCache.layers[i].keys/.values`` are read and reassigned to compact the cache.
- Two logits processors' per-row state is re-indexed for one batch row (:func:`row_logits_processor`).
- ``GenerationMixin.generate`` is wrapped (see :mod:`hf_spec.generation`), and its
  ``custom_generate=callable`` hook is used to run our decoding loop inside transformers'
  own argument preparation.
"""

from __future__ import annotations

import copy

import torch
from transformers import DynamicCache

SUPPORTED_TRANSFORMERS = ">=5.23,<5.24"


def full_dynamic_cache() -> DynamicCache:
    """A DynamicCache whose layers keep every position.

    Built without a config on purpose: sliding-window layers drop old positions, while the
    tree path indexes the cache by absolute position and applies any sliding window in its
    attention masks instead.
    """
    return DynamicCache()


def cache_layers_kv(cache: DynamicCache):
    """Yield (layer, keys, values) for every initialised layer of a DynamicCache."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", True) and layer.keys is not None and layer.keys.numel():
            yield layer, layer.keys, layer.values


def set_layer_kv(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
    layer.keys = keys
    layer.values = values


def crop_cache_layers(cache: DynamicCache, layer_indices, length: int) -> None:
    """Keep the first ``length`` positions of the given layers only (layers may differ in length)."""
    for index in layer_indices:
        if index >= len(cache.layers):
            continue
        layer = cache.layers[index]
        if not getattr(layer, "is_initialized", True) or layer.keys is None or layer.keys.numel() == 0:
            continue
        if layer.keys.shape[-2] > length:
            set_layer_kv(layer, layer.keys[..., :length, :], layer.values[..., :length, :])


def attn_implementation(config) -> str | None:
    """The attention implementation a model (config) runs with: transformers' private ``config._attn_implementation``."""
    return getattr(config, "_attn_implementation", None)


def set_attn_implementation(config, implementation: str) -> None:
    """Set ``config._attn_implementation`` (the private attribute a model's attention layers read at call time)."""
    config._attn_implementation = implementation


def pad_token_tensor(generation_config):
    """The pad token ``generate()`` prepared (it falls back to the first EOS id), or None."""
    return getattr(generation_config, "_pad_token_tensor", None)


def row_logits_processor(processors, row: int):
    """A copy of a batch's ``LogitsProcessorList`` for batch row ``row`` called with that row alone.

    Processors are row-wise, but two of transformers' own carry per-row state indexed by the
    row's place in the batch: ``RepetitionPenaltyLogitsProcessor.prompt_ignore_length`` (a
    tensor of left-padding lengths) and ``PrefixConstrainedLogitsProcessor`` (calls its
    function with the batch id). Those are copied with the row's entry; the rest are shared.
    """
    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import (
        PrefixConstrainedLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
    )

    out = LogitsProcessorList()
    for processor in processors:
        if isinstance(processor, RepetitionPenaltyLogitsProcessor) and isinstance(
            processor.prompt_ignore_length, torch.Tensor
        ):
            processor = copy.copy(processor)
            processor.prompt_ignore_length = int(processor.prompt_ignore_length[row])
        elif isinstance(processor, PrefixConstrainedLogitsProcessor):
            processor = copy.copy(processor)
            allowed = processor._prefix_allowed_tokens_fn
            processor._prefix_allowed_tokens_fn = lambda batch_id, sent, allowed=allowed: allowed(row, sent)
        out.append(processor)
    return out
