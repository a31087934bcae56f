"""Drafter training losses (pure functions of tensors)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..drafters.s2d.losses import exit_distillation_loss, sorted_loss  # noqa: F401  (the S2D family's, re-exported)


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
    cls_mask: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """EAGLE's loss: SmoothL1 feature regression + cross-entropy against the target's distribution.

    Shapes: features (b, s, H), logits (b, s, V) (or (b, s, D) over a draft vocabulary),
    ``loss_mask`` (b, s); ``cls_mask`` (b, s) further restricts the cross-entropy (a draft
    vocabulary's positions whose target argmax it lacks, :mod:`hf_spec.draft_vocab`). Returns a
    dict with ``loss`` (= w_reg * reg + w_cls * cls), ``reg``, ``cls`` and ``top1`` (:func:`top1_accuracy`).
    """
    reg = F.smooth_l1_loss(predicted_features.float(), target_features.float(), reduction="none").mean(-1)
    target_probs = torch.softmax(target_logits.float(), dim=-1)
    cls = -(target_probs * torch.log_softmax(predicted_logits.float(), dim=-1)).sum(-1)
    if cls_mask is not None:
        cls_mask = cls_mask if loss_mask is None else cls_mask * loss_mask
    else:
        cls_mask = loss_mask
    top1 = top1_accuracy(predicted_logits, target_logits, cls_mask, loss_mask)
    reg, cls = masked_mean(reg, loss_mask), masked_mean(cls, cls_mask)
    return {"loss": w_reg * reg + w_cls * cls, "reg": reg, "cls": cls, "top1": top1}


@torch.no_grad()
def top1_accuracy(predicted_logits, target_logits, in_vocab=None, loss_mask=None) -> torch.Tensor:
    """Teacher-forced top-1: the share of loss positions where the drafter's argmax is the target's.

    ``in_vocab`` (same shape as a logits row's batch dims, or None): 0 where the target's argmax lies outside a
    draft vocabulary (the logits then cover only the draft ids), which counts as a miss, as at decoding time."""
    hit = (predicted_logits.argmax(-1) == target_logits.argmax(-1)).float()
    if in_vocab is not None:
        hit = hit * in_vocab.to(hit.dtype)
    return masked_mean(hit, loss_mask).detach()


def topk_distillation_loss(
    predicted_logits: torch.Tensor,
    target_logits: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    k: int = 10,
) -> torch.Tensor:
    """HASS's harmonized objective distillation (eq. 1): ``-sum_{x in top-K(q)} q(x) log p(x)``.

    ``q`` is the target's full softmax (not renormalised over the top-K set, as in the paper),
    ``p`` the drafter's; the sum runs over the K tokens the target ranks highest. Shapes:
    logits (b, s, V), ``loss_mask`` (b, s); returns the masked mean over positions.
    """
    target_probs = torch.softmax(target_logits.float(), dim=-1)
    top_probs, top_ids = target_probs.topk(min(k, target_probs.shape[-1]), dim=-1)
    log_p = torch.log_softmax(predicted_logits.float(), dim=-1).gather(-1, top_ids)
    return masked_mean(-(top_probs * log_p).sum(-1), loss_mask)


def hass_step_mask(seq_len: int, step: int, dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """The additive attention mask of HASS training step ``step`` (1-based), (1, 1, s, step * s).

    Keys come in ``step`` blocks of ``s`` positions: block 0 holds the keys computed from the
    target's features (step 1's inputs), block ``b`` those computed in step ``b + 1`` from the
    features the drafter predicted in step ``b``. The query at position t (whose input is the
    step ``step - 1`` prediction) sees, as at decoding depth ``step``:

    - its own key from the newest block (``b = step - 1``),
    - for ``1 <= b < step - 1``: position ``t - (step - 1 - b)`` from block ``b`` (its drafted
      ancestors, each one drafting step older),
    - positions ``<= t - (step - 1)`` from block 0 (the verified context, target features).

    Step 1 is the plain causal mask (EAGLE). See HASS §3.2, Figure 3 and A.1.
    """
    if step < 1:
        raise ValueError(f"HASS steps are 1-based, got {step}.")
    q = torch.arange(seq_len, device=device).view(-1, 1)
    k = torch.arange(seq_len, device=device).view(1, -1)
    blocks = [k <= q - (step - 1)]
    blocks += [k == q - (step - 1 - b) for b in range(1, step)]
    allowed = torch.cat(blocks, dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.view(1, 1, seq_len, step * seq_len)


def shift_for_drafter(input_ids, hidden_states, loss_mask, attention_mask=None):
    """Align a tokenized, featurized sequence to the drafter's pairs.

    From ids x_0..x_{L-1} and target features f_0..f_{L-1}, drafter position t holds
    (f_t, x_{t+1}) for t = 0..L-2, and learns f_{t+1} and the target's next-token distribution
    ``lm_head(f_{t+1})`` over x_{t+2}. Position t counts in the loss iff x_{t+2} exists, is an
    assistant token (``loss_mask``) and is not padding. Returns (ids, feats_in, feats_target,
    position loss mask), each of length L-1.
    """
    valid = loss_mask if attention_mask is None else loss_mask * attention_mask
    position_mask = torch.zeros_like(valid[:, 1:])
    position_mask[:, :-1] = valid[:, 2:]
    return input_ids[:, 1:], hidden_states[:, :-1], hidden_states[:, 1:], position_mask


def next_token_ids(ids: torch.Tensor) -> torch.Tensor:
    """(b, s) the token after each drafter position of :func:`shift_for_drafter`'s ``ids`` (x_{t+2}; 0 past the
    end, where the position mask is 0): the target's greedy choice wherever the loss counts in self-distilled
    data."""
    return torch.cat([ids[:, 1:], ids.new_zeros(ids.shape[0], 1)], dim=1)


def hass_loss(
    drafter,
    input_ids: torch.Tensor,
    hidden_states: torch.Tensor,
    target_features: torch.Tensor,
    loss_mask: torch.Tensor | None = None,
    num_steps: int = 3,
    beta: float = 1.0,
    w_topk: float = 1.0,
    topk: int = 10,
    w_reg: float = 1.0,
    w_cls: float = 0.1,
    forward=None,
    return_predictions: bool = False,
    argmax_ids: torch.Tensor | None = None,
    detach_steps: bool = True,
) -> dict[str, torch.Tensor]:
    """HASS training loss: ``sum_j beta^(j-1) * (EAGLE loss_j + w_topk * TopK loss_j)``.

    EAGLE-3's training-time test is the same unrolled computation (each step a drafting depth, the
    context of every position exactly as at decoding time), scored by cross-entropy only: an
    :class:`~hf_spec.Eagle3Drafter` with ``w_reg=0, w_topk=0, beta=0.8, detach_steps=False``
    (:class:`~hf_spec.training.trainers.Eagle3Trainer`; ``tests/test_train_eagle3.py`` checks each step's
    logits against speculators' EAGLE-3 forward).

    Args:
        drafter: an :class:`~hf_spec.EagleDrafter` bound to the target.
        input_ids, hidden_states: the drafter's inputs (b, s) tokens x_{t+1} and (b, s, H)
            target features f_t (see :func:`shift_for_drafter`).
        target_features: (b, s, H) f_{t+1}; the target logits are ``lm_head`` of these.
        num_steps: harmonized context alignment steps n (1 = EAGLE + Top-K).
        forward: what to call for the drafter's forward passes (e.g. its DDP wrapper);
            defaults to ``drafter``.
        return_predictions: also return ``predictions``, the list of each step's predicted
            features (b, s, H).
        argmax_ids: (b, s) the target's greedy token after each position when the data says it
            (self-distilled), so the draft-vocabulary mask needs no full LM head.
        detach_steps: feed step j the step j-1 predictions detached (HASS A.1), or with their graph, so
            later steps' losses also train the earlier passes (EAGLE-3's training-time test).

    Step 1 is EAGLE's forward. Step j feeds, at position t, the feature the drafter predicted
    for position t in step j-1 (the prediction made at t-1; position 0 keeps f_0, through the
    drafter's ``project_features`` when it has one: EAGLE-3's fc over the fused target layers),
    detached as in HASS A.1 unless ``detach_steps`` is False, with the same tokens. With a draft vocabulary, the target distribution is
    restricted to it and positions whose target argmax lies outside it leave the
    classification and Top-K terms (:meth:`~hf_spec.drafters.base.SpecDrafterModel.training_targets`). Its keys/values mix the earlier steps' blocks exactly as
    :func:`hass_step_mask` says; the earlier blocks come from a ``DynamicCache`` filled by the
    previous steps, so each step costs one drafter pass over s positions. Returns ``loss`` and
    per-step ``reg_j``, ``cls_j``, ``topk_j`` and teacher-forced ``top1_j`` (:func:`top1_accuracy`), detached.
    """
    from transformers import DynamicCache

    batch, seq_len = input_ids.shape
    # Vocabulary-sized work (LM head, softmaxes) only at positions that count in the loss:
    # that is where a CPU step spends its time, and prompt positions are masked out anyway.
    select = torch.ones(batch, seq_len, dtype=torch.bool, device=input_ids.device) if loss_mask is None else loss_mask.bool()
    target_sel = target_features[select]
    with torch.no_grad():  # over the draft vocabulary if the drafter has one (hf_spec.draft_vocab)
        target_logits, cls_mask = drafter.training_targets(target_sel, None if argmax_ids is None else argmax_ids[select])
        target_probs = torch.softmax(target_logits.float(), dim=-1)
        top_probs, top_ids = target_probs.topk(min(topk, target_probs.shape[-1]), dim=-1)
    cache = DynamicCache()
    position_ids = torch.arange(seq_len, device=input_ids.device).view(1, -1).expand(batch, -1)
    features = hidden_states
    total = 0.0
    metrics = {}
    predictions = []
    # A drafter with its own trained head (EAGLE-3) scores inside its forward: every use of a trained parameter
    # must happen in the (DDP-wrapped) forward, or DDP marks its gradient ready twice.
    own_head = bool(getattr(drafter, "owns_draft_head", False))
    for step in range(1, num_steps + 1):
        dtype = drafter.fc.weight.dtype
        mask = hass_step_mask(seq_len, step, dtype, input_ids.device)
        out = (forward or drafter)(input_ids=input_ids, hidden_states=features, position_ids=position_ids,
                                   attention_mask=mask, past_key_values=cache, use_cache=True,
                                   **({"output_logits": True} if own_head else {}))  # fmt: skip
        predicted = out.last_hidden_state
        predictions.append(predicted)
        if select.any():
            pred_sel = predicted[select]
            if w_reg:
                reg = F.smooth_l1_loss(pred_sel.float(), target_sel.float(), reduction="none").mean(-1).mean()
            else:  # no feature regression (EAGLE-3: its hidden state is not the target's feature)
                reg = pred_sel.new_zeros(())
            logits = out.logits[select] if own_head else drafter.draft_logits(pred_sel)
            log_p = torch.log_softmax(logits.float(), dim=-1)
            cls = masked_mean(-(target_probs * log_p).sum(-1), cls_mask)
            topk_part = masked_mean(-(top_probs * log_p.gather(-1, top_ids)).sum(-1), cls_mask)
            metrics[f"top1_{step}"] = top1_accuracy(logits, target_logits, cls_mask)
        else:  # nothing to learn in this batch; keep the graph connected for DDP
            reg = cls = topk_part = predicted.sum() * 0.0
        total = total + beta ** (step - 1) * (w_reg * reg + w_cls * cls + w_topk * topk_part)
        metrics.update({f"reg_{step}": reg.detach(), f"cls_{step}": cls.detach(), f"topk_{step}": topk_part.detach()})
        if step == 1:  # position 0 has no drafted predecessor: it keeps its step-1 input (see above)
            first = hidden_states[:, :1]
            project = getattr(drafter, "project_features", None)
            if project is not None:
                with torch.no_grad():
                    first = project(first)
        fed = predicted[:, :-1].detach() if detach_steps else predicted[:, :-1]
        features = torch.cat([first.to(hidden_states.dtype), fed.to(hidden_states.dtype)], dim=1)
    if return_predictions:
        metrics["predictions"] = predictions
    return {"loss": total, **metrics}


def csra_loss_per_step(
    step_features: list[torch.Tensor], target_features: torch.Tensor, temperature: float = 0.07
) -> torch.Tensor:
    """CORAL's Cross-Step Representation Alignment (CSRA, §3.1 Eq. 2, App. A) at each training step.

    Returns a tensor (n,): entry t-1 is L_CSRA of training step t = 1..n, to be added to that step's loss
    (Eq. 3: ``w_reg·L_reg + w_cls·L_cls + w_CSRA·L_CSRA`` per step).

    ``step_features``: the n training steps' output features at the same N positions, each (N, H), in step
    order; ``target_features`` (N, H): the target's features at those positions. All features are
    L2-normalised, so ``sim`` is cosine similarity; τ = ``temperature`` (0.07 in App. A).

    At step t (the paper: "each sample has t positive views, while all other features are considered
    negative samples"; F is "the set of all features along with the targets"):

    - queries: step t's N output features (each position one query; only step t's outputs are queries),
    - F_t: every feature that exists at step t, i.e. the target's and steps 1..t's features at all N
      positions ((t + 1)·N), minus the query itself (sim(q, q) = 1 is no view of another sample),
    - positives of the query at position p: the same position's features of steps 1..t-1 and of the
      target (t of them; at step 1 only the target's feature). Later steps are never used (they do not
      exist yet at step t),
    - negatives: every other member of F_t, i.e. all features of the other N - 1 positions (target's and
      steps 1..t's) in the batch. The positives also stand in the denominator, as in InfoNCE.

    Eq. 2 is written for one positive, ``L = -log( exp(sim(q, f+)/τ) / Σ_{f∈F} exp(sim(q, f)/τ) )``;
    the paper does not say how its t positives are combined, so Eq. 2 is applied to each (q, f+) pair and
    the t terms are averaged (log-probabilities averaged over the positives, SupCon's L_out), then
    averaged over the N queries::

        L_t = -1/N Σ_q 1/t Σ_{f+ ∈ P_t(q)} log( exp(sim(q, f+)/τ) / Σ_{f ∈ F_t \\ {q}} exp(sim(q, f)/τ) )

    Gradients flow into every drafter feature in the expression (the query and the earlier steps'
    features; the paper names no stop-gradient); the target's features are data. N counts the positions
    pooled: the caller's (the CORAL trainer's: the batch's loss positions). Unaligned features (near-zero
    cosines) score about ``log((t + 1)·N - 1)``, the log of the candidate count; perfectly aligned ones
    (each position's views identical, other positions orthogonal) ``log(t + (t + 1)(N - 1)e^{-1/τ})``, so
    the floor is log t, not 0 (t positives share one softmax).
    """
    views = F.normalize(torch.stack([target_features, *step_features]).float(), dim=-1)  # (n + 1, N, H)
    num_steps, positions = len(step_features), views.shape[1]
    index = torch.arange(positions, device=views.device)
    losses = []
    for t in range(1, num_steps + 1):
        pool = views[: t + 1].reshape(-1, views.shape[-1])  # target, step 1, ..., step t: ((t + 1) N, H)
        logits = views[t] @ pool.T / temperature  # (N, (t + 1) N)
        logits[index, t * positions + index] = float("-inf")  # the query itself is not in F
        log_prob = (logits - torch.logsumexp(logits, dim=-1, keepdim=True)).view(positions, t + 1, positions)
        positive = log_prob[index, :t, index]  # (N, t): same position, target and steps 1..t-1
        losses.append(-positive.mean(-1).mean())
    return torch.stack(losses)
