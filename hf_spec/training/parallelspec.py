"""Group-wise parallel training of a :class:`~hf_spec.drafters.parallelspec.ParallelDrafter`
(ParallelSpec §4.1, Fig. 3).

Notation. A training sequence of N tokens x_0..x_{N-1} with target features f_0..f_{N-1}
gives P = N-1 EAGLE pairs: pair i = (f_i, x_{i+1}) at position i, whose output regresses
f_{i+1} and predicts x_{i+2} (target distribution: the target LM head on f_{i+1}). We call
i the pair's *target index* t: its targets are ``target_features[t] = f_{t+1}`` and the
label ``x_{t+2} = pair_ids[t+1]``; a target index t is usable when t + 1 < P.

Layout (one row): the P pairs, then G parallel groups of k masks each. The group of anchor
a is ``[MASK]_1..[MASK]_k``: ``[MASK]_j`` sits at position id a + j (continuing the sequence
after the anchor, exactly as at inference, where the anchor is the root pair) and has target
index a + j (it predicts x_{a+j+2}, j tokens beyond what the anchor predicts).

Anchors (which pairs get a group). The paper (Fig. 3) follows *every* token with a parallel
group; that is the default here (:func:`group_anchors`, ``parallel_group_density`` 1.0): every
pair whose group has at least one counted label is an anchor. Groups whose masks all have
ignored labels (-100 in Fig. 3: user turns, padding, the end of the row) are left out; no
other position attends to a group's masks, so dropping them changes no loss and no gradient,
only the cost. A density below 1 keeps that fraction of the anchors, drawn per batch; the
older setting, a fixed number of random anchors per row (:func:`sample_anchors`), remains as
``num_parallel_groups``.

Attention (Fig. 3): pairs are causal among pairs and never see any mask; ``[MASK]_j`` of
anchor a sees the pairs 0..a and ``[MASK]_1..[MASK]_j`` of its own group, nothing of other
groups. A mask therefore sees exactly what it sees at inference, where one forward runs the
committed pairs, the root pair (= the anchor) and the masks; so training and inference
logits agree (checked by the tests).

Loss (EAGLE-Parallel, §4.3): the sum over the group's k+1 positions of the EAGLE loss
(:func:`hf_spec.training.losses.eagle_loss`): depth 0 is the ordinary EAGLE loss over all
pairs, depth j the EAGLE loss over every group's ``[MASK]_j``; each term is the masked mean
over its positions. Teacher-forced top-1 per depth (:func:`depth_top1`) comes with the loss
and is logged by :class:`ParallelTrainer` as ``top1_d0`` .. ``top1_d<k>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from transformers import Trainer, TrainingArguments

from .losses import eagle_loss
from .trainers import _LoggedTermsMixin, greedy_labels_field

IGNORE_INDEX = -100


@dataclass
class ParallelLayout:
    """Where every position of a group-wise training row comes from (all (b, T), T = P + G*k).

    ``source_index``: the pair a position copies its (feature, token) from (the anchor for
    masks, whose inputs are replaced anyway); ``mask_ids``: 0 for pairs, j for ``[MASK]_j``;
    ``position_ids``; ``target_index``: target index t, ``-100`` where the position has no
    target; ``attention_mask``: (b, T, T) bool, True where a position may attend.
    """

    source_index: torch.Tensor
    mask_ids: torch.Tensor
    position_ids: torch.Tensor
    target_index: torch.Tensor
    attention_mask: torch.Tensor

    def additive_attention_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """(b, 1, T, T) additive float mask for the drafter's forward."""
        mask = torch.zeros(self.attention_mask.shape, dtype=dtype, device=self.attention_mask.device)
        mask.masked_fill_(~self.attention_mask, torch.finfo(dtype).min)
        return mask.unsqueeze(1)

    def labels(self, pair_ids: torch.Tensor) -> torch.Tensor:
        """(b, T) oracle tokens (x_{t+2} = ``pair_ids[t+1]``), ``-100`` where ignored."""
        valid = self.target_index >= 0
        index = (self.target_index + 1).clamp(min=0, max=pair_ids.shape[1] - 1)
        return torch.where(valid, pair_ids.gather(1, index), torch.full_like(index, IGNORE_INDEX))


def build_parallel_layout(num_pairs: int, anchors: torch.Tensor, num_mask_tokens: int) -> ParallelLayout:
    """The group-wise layout of rows of ``num_pairs`` pairs with parallel groups at ``anchors`` (b, G).

    An anchor of -1 is an empty slot (rows with fewer groups than others, :func:`group_anchors`):
    its masks are laid out as if anchored at pair 0 (so every attention row is well defined) but
    have no target, and no other position attends to them.
    """
    anchors = torch.as_tensor(anchors, dtype=torch.long)
    if anchors.dim() == 1:
        anchors = anchors.view(1, -1)
    device = anchors.device
    b, g = anchors.shape
    k, p = num_mask_tokens, num_pairs
    if bool(((anchors < -1) | (anchors >= p)).any()):
        raise ValueError(f"anchors must lie in [0, {p}) (or be -1: no group), got {anchors.tolist()}.")
    present = (anchors >= 0).repeat_interleave(k, dim=1)  # (b, G*k)
    anchors = anchors.clamp(min=0)
    t = p + g * k
    j = torch.arange(1, k + 1, device=device)
    pair_pos = torch.arange(p, device=device).expand(b, p)
    group_anchor = anchors.repeat_interleave(k, dim=1)  # (b, G*k)
    group_j = j.repeat(g).expand(b, g * k)
    source_index = torch.cat([pair_pos, group_anchor], dim=1)
    mask_ids = torch.cat([torch.zeros(b, p, dtype=torch.long, device=device), group_j], dim=1)
    position_ids = torch.cat([pair_pos, group_anchor + group_j], dim=1)
    target_index = position_ids.clone()  # pair i -> i; [MASK]_j of anchor a -> a + j
    target_index = target_index.masked_fill(target_index + 1 >= p, IGNORE_INDEX)
    target_index[:, p:] = target_index[:, p:].masked_fill(~present, IGNORE_INDEX)

    # Attention. Keys: pairs (0..P-1) then mask slots; queries likewise.
    allowed = torch.zeros(b, t, t, dtype=torch.bool, device=device)
    allowed[:, :p, :p] = torch.ones(p, p, dtype=torch.bool, device=device).tril()
    # masks see pairs 0..anchor
    allowed[:, p:, :p] = pair_pos.unsqueeze(1) <= group_anchor.unsqueeze(-1)
    # masks see the earlier masks of their own group (and themselves)
    group_of = torch.arange(g, device=device).repeat_interleave(k)
    slot_j = j.repeat(g)
    same_group = group_of.view(-1, 1) == group_of.view(1, -1)
    earlier = slot_j.view(1, -1) <= slot_j.view(-1, 1)
    allowed[:, p:, p:] = same_group & earlier
    return ParallelLayout(source_index, mask_ids, position_ids, target_index, allowed)


def sample_anchors(
    num_pairs: int,
    num_groups: int,
    num_mask_tokens: int,
    batch_size: int = 1,
    generator: torch.Generator | None = None,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """(b, G) distinct random anchors per row, chosen so every mask of the group has a target.

    The older, sparse setting (``num_parallel_groups``); the paper's is :func:`group_anchors`.
    ``lengths`` (b,): usable pairs per row (right padding excluded); default ``num_pairs``.
    Rows too short for a full group fall back to anchors whose later masks are ignored.
    """
    rows = []
    for r in range(batch_size):
        usable = int(lengths[r]) if lengths is not None else num_pairs
        high = max(usable - 1 - num_mask_tokens, 1)  # a + k + 1 < usable  =>  a < usable - 1 - k
        if high >= num_groups:
            rows.append(torch.randperm(high, generator=generator)[:num_groups].sort().values)
        else:
            rows.append(torch.randint(0, high, (num_groups,), generator=generator).sort().values)
    return torch.stack(rows)


def counted_targets(num_pairs: int, loss_mask: torch.Tensor | None = None, lengths: torch.Tensor | None = None,
                    batch_size: int = 1) -> torch.Tensor:  # fmt: skip
    """(b, P) bool: target index t counts in the loss (t + 1 < usable pairs, label x_{t+2} a loss token).

    ``loss_mask`` (b, N = P + 1): which tokens may be labels; ``lengths`` (b,): usable pairs per row.
    """
    p = num_pairs
    if loss_mask is not None:
        batch_size = loss_mask.shape[0]
    elif lengths is not None:
        batch_size = int(lengths.shape[0])
    t = torch.arange(p).expand(batch_size, p)
    ok = t + 1 < p
    if lengths is not None:
        ok = ok & (t + 1 < torch.as_tensor(lengths).cpu().view(-1, 1))
    if loss_mask is not None:
        labels_ok = torch.zeros(batch_size, p, dtype=torch.bool)
        labels_ok[:, : max(p - 1, 0)] = loss_mask[:, 2:].cpu().bool()[:, : max(p - 1, 0)]  # t -> x_{t+2}
        ok = ok & labels_ok
    return ok


def anchor_candidates(num_pairs: int, num_mask_tokens: int, loss_mask: torch.Tensor | None = None,
                      lengths: torch.Tensor | None = None, batch_size: int = 1) -> torch.Tensor:  # fmt: skip
    """(b, P) bool: pair a may anchor a group, i.e. some ``[MASK]_j`` (j = 1..k) of its group has a
    counted label (target index a + j counts, :func:`counted_targets`)."""
    ok = counted_targets(num_pairs, loss_mask, lengths, batch_size)
    candidates = torch.zeros_like(ok)
    for j in range(1, num_mask_tokens + 1):
        if j < num_pairs:
            candidates[:, : num_pairs - j] |= ok[:, j:]
    return candidates


def num_group_anchors(num_candidates: int, density: float) -> int:
    """Groups a row with ``num_candidates`` candidate anchors gets at ``density``: density · n rounded
    half up, at least 1 when there is a candidate (density 1.0: all of them)."""
    if not 0.0 < density <= 1.0:
        raise ValueError(f"parallel_group_density must be in (0, 1], got {density!r}.")
    if num_candidates <= 0:
        return 0
    return min(num_candidates, max(1, math.floor(density * num_candidates + 0.5)))


def group_anchors(num_pairs: int, num_mask_tokens: int, loss_mask: torch.Tensor | None = None,
                  lengths: torch.Tensor | None = None, density: float = 1.0, batch_size: int = 1,
                  generator: torch.Generator | None = None) -> torch.Tensor:  # fmt: skip
    """(b, G) anchors of the paper's layout: a parallel group after every pair whose group has a
    counted label (:func:`anchor_candidates`), ascending, ``-1`` padding rows that have fewer.

    ``density`` < 1 keeps :func:`num_group_anchors` of each row's candidates, drawn uniformly
    without replacement (``generator``, else the global RNG). Returned on the CPU.
    """
    candidates = anchor_candidates(num_pairs, num_mask_tokens, loss_mask, lengths, batch_size)
    b, p = candidates.shape
    counts = candidates.sum(1)
    keep = [num_group_anchors(int(n), density) for n in counts]
    if density < 1.0:
        keys = torch.rand(b, p, generator=generator).masked_fill(~candidates, 2.0)
        ranks = keys.argsort(dim=1).argsort(dim=1)  # rank of each pair's random key within its row
        candidates = candidates & (ranks < torch.tensor(keep).view(-1, 1))
    g = max(keep, default=0)
    order = torch.sort((~candidates).int(), dim=1, stable=True).indices[:, :g]  # kept pairs first
    return order.masked_fill(torch.arange(g).view(1, -1) >= torch.tensor(keep, dtype=torch.long).view(-1, 1), -1)


def parallel_forward(drafter, input_ids: torch.Tensor, hidden_states: torch.Tensor, layout: ParallelLayout,
                     output_logits: bool = True):  # fmt: skip
    """Run ``drafter`` on the group-wise layout of ``input_ids`` (b, N) / ``hidden_states`` (b, N, H).

    Pairs are (hidden_states[:, i], input_ids[:, i+1]); returns the drafter output (with
    logits at every position unless ``output_logits`` is False).
    """
    pair_ids, pair_feats = input_ids[:, 1:], hidden_states[:, :-1]
    ids = pair_ids.gather(1, layout.source_index)
    feats = pair_feats.gather(1, layout.source_index.unsqueeze(-1).expand(-1, -1, pair_feats.shape[-1]))
    return drafter(
        input_ids=ids,
        hidden_states=feats,
        position_ids=layout.position_ids,
        attention_mask=layout.additive_attention_mask(drafter.fc.weight.dtype),
        mask_ids=layout.mask_ids,
        output_logits=output_logits,
    )


def depth_top1(predicted_ids: torch.Tensor, labels: torch.Tensor, mask_ids: torch.Tensor,
               num_depths: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Teacher-forced top-1 per depth: (correct, counted), each (num_depths,) long.

    ``predicted_ids`` (b, T): the drafter's argmax token at each position of a layout;
    ``labels`` (b, T): the oracle token there, ``-100`` where the position does not count;
    ``mask_ids`` (b, T): the depth, 0 for pairs (the next token), j for ``[MASK]_j`` (j tokens
    further). Accuracy at depth d is ``correct[d] / counted[d]``.
    """
    counted = labels != IGNORE_INDEX
    depth = mask_ids[counted]
    hits = (predicted_ids == labels)[counted].long()
    correct = torch.zeros(num_depths, dtype=torch.long, device=labels.device).index_add_(0, depth, hits)
    total = torch.bincount(depth, minlength=num_depths)[:num_depths]
    return correct, total


def _counted_positions(layout: ParallelLayout, loss_mask: torch.Tensor | None) -> torch.Tensor:
    """(b, T) bool: the position has a target whose label token counts (``loss_mask`` at x_{t+2})."""
    valid = layout.target_index >= 0
    if loss_mask is not None:  # the label x_{t+2} must be a real token
        index = layout.target_index.clamp(min=0, max=loss_mask.shape[1] - 3)
        valid = valid & loss_mask[:, 2:].bool().gather(1, index)
    return valid


def _token_ids(drafter, draft_logits: torch.Tensor, draft_ids: torch.Tensor | None) -> torch.Tensor:
    """Target-vocabulary ids of the argmax of :meth:`draft_logits` rows."""
    best = draft_logits.argmax(-1)
    return draft_ids.to(best.device)[best] if draft_ids is not None else best


def parallel_eagle_loss(drafter, input_ids, hidden_states, layout: ParallelLayout, loss_mask=None,
                        w_reg: float = 1.0, w_cls: float = 0.1, greedy_labels: bool = False,
                        ) -> dict[str, torch.Tensor]:  # fmt: skip
    """EAGLE-Parallel loss: sum over depths 0..k of the EAGLE loss at that depth's positions.

    ``loss_mask`` (b, N): which tokens may be labels (0 at padding, and e.g. on user turns);
    a position counts only if its label token does. The LM head runs only at counted
    positions (most of a CPU training step otherwise), and the target's logits once per
    distinct target index (a pair's target f_{t+1} is also the target of the masks that
    predict x_{t+2}). ``greedy_labels``: the label tokens are the target's own greedy choices
    (self-distilled data), so with a draft vocabulary only its rows of the head run for the
    targets (:meth:`training_targets`). Returns ``loss``, ``reg``/``cls`` (summed over
    depths), ``cls_<d>`` per depth and the teacher-forced top-1 ``top1_<d>`` with its
    ``count_<d>`` positions (:func:`depth_top1`; depths without positions are left out).
    """
    out = parallel_forward(drafter, input_ids, hidden_states, layout, output_logits=False)
    pair_ids = input_ids[:, 1:]
    targets = hidden_states[:, 1:]  # target index t -> f_{t+1}
    valid = _counted_positions(layout, loss_mask)
    index = layout.target_index.clamp(min=0)
    labels = layout.labels(pair_ids).masked_fill(~valid, IGNORE_INDEX)
    if not bool(valid.any()):  # no position counts in this batch
        return {"loss": out.last_hidden_state.sum() * 0.0, "reg": 0.0, "cls": 0.0}
    b, p = pair_ids.shape
    # the target's logits once per distinct (row, target index)
    rows, cols = valid.nonzero(as_tuple=True)
    needed = torch.zeros(b, p, dtype=torch.bool, device=valid.device)
    needed[rows, index[rows, cols]] = True
    slot = needed.view(-1).cumsum(0).view(b, p) - 1
    argmax_ids = None
    if greedy_labels:  # x_{t+2} = pair_ids[t+1]: the target's greedy choice after f_{t+1}
        argmax_ids = torch.cat([pair_ids[:, 1:], pair_ids.new_zeros(b, 1)], dim=1)[needed]
    target_feats_all = targets[needed]
    target_logits_all, cls_mask_all = drafter.training_targets(target_feats_all, argmax_ids)

    draft_ids = drafter.draft_ids if getattr(drafter, "has_draft_vocab", False) else None
    predicted_ids = torch.full_like(labels, -1)
    num_depths = drafter.config.num_mask_tokens + 1
    result = {"loss": 0.0, "reg": 0.0, "cls": 0.0}
    for depth in range(num_depths):
        selected = valid & (layout.mask_ids == depth)
        if not bool(selected.any()):
            continue
        r, c = selected.nonzero(as_tuple=True)
        u = slot[r, index[r, c]]
        predicted = out.last_hidden_state[r, c]
        logits = drafter.draft_logits(predicted)  # draft vocabulary only, if any
        cls_mask = cls_mask_all[u] if cls_mask_all is not None else None
        part = eagle_loss(predicted, target_feats_all[u], logits, target_logits_all[u], None, w_reg, w_cls, cls_mask)
        for name in ("loss", "reg", "cls"):
            result[name] = result[name] + part[name]
        result[f"cls_{depth}"] = part["cls"].detach()
        with torch.no_grad():
            predicted_ids[r, c] = _token_ids(drafter, logits, draft_ids)
    correct, counted = depth_top1(predicted_ids, labels, layout.mask_ids, num_depths)
    for depth in range(num_depths):
        if int(counted[depth]):
            result[f"top1_{depth}"] = correct[depth].float() / counted[depth]
            result[f"count_{depth}"] = counted[depth]
    return result


@torch.no_grad()
def parallel_depth_accuracy(drafter, input_ids, hidden_states, layout: ParallelLayout, loss_mask=None,
                            ) -> dict[int, tuple[int, int]]:  # fmt: skip
    """Teacher-forced top-1 of ``drafter`` per depth on one batch: ``{d: (correct, counted)}`` for
    d = 0 (the next token, the pairs) .. k (``[MASK]_k``), against the labels (x_{t+2}) of the
    positions that count (``loss_mask`` as in :func:`parallel_eagle_loss`)."""
    out = parallel_forward(drafter, input_ids, hidden_states, layout, output_logits=False)
    valid = _counted_positions(layout, loss_mask)
    labels = layout.labels(input_ids[:, 1:]).masked_fill(~valid, IGNORE_INDEX)
    draft_ids = drafter.draft_ids if getattr(drafter, "has_draft_vocab", False) else None
    predicted_ids = torch.full_like(labels, -1)
    if bool(valid.any()):
        predicted_ids[valid] = _token_ids(drafter, drafter.draft_logits(out.last_hidden_state[valid]), draft_ids)
    correct, counted = depth_top1(predicted_ids, labels, layout.mask_ids, drafter.config.num_mask_tokens + 1)
    return {d: (int(correct[d]), int(counted[d])) for d in range(correct.numel())}


@dataclass
class ParallelTrainingArguments(TrainingArguments):
    """``TrainingArguments`` with ParallelSpec's EAGLE-variant defaults (paper Table 3, A.2).

    Paper: global batch 32, lr 5e-5, AdamW (0.9, 0.95), no weight decay, 40 epochs on 8 A100s.
    Here the global batch stays 32 as 4 per device x 8 accumulation steps, which fits a CPU or
    a single small GPU; scale ``per_device_train_batch_size`` up and accumulation down on
    bigger machines (keep the product 32). Parallel groups follow every position (Fig. 3):
    a row of P pairs grows to about P·(k+1) positions (attention ~(k+1)² the cost);
    ``parallel_group_density`` trades that for fewer groups.
    """

    parallel_group_density: float = field(default=1.0, metadata={"help": "fraction of a row's positions followed by "
        "a parallel group of k [MASK]s (1.0 = the paper, Fig. 3: every position whose group has a label; below 1: "
        "that fraction, drawn afresh for every batch)"})  # fmt: skip
    num_parallel_groups: int = field(default=0, metadata={"help": "> 0: the old sparse setting instead, this many "
        "random groups per row (ignores parallel_group_density); 0: groups by density"})  # fmt: skip
    w_reg: float = field(default=1.0, metadata={"help": "Weight of the feature-regression term."})
    w_cls: float = field(default=0.1, metadata={"help": "Weight of the classification term (EAGLE: 0.1)."})
    greedy_labels: bool = greedy_labels_field()
    learning_rate: float = field(default=5e-5, metadata={"help": "Paper A.2: 5e-5 for EAGLE-ParallelSpec."})
    adam_beta1: float = field(default=0.9, metadata={"help": "Paper A.2."})
    adam_beta2: float = field(default=0.95, metadata={"help": "Paper A.2: 0.95."})
    weight_decay: float = field(default=0.0, metadata={"help": "Paper A.2: none."})
    per_device_train_batch_size: int = field(default=4, metadata={"help": "x accumulation = global batch 32."})
    gradient_accumulation_steps: int = field(default=8, metadata={"help": "x per-device batch = global batch 32."})
    num_train_epochs: float = field(default=40.0, metadata={"help": "Paper A.2: 40 epochs."})
    max_length: int = field(default=2048, metadata={"help": "training sequences are truncated to this many tokens"})
    remove_unused_columns: bool = field(default=False, metadata={"help": "Keep hidden_states etc. in batches."})
    train_sampling_strategy: str = field(default="group_by_length", metadata={"help": "batches of similar lengths "
        "(less padding: 22 percent fewer padded positions than random batches on the distilled SmolLM2 cache)"})  # fmt: skip


class ParallelTrainer(_LoggedTermsMixin, Trainer):
    """Trainer for a bound :class:`ParallelDrafter`; batches hold ``input_ids`` (b, N),
    ``hidden_states`` (b, N, H) target features and optionally ``loss_mask`` (b, N: which
    tokens are labels, e.g. assistant tokens) and ``attention_mask`` (b, N: right padding; when
    absent, ``loss_mask`` marks the real tokens). Anchors per batch: :func:`group_anchors` at
    ``parallel_group_density`` (every position by default), or ``num_parallel_groups`` random
    ones (:func:`sample_anchors`). Logs the teacher-forced top-1 per depth (``top1_d0`` the
    next token .. ``top1_d<k>`` the last mask; ``eval_top1_d<d>`` in evaluations), pooled over
    the positions of the steps since the last log (of this process, under accelerate)."""

    def batch_anchors(self, drafter, input_ids, loss_mask, attention_mask) -> torch.Tensor:
        """(b, G) anchors of one batch (see the class docstring). ``loss_mask`` here already
        excludes padding; ``attention_mask``: the batch's padding mask, if it has one."""
        args = self.args
        num_pairs, k, b = input_ids.shape[1] - 1, drafter.config.num_mask_tokens, input_ids.shape[0]
        lengths = attention_mask.sum(1).long().cpu() - 1 if attention_mask is not None else None
        groups = getattr(args, "num_parallel_groups", 0)
        if groups and groups > 0:
            if lengths is None and loss_mask is not None:  # batches without attention_mask: loss_mask marks real tokens
                lengths = loss_mask.sum(1).long().cpu() - 1
            return sample_anchors(num_pairs, groups, k, b, lengths=lengths)
        density = getattr(args, "parallel_group_density", 1.0)
        return group_anchors(num_pairs, k, loss_mask, lengths, density, batch_size=b)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        args = self.args
        input_ids, hidden_states = inputs["input_ids"], inputs["hidden_states"]
        loss_mask, attention_mask = inputs.get("loss_mask"), inputs.get("attention_mask")
        if loss_mask is not None and attention_mask is not None:
            loss_mask = loss_mask * attention_mask
        drafter = self.accelerator.unwrap_model(model)
        anchors = self.batch_anchors(drafter, input_ids, loss_mask, attention_mask)
        layout = build_parallel_layout(input_ids.shape[1] - 1, anchors.to(input_ids.device),
                                       drafter.config.num_mask_tokens)  # fmt: skip
        result = parallel_eagle_loss(drafter, input_ids, hidden_states, layout, loss_mask,
                                     getattr(args, "w_reg", 1.0), getattr(args, "w_cls", 0.1),
                                     greedy_labels=getattr(args, "greedy_labels", False))  # fmt: skip
        self._record_depths(result, drafter.config.num_mask_tokens + 1)
        loss = result["loss"]
        return (loss, result) if return_outputs else loss

    def _record_depths(self, result: dict, num_depths: int) -> None:
        """Each depth's teacher-forced top-1, weighted by its positions (the log pools them over the steps)."""
        for d in range(num_depths):
            if f"count_{d}" in result:
                self._record(weight=float(result[f"count_{d}"]), **{f"top1_d{d}": result[f"top1_{d}"]})


def collate_features(rows: list[dict]) -> dict[str, torch.Tensor]:
    """Stack equal-length rows; right-pad ragged ones (``loss_mask`` 0 on padding)."""
    length = max(len(r["input_ids"]) for r in rows)
    batch = {"input_ids": [], "hidden_states": [], "loss_mask": []}
    for r in rows:
        ids, feats = torch.as_tensor(r["input_ids"]), torch.as_tensor(r["hidden_states"])
        pad = length - ids.shape[0]
        mask = torch.as_tensor(r["loss_mask"]) if "loss_mask" in r else torch.ones_like(ids)
        batch["input_ids"].append(torch.nn.functional.pad(ids, (0, pad)))
        batch["hidden_states"].append(torch.nn.functional.pad(feats, (0, 0, 0, pad)))
        batch["loss_mask"].append(torch.nn.functional.pad(mask, (0, pad)))
    return {k: torch.stack(v) for k, v in batch.items()}
