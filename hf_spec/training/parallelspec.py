"""Group-wise parallel training of a :class:`~hf_spec.drafters.parallel.ParallelDrafter` (ParallelSpec §4.1, Fig. 3).

Notation. A training sequence of N tokens x_0..x_{N-1} with target features f_0..f_{N-1}
gives P = N-1 EAGLE pairs: pair i = (f_i, x_{i+1}) at position i, whose output regresses
f_{i+1} and predicts x_{i+2} (target distribution: the target LM head on f_{i+1}). We call
i the pair's *target index* t: its targets are ``target_features[t] = f_{t+1}`` and the
label ``x_{t+2} = pair_ids[t+1]``; a target index t is usable when t + 1 < P.

Layout (one row): the P pairs, then G parallel groups of k masks each. The group of anchor
a is ``[MASK]_1..[MASK]_k``: ``[MASK]_j`` sits at position id a + j (continuing the sequence
after the anchor, exactly as at inference, where the anchor is the root pair) and has target
index a + j (it predicts x_{a+j+2}, j tokens beyond what the anchor predicts).

Attention (Fig. 3): pairs are causal among pairs and never see any mask; ``[MASK]_j`` of
anchor a sees the pairs 0..a and ``[MASK]_1..[MASK]_j`` of its own group, nothing of other
groups. A mask therefore sees exactly what it sees at inference, where one forward runs the
committed pairs, the root pair (= the anchor) and the masks; so training and inference
logits agree (checked by the tests).

Loss (EAGLE-Parallel, §4.3): the sum over the group's k+1 positions of the EAGLE loss
(:func:`hf_spec.training.losses.eagle_loss`): depth 0 is the ordinary EAGLE loss over all
pairs, depth j the EAGLE loss over every group's ``[MASK]_j``; each term is the masked mean
over its positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import Trainer, TrainingArguments

from .losses import eagle_loss

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
    """The group-wise layout of rows of ``num_pairs`` pairs with parallel groups at ``anchors`` (b, G)."""
    anchors = torch.as_tensor(anchors, dtype=torch.long)
    if anchors.dim() == 1:
        anchors = anchors.view(1, -1)
    device = anchors.device
    b, g = anchors.shape
    k, p = num_mask_tokens, num_pairs
    if bool(((anchors < 0) | (anchors >= p)).any()):
        raise ValueError(f"anchors must lie in [0, {p}), got {anchors.tolist()}.")
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

    # Attention. Keys: pairs (0..P-1) then mask slots; queries likewise.
    allowed = torch.zeros(b, t, t, dtype=torch.bool, device=device)
    allowed[:, :p, :p] = torch.ones(p, p, dtype=torch.bool, device=device).tril()
    # masks see pairs 0..anchor
    allowed[:, p:, :p] = pair_pos.unsqueeze(1) <= group_anchor.unsqueeze(-1)
    # masks see the earlier masks of their own group (and themselves)
    group_of = torch.arange(g, device=device).repeat_interleave(k)
    same_group = group_of.view(-1, 1) == group_of.view(1, -1)
    earlier = group_j[0].view(1, -1) <= group_j[0].view(-1, 1)
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


def parallel_eagle_loss(drafter, input_ids, hidden_states, layout: ParallelLayout, loss_mask=None,
                        w_reg: float = 1.0, w_cls: float = 0.1) -> dict[str, torch.Tensor]:  # fmt: skip
    """EAGLE-Parallel loss: sum over depths 0..k of the EAGLE loss at that depth's positions.

    ``loss_mask`` (b, N): which tokens may be labels (0 at padding, and e.g. on user turns);
    a position counts only if its label token does. The LM head runs only at counted
    positions (most of a CPU training step otherwise). Returns ``loss``, ``reg``/``cls``
    (summed over depths) and ``cls_<d>`` per depth.
    """
    out = parallel_forward(drafter, input_ids, hidden_states, layout, output_logits=False)
    targets = hidden_states[:, 1:]  # target index t -> f_{t+1}
    valid = layout.target_index >= 0
    index = layout.target_index.clamp(min=0)
    if loss_mask is not None:  # the label x_{t+2} must be a real token
        valid = valid & loss_mask[:, 2:].bool().gather(1, index.clamp(max=loss_mask.shape[1] - 3))
    result = {"loss": 0.0, "reg": 0.0, "cls": 0.0}
    for depth in range(drafter.config.num_mask_tokens + 1):
        selected = valid & (layout.mask_ids == depth)
        if not bool(selected.any()):
            continue
        predicted = out.last_hidden_state[selected]
        target_feats = targets[selected.nonzero(as_tuple=True)[0], index[selected]]
        target_logits, cls_mask = drafter.training_targets(target_feats)  # draft vocabulary only, if any
        part = eagle_loss(predicted, target_feats, drafter.draft_logits(predicted), target_logits, None, w_reg, w_cls,
                          cls_mask)  # fmt: skip
        for name in ("loss", "reg", "cls"):
            result[name] = result[name] + part[name]
        result[f"cls_{depth}"] = part["cls"].detach()
    if not torch.is_tensor(result["loss"]):  # no position counts in this batch
        result["loss"] = out.last_hidden_state.sum() * 0.0
    return result


@dataclass
class ParallelTrainingArguments(TrainingArguments):
    """``TrainingArguments`` with ParallelSpec's EAGLE-variant defaults (paper Table 3, A.2).

    Paper: global batch 32, lr 5e-5, AdamW (0.9, 0.95), no weight decay, 40 epochs on 8 A100s.
    Here the global batch stays 32 as 4 per device x 8 accumulation steps, which fits a CPU or
    a single small GPU; scale ``per_device_train_batch_size`` up and accumulation down on
    bigger machines (keep the product 32).
    """

    num_parallel_groups: int = field(default=4, metadata={"help": "Parallel groups (anchors) per training row."})
    w_reg: float = field(default=1.0, metadata={"help": "Weight of the feature-regression term."})
    w_cls: float = field(default=0.1, metadata={"help": "Weight of the classification term (EAGLE: 0.1)."})
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


class ParallelTrainer(Trainer):
    """Trainer for a bound :class:`ParallelDrafter`; batches hold ``input_ids`` (b, N),
    ``hidden_states`` (b, N, H) target features and optionally ``loss_mask`` (b, N: which
    tokens are labels, e.g. assistant tokens) and ``attention_mask`` (b, N: right padding; when
    absent, ``loss_mask`` marks the real tokens). Fresh anchors are drawn for every batch."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        args = self.args
        input_ids, hidden_states = inputs["input_ids"], inputs["hidden_states"]
        loss_mask, padding_mask = inputs.get("loss_mask"), inputs.get("attention_mask")
        if padding_mask is None:
            padding_mask = loss_mask  # batches without attention_mask mark real tokens in loss_mask
        elif loss_mask is not None:
            loss_mask = loss_mask * padding_mask
        num_pairs = input_ids.shape[1] - 1
        lengths = padding_mask.sum(1).long() - 1 if padding_mask is not None else None
        groups = getattr(args, "num_parallel_groups", 4)
        drafter = model.module if hasattr(model, "module") else model
        anchors = sample_anchors(num_pairs, groups, drafter.config.num_mask_tokens, input_ids.shape[0],
                                 lengths=lengths.cpu() if lengths is not None else None)  # fmt: skip
        layout = build_parallel_layout(num_pairs, anchors.to(input_ids.device), drafter.config.num_mask_tokens)
        result = parallel_eagle_loss(drafter, input_ids, hidden_states, layout, loss_mask,
                                     getattr(args, "w_reg", 1.0), getattr(args, "w_cls", 0.1))  # fmt: skip
        loss = result["loss"]
        return (loss, result) if return_outputs else loss


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
