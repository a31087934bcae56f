"""Drafter training: losses, data (features cached from the target), collators, Trainers.

Importing this package does not import ``datasets``; the modules do when used.
"""

from .losses import eagle_loss, hass_loss, hass_step_mask, masked_mean, shift_for_drafter, topk_distillation_loss

__all__ = ["eagle_loss", "hass_loss", "hass_step_mask", "masked_mean", "shift_for_drafter", "topk_distillation_loss"]
