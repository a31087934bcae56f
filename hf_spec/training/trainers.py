"""``transformers.Trainer`` subclasses that train feature drafters on cached target features.

The Trainer's model is the drafter (bound to the frozen target, whose embedding and LM head it
borrows and never optimises or saves). Batches come from :class:`~hf_spec.training.collators.FeatureCollator`.
Only ``compute_loss`` is overridden, so everything else (accelerate multi-process, gradient
accumulation, checkpoints, ``resume_from_checkpoint``, ``push_to_hub``) is the stock Trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import Trainer, TrainingArguments

from .losses import eagle_loss, hass_loss, shift_for_drafter


@dataclass
class EagleTrainingArguments(TrainingArguments):
    """EAGLE's recipe (Li et al., 2024): AdamW (β2 = 0.95), lr 3e-5 with linear warmup/decay,
    grad clip 0.5, loss = 1.0 * SmoothL1(features) + 0.1 * CE(target distribution), inputs
    perturbed with U(-0.1, 0.1) noise."""

    w_reg: float = field(default=1.0, metadata={"help": "weight of the SmoothL1 feature regression loss (EAGLE: 1.0)"})
    w_cls: float = field(default=0.1, metadata={"help": "weight of the cross-entropy to the target's distribution (EAGLE: 0.1)"})
    feature_noise: float = field(default=0.1, metadata={"help": "half-width of uniform noise added to the input features (EAGLE: 0.1)"})
    max_length: int = field(default=2048, metadata={"help": "training sequences are truncated to this many tokens"})
    # paper defaults for inherited fields
    learning_rate: float = field(default=3e-5, metadata={"help": "peak AdamW learning rate (EAGLE: 3e-5)"})
    adam_beta2: float = field(default=0.95, metadata={"help": "AdamW beta2 (EAGLE: 0.95)"})
    max_grad_norm: float = field(default=0.5, metadata={"help": "gradient clipping norm (EAGLE: 0.5)"})
    warmup_steps: float = field(default=2000, metadata={"help": "linear warmup steps (EAGLE: 2000)"})
    lr_scheduler_type: str = field(default="linear", metadata={"help": "schedule after warmup (EAGLE: linear decay)"})
    per_device_train_batch_size: int = field(default=4, metadata={"help": "sequences per device and step (EAGLE: 4)"})
    remove_unused_columns: bool = field(default=False, metadata={"help": "must stay False: the collator needs loss_mask"})


@dataclass
class HassTrainingArguments(EagleTrainingArguments):
    """HASS's recipe (Zhang et al., 2025): EAGLE's + Top-K distillation (K = 10, w = 1.0) and
    3-step harmonized context alignment with step weights β^(j-1), β = 1.0."""

    hass_steps: int = field(default=3, metadata={"help": "harmonized context alignment steps n (HASS: 3; 1 = no alignment)"})
    hass_beta: float = field(default=1.0, metadata={"help": "step j's loss is weighted by beta^(j-1) (HASS: 1.0; 0.5 helped 70B)"})
    topk: int = field(default=10, metadata={"help": "K of the Top-K distillation loss (HASS: 10)"})
    w_topk: float = field(default=1.0, metadata={"help": "weight w of the Top-K loss (HASS: 1.0)"})


def _drafter_inputs(trainer: Trainer, inputs: dict):
    ids, feats_in, feats_target, mask = shift_for_drafter(
        inputs["input_ids"], inputs["hidden_states"], inputs["loss_mask"], inputs.get("attention_mask")
    )
    noise = trainer.args.feature_noise
    if noise and trainer.model.training:
        feats_in = feats_in + (torch.rand_like(feats_in) * 2 - 1) * noise
    return ids, feats_in, feats_target, mask


class EagleTrainer(Trainer):
    """Trains an :class:`~hf_spec.EagleDrafter` with EAGLE's loss."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        drafter = self.accelerator.unwrap_model(model)
        ids, feats_in, feats_target, mask = _drafter_inputs(self, inputs)
        predicted = model(input_ids=ids, hidden_states=feats_in).last_hidden_state
        select = mask.bool()  # LM head and softmaxes only where the loss counts (the CPU cost of a step)
        if not select.any():
            loss = predicted.sum() * 0.0
            return (loss, {"loss": loss}) if return_outputs else loss
        predicted, feats_target = predicted[select], feats_target[select]
        with torch.no_grad():
            target_logits = drafter.lm_logits(feats_target)
        out = eagle_loss(predicted, feats_target, drafter.lm_logits(predicted), target_logits, None,
                         self.args.w_reg, self.args.w_cls)  # fmt: skip
        return (out["loss"], out) if return_outputs else out["loss"]


class HassTrainer(Trainer):
    """Trains an :class:`~hf_spec.EagleDrafter` with HASS's loss (:func:`~hf_spec.training.losses.hass_loss`)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        drafter = self.accelerator.unwrap_model(model)
        ids, feats_in, feats_target, mask = _drafter_inputs(self, inputs)
        args = self.args
        out = hass_loss(drafter, ids, feats_in, feats_target, mask, num_steps=args.hass_steps, beta=args.hass_beta,
                        w_topk=args.w_topk, topk=args.topk, w_reg=args.w_reg, w_cls=args.w_cls, forward=model)  # fmt: skip
        return (out["loss"], out) if return_outputs else out["loss"]
