"""The S2D family's training losses, which :meth:`~hf_spec.SortedDrafter.forward` computes when given labels:
sorted fine-tuning's (:func:`sorted_loss`) and the frozen-backbone exits' distillation (:func:`exit_distillation_loss`).
:mod:`hf_spec.training.losses` re-exports them."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sorted_loss(logits_per_exit, labels: torch.Tensor) -> torch.Tensor:
    """Sorted fine-tuning loss (S2D Eq. 3): mean over exits of each exit's next-token cross-entropy.

    ``logits_per_exit``: one (b, s, V) tensor per exit; ``labels``: (b, s) aligned with the
    inputs as for a causal LM (position t predicts ``labels[:, t + 1]``), -100 ignored.
    """
    targets = labels[:, 1:].reshape(-1)
    if not bool((targets != -100).any()):  # e.g. every label outside the draft vocabulary: no signal, not NaN
        return sum(logits.sum() for logits in logits_per_exit) * 0.0
    losses = [
        F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), targets, ignore_index=-100)
        for logits in logits_per_exit
    ]
    return torch.stack(losses).mean()


def exit_distillation_loss(logits_per_exit, labels: torch.Tensor) -> torch.Tensor:
    """Frozen-backbone S2D exits (:meth:`hf_spec.SortedDrafter.add_exit_adapters`): mean over the early exits of
    the cross-entropy from the last exit's (detached) distribution, i.e. KL distillation from the model the
    last exit *is*, over whatever vocabulary the exits score (the draft vocabulary, if any).

    ``labels``: (b, s) as for a causal LM; only which positions count is read (position t counts when
    ``labels[:, t + 1] != -100``), so self-distilled labels outside the draft vocabulary still count.
    """
    *early, last = logits_per_exit
    valid = labels[:, 1:] != -100
    if not early:
        raise ValueError("exit_distillation_loss needs at least two exits (early exits learn from the last).")
    if not bool(valid.any()):
        return sum(logits.sum() for logits in early) * 0.0
    teacher = torch.softmax(last[:, :-1][valid].float(), dim=-1).detach()
    losses = [-(teacher * torch.log_softmax(logits[:, :-1][valid].float(), dim=-1)).sum(-1).mean() for logits in early]
    return torch.stack(losses).mean()
