"""Every touch of transformers internals lives here (tested against transformers>=5.23,<5.24).

- ``DynamicCache.layers[i].keys/.values`` are read and reassigned to compact the cache.
- ``GenerationMixin.generate`` is wrapped (see :mod:`hf_spec.generation`), and its
  ``custom_generate=callable`` hook is used to run our decoding loop inside transformers'
  own argument preparation.
"""

from __future__ import annotations

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


def pad_token_tensor(generation_config):
    """The pad token ``generate()`` prepared (it falls back to the first EOS id), or None."""
    return getattr(generation_config, "_pad_token_tensor", None)
