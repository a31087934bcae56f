"""``transformers.Trainer`` subclasses that train feature drafters on cached target features.

The Trainer's model is the drafter (bound to the frozen target, whose embedding and LM head it
borrows and never optimises or saves). Batches come from :class:`~hf_spec.training.collators.FeatureCollator`.
Only ``compute_loss`` is overridden, so everything else (accelerate multi-process, gradient
accumulation, checkpoints, ``resume_from_checkpoint``, ``push_to_hub``) is the stock Trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import Enum

import torch
from transformers import Trainer, TrainingArguments

from ..drafters.eagle.router import group_mass
from .losses import (
    csra_loss_per_step,
    eagle_loss,
    hass_loss,
    next_token_ids,
    shift_for_drafter,
)


def greedy_labels_field():
    """The ``greedy_labels`` training argument, shared by the EAGLE-family and ParallelSpec trainers."""
    return field(default=False, metadata={"help": "the data's answer tokens are the target's own greedy choices "
        "(self-distilled, hf_spec.training.distill; set automatically for such caches): the draft-vocabulary mask "
        "then reads the next token instead of running the full LM head"})  # fmt: skip


@dataclass
class EagleTrainingArguments(TrainingArguments):
    """EAGLE's recipe (Li et al., 2024): AdamW (β2 = 0.95), lr 3e-5 with linear warmup/decay,
    grad clip 0.5, loss = 1.0 * SmoothL1(features) + 0.1 * CE(target distribution), inputs
    perturbed with U(-0.1, 0.1) noise."""

    w_reg: float = field(default=1.0, metadata={"help": "weight of the SmoothL1 feature regression loss (EAGLE: 1.0)"})
    w_cls: float = field(default=0.1, metadata={"help": "weight of the cross-entropy to the target's distribution (EAGLE: 0.1)"})
    feature_noise: float = field(default=0.1, metadata={"help": "half-width of uniform noise added to the input features (EAGLE: 0.1)"})
    max_length: int = field(default=2048, metadata={"help": "training sequences are truncated to this many tokens"})
    greedy_labels: bool = greedy_labels_field()
    # paper defaults for inherited fields
    learning_rate: float = field(default=3e-5, metadata={"help": "peak AdamW learning rate (EAGLE: 3e-5)"})
    adam_beta2: float = field(default=0.95, metadata={"help": "AdamW beta2 (EAGLE: 0.95)"})
    max_grad_norm: float = field(default=0.5, metadata={"help": "gradient clipping norm (EAGLE: 0.5)"})
    warmup_steps: float = field(default=2000, metadata={"help": "linear warmup steps (EAGLE: 2000)"})
    lr_scheduler_type: str = field(default="linear", metadata={"help": "schedule after warmup (EAGLE: linear decay)"})
    per_device_train_batch_size: int = field(default=4, metadata={"help": "sequences per device and step (EAGLE: 4)"})
    remove_unused_columns: bool = field(default=False, metadata={"help": "must stay False: the collator needs loss_mask"})
    train_sampling_strategy: str = field(default="group_by_length", metadata={"help": "batches of similar lengths "
        "(less padding: 22 percent fewer padded positions than random batches on the distilled SmolLM2 cache)"})  # fmt: skip


@dataclass
class HassTrainingArguments(EagleTrainingArguments):
    """HASS's recipe (Zhang et al., 2025): EAGLE's + Top-K distillation (K = 10, w = 1.0) and
    3-step harmonized context alignment with step weights β^(j-1), β = 1.0."""

    hass_steps: int = field(default=3, metadata={"help": "harmonized context alignment steps n (HASS: 3; 1 = no alignment)"})
    hass_beta: float = field(default=1.0, metadata={"help": "step j's loss is weighted by beta^(j-1) (HASS: 1.0; 0.5 helped 70B)"})
    topk: int = field(default=10, metadata={"help": "K of the Top-K distillation loss (HASS: 10)"})
    w_topk: float = field(default=1.0, metadata={"help": "weight w of the Top-K loss (HASS: 1.0)"})


RECIPE_OPTIMISER_FIELDS = ("learning_rate", "warmup_steps", "lr_scheduler_type", "per_device_train_batch_size",
                           "gradient_accumulation_steps", "max_grad_norm", "adam_beta2", "bf16")  # fmt: skip


def recipe_settings(training_args) -> dict:
    """The settings that make a run's recipe, for its summary and model card: every field a drafter's
    training-arguments class adds to ``transformers.TrainingArguments`` (loss weights, alignment or
    training-time-test steps, ...) and the optimiser's (:data:`RECIPE_OPTIMISER_FIELDS`)."""
    base = {f.name for f in fields(TrainingArguments)}
    own = [f.name for f in fields(training_args) if f.name not in base]
    values = {name: getattr(training_args, name) for name in (*own, *RECIPE_OPTIMISER_FIELDS)}
    return {name: value.value if isinstance(value, Enum) else value for name, value in values.items()}


def _drafter_inputs(trainer: Trainer, inputs: dict):
    ids, feats_in, feats_target, mask = shift_for_drafter(
        inputs["input_ids"], inputs["hidden_states"], inputs["loss_mask"], inputs.get("attention_mask")
    )
    key = getattr(trainer, "input_features", "hidden_states")
    if key != "hidden_states":  # EAGLE-3: the drafter reads other target layers; the targets stay the last hidden state
        if key not in inputs:
            raise ValueError(f"{type(trainer).__name__} needs the batch's {key!r} (the inputs of the target layers the "
                             "drafter fuses), which this feature cache lacks. Fix: train on a cache extended with "
                             "hf_spec.training.data.add_layer_features (train_eagle3.py makes one).")  # fmt: skip
        feats_in = inputs[key][:, :-1]
    noise = trainer.args.feature_noise
    if noise and trainer.model.training:
        feats_in = feats_in + (torch.rand_like(feats_in) * 2 - 1) * noise
    return ids, feats_in, feats_target, mask


def _greedy_next_tokens(trainer: Trainer, ids: torch.Tensor) -> torch.Tensor | None:
    """(b, s) the token after each drafter position (x_{t+2}: the target's own greedy choice wherever
    the loss counts, in self-distilled data), or None unless ``greedy_labels`` says the data is such."""
    if not getattr(trainer.args, "greedy_labels", False):
        return None
    return next_token_ids(ids)


class _LoggedTermsMixin:
    """Logs extra loss terms (teacher-forced top-1 per step, CSRA's balance, ...) averaged over the steps between two
    logs, and runs evaluations through ``compute_loss`` so a held-out set (``eval_dataset``, ``--eval_strategy
    steps``) logs the same terms prefixed ``eval_``: the training and held-out curves of a run."""

    logged_prefixes = ("top1",)
    """Keys of ``compute_loss``'s output dict that are logged (every key starting with one of these)."""

    def _record(self, weight: float = 1.0, **terms):
        """Add ``terms`` (name -> value) to the sums the next log averages, each counted ``weight`` times (e.g. the
        positions a batch's mean was taken over, so the logged value pools the positions exactly)."""
        sums = self.__dict__.setdefault("_term_sums", {}).setdefault("" if self.model.training else "eval_", {})
        for name, value in terms.items():
            total, count = sums.get(name, (0.0, 0.0))
            sums[name] = (total + float(value) * weight, count + weight)

    def _record_outputs(self, out: dict) -> None:
        self._record(**{k: v for k, v in out.items() if k.startswith(self.logged_prefixes)})

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """An evaluation batch: the loss and the logged terms of ``compute_loss`` (no predictions are gathered)."""
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    def log(self, logs, *args, **kwargs):
        prefix = "eval_" if any(str(key).startswith("eval_") for key in logs) else ""
        sums = self.__dict__.get("_term_sums", {}).pop(prefix, {})
        logs = {**logs, **{prefix + name: round(total / count, 5) for name, (total, count) in sums.items() if count}}
        return super().log(logs, *args, **kwargs)


class EagleTrainer(_LoggedTermsMixin, Trainer):
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
        argmax_ids = _greedy_next_tokens(self, ids)
        target_logits, cls_mask = drafter.training_targets(  # draft vocabulary only, if any
            feats_target, None if argmax_ids is None else argmax_ids[select])
        out = eagle_loss(predicted, feats_target, drafter.draft_logits(predicted), target_logits, None,
                         self.args.w_reg, self.args.w_cls, cls_mask)  # fmt: skip
        self._record_outputs(out)
        return (out["loss"], out) if return_outputs else out["loss"]


class HassTrainer(_LoggedTermsMixin, Trainer):
    """Trains an :class:`~hf_spec.EagleDrafter` with HASS's loss (:func:`~hf_spec.training.losses.hass_loss`)."""

    def _hass_loss(self, model, inputs, return_predictions: bool = False):
        """(hass_loss output, feats_target, mask) for a batch."""
        drafter = self.accelerator.unwrap_model(model)
        ids, feats_in, feats_target, mask = _drafter_inputs(self, inputs)
        args = self.args
        out = hass_loss(drafter, ids, feats_in, feats_target, mask, num_steps=args.hass_steps, beta=args.hass_beta,
                        w_topk=args.w_topk, topk=args.topk, w_reg=args.w_reg, w_cls=args.w_cls, forward=model,
                        argmax_ids=_greedy_next_tokens(self, ids), return_predictions=return_predictions,
                        detach_steps=getattr(args, "detach_steps", True))  # fmt: skip
        self._record_outputs(out)
        return out, feats_target, mask

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out = self._hass_loss(model, inputs)[0]
        return (out["loss"], out) if return_outputs else out["loss"]


@dataclass
class Eagle3TrainingArguments(HassTrainingArguments):
    """EAGLE-3's training-time test (Li et al., 2025): the drafter is unrolled ``hass_steps`` = 7 drafting
    depths on every sequence, each depth seeing exactly its decoding-time context (its own earlier outputs
    as features), with the cross-entropy to the target's distribution over the draft vocabulary at each
    depth, weighted 0.8^(j-1) as in EAGLE-3's code; no feature regression (the drafter's hidden state is
    not the target's feature) and gradients flow through the unrolled steps. HASS's Top-K distillation can
    be added on top with ``--w_topk``."""

    hass_steps: int = field(default=7, metadata={"help": "training-time test steps, i.e. drafting depths unrolled "
                                                         "(EAGLE-3: 7)"})  # fmt: skip
    hass_beta: float = field(default=0.8, metadata={"help": "step j's loss is weighted by beta^(j-1) (EAGLE-3: 0.8)"})
    w_reg: float = field(default=0.0, metadata={"help": "feature regression weight (EAGLE-3: none)"})
    w_cls: float = field(default=1.0, metadata={"help": "weight of the cross-entropy to the target's distribution "
                                                        "over the draft vocabulary (EAGLE-3: 1.0)"})  # fmt: skip
    w_topk: float = field(default=0.0, metadata={"help": "weight of HASS's Top-K distillation on top (EAGLE-3: none)"})
    feature_noise: float = field(default=0.0, metadata={"help": "half-width of uniform noise on the fused input "
                                                                "features (EAGLE-3: none)"})  # fmt: skip
    detach_steps: bool = field(default=False, metadata={"help": "feed later steps detached predictions, as HASS "
                                                                "(EAGLE-3: no, gradients flow through the steps)"})  # fmt: skip


class Eagle3Trainer(HassTrainer):
    """Trains an :class:`~hf_spec.Eagle3Drafter` with EAGLE-3's training-time test: :func:`~hf_spec.training.losses.hass_loss`
    over the fused target layers (the batch's ``aux_hidden_states``), the last hidden state giving the targets."""

    input_features = "aux_hidden_states"
    """The batch key of the drafter's input features (:func:`_drafter_inputs`)."""


@dataclass
class CoralTrainingArguments(HassTrainingArguments):
    """CORAL's recipe (Weng et al., 2025): HASS-style 3-step training with loss
    ``w_reg·L_reg + w_cls·L_cls + w_csra·L_csra`` at each step (Eq. 3), summed over the steps: w_reg 0.5
    (half of EAGLE's), w_cls 0.1, CSRA at step t an InfoNCE (temperature 0.07) whose query is step t's output
    and whose positives are the same position's outputs of steps 1..t-1 and the target's feature
    (:func:`~hf_spec.training.losses.csra_loss_per_step`). w_csra is set per target so that
    w_csra·L_csra ≈ w_reg·L_reg (App. A: 0.05–0.2); both per-step terms are logged, averaged over the steps,
    as ``reg_weighted``/``csra_weighted``. Eq. 3 has no Top-K term, so ``w_topk`` defaults to 0."""

    w_reg: float = field(default=0.5, metadata={"help": "weight of the feature regression loss (CORAL: 0.5)"})
    w_topk: float = field(default=0.0, metadata={"help": "weight of HASS's Top-K loss (CORAL's Eq. 3: none)"})
    w_csra: float = field(default=0.05, metadata={"help": "weight of the CSRA loss at each step; set per target "
        "so the logged csra_weighted ~ reg_weighted (App. A). 0.05 balances the default SmolLM2-135M target "
        "(L_csra ~5 per step against w_reg*L_reg ~0.26 for a trained drafter, batches of ~900-1,600 loss "
        "positions); the paper's: 0.2 Qwen2.5-7B, 0.15 Llama3-8B, 0.1 Llama3-70B/Qwen2.5-14B/Llama2-7B, "
        "0.05 Llama2-13B"})  # fmt: skip
    csra_temperature: float = field(default=0.07, metadata={"help": "InfoNCE temperature (CORAL: 0.07)"})


class CoralTrainer(HassTrainer):
    """Trains an :class:`~hf_spec.EagleDrafter` with CORAL's loss: HASS's multi-step training with, at each
    step t, the CSRA InfoNCE of step t's outputs (:func:`~hf_spec.training.losses.csra_loss_per_step`) added to
    that step's loss with weight ``w_csra`` (and the step's β^(t-1), as HASS's terms)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        out, feats_target, mask = self._hass_loss(model, inputs, return_predictions=True)
        args = self.args
        select = mask.bool()
        predictions = out.pop("predictions")
        loss = out["loss"]
        if select.any():
            steps, targets = [p[select] for p in predictions], feats_target[select]
            reg = sum(out[f"reg_{j}"] for j in range(1, args.hass_steps + 1)) / args.hass_steps
            csra_t = csra_loss_per_step(steps, targets, args.csra_temperature)  # (n,) L_csra of steps 1..n
            step_weights = args.hass_beta ** torch.arange(len(steps), device=csra_t.device, dtype=csra_t.dtype)
            loss = loss + args.w_csra * (step_weights * csra_t).sum()
            out.update({f"csra_{j}": c for j, c in enumerate(csra_t.detach().unbind(), start=1)})
            per_step = csra_t.detach().mean()
            # per step, averaged over the steps: the balance App. A sets (w_csra·L_csra ≈ w_reg·L_reg)
            self._record(reg_weighted=args.w_reg * reg, csra_weighted=args.w_csra * per_step)
        out["loss"] = loss
        return (loss, out) if return_outputs else loss


@dataclass
class RouterTrainingArguments(EagleTrainingArguments):
    """Stage 2 of CORAL: train the LM-head router with the drafter frozen (§3.3, App. F)."""

    router_num_groups: int = field(default=16, metadata={"help": "vocabulary groups N (CORAL: 16)"})
    router_top_n: int = field(default=2, metadata={"help": "groups computed per draft row at inference (CORAL: 2)"})
    feature_noise: float = field(default=0.0, metadata={"help": "no input noise: the router sees clean drafter outputs"})


class RouterTrainer(_LoggedTermsMixin, Trainer):
    """Trains only ``drafter.router``: cross-entropy between the router's group distribution on the
    drafter's predicted features and the target's probability mass per group (Eq. 9)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        drafter = self.accelerator.unwrap_model(model)
        ids, feats_in, feats_target, mask = _drafter_inputs(self, inputs)
        select = mask.bool()
        with torch.no_grad():
            predicted = drafter(input_ids=ids, hidden_states=feats_in).last_hidden_state[select]
            target_probs = torch.softmax(drafter.training_targets(feats_target[select])[0].float(), dim=-1)
            target_mass = group_mass(target_probs, drafter.router_token_order, drafter.config.router_num_groups)
        router_logp = torch.log_softmax(drafter.router(predicted).float(), dim=-1)
        loss = -(target_mass * router_logp).sum(-1).mean() if select.any() else router_logp.sum() * 0.0
        if select.any():
            top = router_logp.topk(drafter.config.router_top_n, dim=-1).indices
            self._record(top_n_mass=target_mass.gather(-1, top).sum(-1).mean())
        return (loss, {"loss": loss}) if return_outputs else loss
