"""KV-cache compaction: keep the accepted path of a verified tree, drop the rest."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from . import compat


def keep_accepted(cache: DynamicCache, prefix_length: int, accepted_nodes: torch.Tensor,
                  contiguous: bool | None = None) -> None:  # fmt: skip
    """Compact ``cache`` in place to ``prefix_length`` + the accepted tree nodes.

    After a tree forward the cache holds ``prefix_length`` positions followed by one entry
    per tree node (in tree order). ``accepted_nodes`` (root first, then accepted drafts,
    increasing) are moved down to follow the prefix; everything after them is dropped.
    ``contiguous``: whether they are 0, 1, ..., a (None: check on device, one host sync).
    """
    keep = accepted_nodes.to(torch.long) + prefix_length
    new_length = prefix_length + keep.numel()
    if contiguous and new_length == cache.get_seq_length():
        return  # every verified node was accepted, in order (a plain step, a whole chain): nothing to drop
    if contiguous is None:
        contiguous = bool((keep == torch.arange(prefix_length, new_length, device=keep.device)).all())
    if not contiguous:
        move_slots(cache, keep, prefix_length)
    for layer, keys, values in compat.cache_layers_kv(cache):
        compat.set_layer_kv(layer, keys[..., :new_length, :], values[..., :new_length, :])


def move_slots(cache, source: torch.Tensor, start: int) -> None:
    """In every layer of ``cache`` (dynamic or static), copy the keys and values of slots ``source`` (increasing,
    each >= ``start``) to slots ``start``, ``start + 1``, ... in place; the layers keep their length."""
    end = start + source.numel()
    for _, keys, values in compat.cache_layers_kv(cache):
        index = source.to(keys.device)
        keys[..., start:end, :] = keys.index_select(-2, index)
        values[..., start:end, :] = values.index_select(-2, index)


def crop_to(cache: DynamicCache, length: int) -> None:
    """Drop every cached position from ``length`` on."""
    compat.crop_cache(cache, length)


def gather_positions(cache: DynamicCache, prefix_length: int, index: torch.Tensor) -> None:
    """Per-row compaction: row b's slots ``index[b]`` move to ``prefix_length`` onwards, the rest after them go.

    ``index``: (batch, m) absolute cache slots (each row its own); afterwards every layer
    holds ``prefix_length + m`` positions. The batched counterpart of :func:`keep_accepted`
    (rows accept different tree nodes) and, with ``prefix_length=0``, of re-packing a cache.
    """
    new_length = prefix_length + index.shape[1]
    for layer, keys, values in compat.cache_layers_kv(cache):
        rows = index.to(keys.device).view(index.shape[0], 1, index.shape[1], 1)
        rows = rows.expand(-1, keys.shape[1], -1, keys.shape[-1])
        keys[..., prefix_length:new_length, :] = keys.gather(-2, rows)
        values[..., prefix_length:new_length, :] = values.gather(-2, rows)
        compat.set_layer_kv(layer, keys[..., :new_length, :], values[..., :new_length, :])


def select_rows(cache: DynamicCache, rows: torch.Tensor) -> None:
    """Keep only the batch rows ``rows`` (in that order) of every layer."""
    for layer, keys, values in compat.cache_layers_kv(cache):
        index = rows.to(keys.device)
        compat.set_layer_kv(layer, keys.index_select(0, index), values.index_select(0, index))
