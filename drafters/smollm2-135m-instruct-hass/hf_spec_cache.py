# Generated from hf_spec/cache.py of hf-spec 0.1.0 by hf_spec.hub.remote_code; do not edit (see modeling_hf_spec.py).
"""KV-cache compaction: keep the accepted path of a verified tree, drop the rest."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from . import hf_spec_compat as compat


def keep_accepted(cache: DynamicCache, prefix_length: int, accepted_nodes: torch.Tensor) -> None:
    """Compact ``cache`` in place to ``prefix_length`` + the accepted tree nodes.

    After a tree forward the cache holds ``prefix_length`` positions followed by one entry
    per tree node (in tree order). ``accepted_nodes`` (root first, then accepted drafts,
    increasing) are moved down to follow the prefix; everything after them is dropped.
    """
    keep = accepted_nodes.to(torch.long) + prefix_length
    new_length = prefix_length + keep.numel()
    contiguous = bool((keep == torch.arange(prefix_length, new_length, device=keep.device)).all())
    for layer, keys, values in compat.cache_layers_kv(cache):
        index = keep.to(keys.device)
        if not contiguous:
            keys[..., prefix_length:new_length, :] = keys.index_select(-2, index)
            values[..., prefix_length:new_length, :] = values.index_select(-2, index)
        compat.set_layer_kv(layer, keys[..., :new_length, :], values[..., :new_length, :])


def crop_to(cache: DynamicCache, length: int) -> None:
    """Drop every cached position from ``length`` on."""
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)  # transformers 5.x: a negative count of positions to remove
