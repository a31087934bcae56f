"""Drafter training losses (pure functions of tensors)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean of ``values`` (..., ) over positions where ``mask`` is 1 (all positions if None)."""
    if mask is None:
        return values.mean()
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def eagle_loss(
    predicted_features: torch.Tensor,
    target_features: torch.Tensor,
    predicted_logits: torch.Tensor,
    target_logits: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    w_reg: float = 1.0,
    w_cls: float = 0.1,
) -> dict[str, torch.Tensor]:
    """EAGLE's loss: SmoothL1 feature regression + cross-entropy against the target's distribution.

    Shapes: features (b, s, H), logits (b, s, V), ``loss_mask`` (b, s). Returns a dict with
    ``loss`` (= w_reg * reg + w_cls * cls), ``reg`` and ``cls``.
    """
    reg = F.smooth_l1_loss(predicted_features.float(), target_features.float(), reduction="none").mean(-1)
    target_probs = torch.softmax(target_logits.float(), dim=-1)
    cls = -(target_probs * torch.log_softmax(predicted_logits.float(), dim=-1)).sum(-1)
    reg, cls = masked_mean(reg, loss_mask), masked_mean(cls, loss_mask)
    return {"loss": w_reg * reg + w_cls * cls, "reg": reg, "cls": cls}


def sorted_loss(logits_per_exit, labels: torch.Tensor) -> torch.Tensor:
    """Sorted fine-tuning loss (S2D Eq. 3): mean over exits of each exit's next-token cross-entropy.

    ``logits_per_exit``: one (b, s, V) tensor per exit; ``labels``: (b, s) aligned with the
    inputs as for a causal LM (position t predicts ``labels[:, t + 1]``), -100 ignored.
    """
    targets = labels[:, 1:].reshape(-1)
    losses = [
        F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), targets, ignore_index=-100)
        for logits in logits_per_exit
    ]
    return torch.stack(losses).mean()
