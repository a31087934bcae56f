"""Batching cached feature examples for drafter training."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .data import AUX_COLUMN, features_from_storage


@dataclass
class FeatureCollator:
    """Right-pads ``input_ids``/``loss_mask``/``hidden_states`` examples into a batch.

    Examples come from a feature cache (:func:`hf_spec.training.data.load_feature_cache`):
    ``hidden_states`` in the cache's ``storage`` encoding are decoded and cast to ``dtype``.
    Sequences longer than ``max_length`` are truncated. Returns ``input_ids`` (b, L) long,
    ``hidden_states`` (b, L, H), ``loss_mask`` and ``attention_mask`` (b, L) long; padding has
    id ``pad_token_id``, zero features and zero masks. Right padding keeps every real position's
    causal context unchanged, so no padding mask is needed inside the drafter. Examples of a cache
    extended with target layer inputs (EAGLE-3, :data:`~hf_spec.training.data.AUX_COLUMN`) also give
    ``aux_hidden_states`` (b, L, k*H), padded the same way.
    """

    storage: str = "float32"
    dtype: torch.dtype = torch.float32
    max_length: int | None = None
    pad_token_id: int = 0

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        cut = self.max_length
        ids = [torch.as_tensor(e["input_ids"], dtype=torch.long)[:cut] for e in examples]
        masks = [torch.as_tensor(e["loss_mask"], dtype=torch.long)[:cut] for e in examples]
        feats = [features_from_storage(e["hidden_states"], self.storage)[:cut] for e in examples]
        longest = max(t.numel() for t in ids)
        batch = len(examples)
        out = {
            "input_ids": torch.full((batch, longest), self.pad_token_id, dtype=torch.long),
            "hidden_states": torch.zeros(batch, longest, feats[0].shape[-1], dtype=self.dtype),
            "loss_mask": torch.zeros(batch, longest, dtype=torch.long),
            "attention_mask": torch.zeros(batch, longest, dtype=torch.long),
        }
        for r, (i, m, f) in enumerate(zip(ids, masks, feats)):
            n = i.numel()
            out["input_ids"][r, :n] = i
            out["loss_mask"][r, :n] = m
            out["hidden_states"][r, :n] = f.to(self.dtype)
            out["attention_mask"][r, :n] = 1
        if AUX_COLUMN in examples[0]:
            aux = [features_from_storage(e[AUX_COLUMN], self.storage)[:cut] for e in examples]
            out[AUX_COLUMN] = torch.zeros(batch, longest, aux[0].shape[-1], dtype=self.dtype)
            for r, a in enumerate(aux):
                out[AUX_COLUMN][r, : a.shape[0]] = a.to(self.dtype)
        return out
