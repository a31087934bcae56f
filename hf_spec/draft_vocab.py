"""Draft vocabulary (FR-Spec / EAGLE-3): draft over a frequency-ranked subset of the target's ids.

Most of a drafting step (and of a training step on CPU) is the target's LM head: V rows x H.
A drafter with a draft vocabulary of ``D`` ids scores only those ``D`` rows; verification
still uses the full target vocabulary, so decoding stays lossless:

- greedy: the draft tree only proposes tokens; the target's argmax decides what is emitted;
- sampling: the draft distribution ``q`` is zero outside the draft vocabulary (its log-probs
  are ``-inf`` there, full-V as before), and recursive rejection sampling is exact for any
  ``q``, so the emitted tokens keep the target distribution. A token outside the draft
  vocabulary is still reached through the residual ``max(p - q, 0)``.

The map (as in EAGLE-3): the draft ids are the ``D`` most frequent token ids of the target's
own answers on the training data (ties by the lower id), sorted ascending by target id.
Two buffers describe it, saved with the drafter in ``model.safetensors``:

- ``d2t`` (int64, [D]): draft index i -> offset; target id = ``i + d2t[i]``;
- ``t2d`` (bool, [V]): which target ids are in the draft vocabulary.

Training (:mod:`hf_spec.training`) restricts the target distribution to the draft ids (softmax
over their logits) and drops positions whose full-vocabulary target argmax lies outside the
draft vocabulary from the classification and Top-K terms (the regression term keeps them).
Token-level drafters (S2D's sorted exits) score the draft ids with their own head and ignore
labels outside the draft vocabulary (:func:`draft_labels`). CORAL's router groups partition the
D draft indices instead of the V target ids.

Build one with ``drafter.set_draft_vocab(token_counts, size)`` (or exact ids with ``size=None``);
the training pipeline does it from the feature cache's assistant tokens (``draft_vocab_size``).
"""

from __future__ import annotations

import torch
from torch import nn


def frequency_order(token_counts: torch.Tensor) -> torch.Tensor:
    """Token ids sorted by descending count (ties and unseen tokens by ascending id)."""
    ids = torch.arange(token_counts.numel())
    # stable sort on -count keeps ascending ids within equal counts
    return ids[torch.sort(-torch.as_tensor(token_counts).to(torch.float64), stable=True).indices]


def select_draft_ids(token_counts: torch.Tensor, size: int) -> torch.Tensor:
    """The ``size`` most frequent ids of ``token_counts`` (V,), ties by lower id, sorted ascending."""
    token_counts = torch.as_tensor(token_counts)
    vocab = token_counts.numel()
    if not isinstance(size, int) or not 1 <= size <= vocab:
        raise ValueError(f"draft_vocab_size must be an integer in [1, {vocab}] (the target vocabulary), got {size!r}.")
    return frequency_order(token_counts)[:size].sort().values


def d2t_from_ids(draft_ids: torch.Tensor) -> torch.Tensor:
    """EAGLE-3's ``d2t`` (int64 [D]): offsets such that target id = i + d2t[i]."""
    draft_ids = torch.as_tensor(draft_ids, dtype=torch.long)
    return draft_ids - torch.arange(draft_ids.numel(), device=draft_ids.device)


def t2d_from_ids(draft_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """EAGLE-3's ``t2d`` (bool [V]): True at the draft ids."""
    draft_ids = torch.as_tensor(draft_ids, dtype=torch.long)
    t2d = torch.zeros(vocab_size, dtype=torch.bool, device=draft_ids.device)
    t2d[draft_ids] = True
    return t2d


def ids_from_d2t(d2t: torch.Tensor) -> torch.Tensor:
    """The draft vocabulary's target ids (int64 [D], ascending) from ``d2t``."""
    return torch.arange(d2t.numel(), device=d2t.device) + d2t.long()


def coverage(token_counts: torch.Tensor, draft_ids: torch.Tensor) -> float:
    """Share of the counted tokens that fall inside the draft vocabulary (1.0 when nothing was counted)."""
    token_counts = torch.as_tensor(token_counts).to(torch.float64)
    total = float(token_counts.sum())
    return float(token_counts[torch.as_tensor(draft_ids, dtype=torch.long).cpu()].sum()) / total if total else 1.0


def draft_ids_from(counts_or_ids, size: int | None, vocab_size: int) -> torch.Tensor:
    """Draft ids from token counts (``size`` given: counts (V,) -> top-``size``) or from explicit
    token ids (``size`` None: unique ids in [0, V), returned sorted)."""
    values = torch.as_tensor(counts_or_ids)
    if size is not None:
        if values.dim() != 1 or values.numel() != vocab_size:
            raise ValueError(
                f"Token counts must be a vector over the target vocabulary ({vocab_size} ids), got shape "
                f"{tuple(values.shape)}. Fix: count with minlength={vocab_size}, or pass token ids with size=None."
            )
        return select_draft_ids(values, size)
    ids = values.long().view(-1).cpu()
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"Draft token ids must be a non-empty set of ids in [0, {vocab_size}).")
    unique = ids.unique()  # sorted
    if unique.numel() != ids.numel():
        raise ValueError("Draft token ids must not repeat.")
    return unique


def validate(d2t: torch.Tensor, t2d: torch.Tensor, vocab_size: int | None = None) -> None:
    """Raise ``ValueError`` unless ``d2t``/``t2d`` describe one draft vocabulary (of a ``vocab_size`` target)."""
    if vocab_size is not None and t2d.numel() != vocab_size:
        raise ValueError(
            f"The drafter's draft vocabulary map covers a target vocabulary of {t2d.numel()} ids, but the target has "
            f"{vocab_size}. Fix: use the target the drafter was trained for, or rebuild the map for this target "
            "(`drafter.set_draft_vocab(token_counts, size)` with counts over its vocabulary)."
        )
    if d2t.dim() != 1 or t2d.dim() != 1 or t2d.dtype != torch.bool:
        raise ValueError("A draft vocabulary map is d2t (int64 [D]) and t2d (bool [V]).")
    ids = ids_from_d2t(d2t)
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= t2d.numel():
        raise ValueError(f"d2t maps draft ids outside the target vocabulary [0, {t2d.numel()}).")
    if ids.numel() > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError("d2t must map draft indices to strictly increasing target ids (EAGLE-3's layout).")
    if int(t2d.sum()) != ids.numel() or not bool(t2d[ids].all()):
        raise ValueError("d2t and t2d disagree on the draft vocabulary. Fix: rebuild both with set_draft_vocab().")


class DraftHead:
    """A contiguous copy of the LM head's rows at the draft ids (detached; the target's head stays untouched).

    ``linear``: an ``nn.Linear`` (D, H) of those rows, frozen, so that decoding runs it through the few-row kernel this
    machine measures fastest like any other layer (:func:`hf_spec.few_row_linears`; on a 2-core AMD EPYC in float32
    an 8,192-row head over 4 rows took 4.2 ms through ``F.linear`` and 1.6 transposed, half of a drafting step);
    ``weight`` (D, H), ``bias`` (D,) or None, ``ids`` (D,) target ids, ``vocab_size`` V."""

    def __init__(self, head_weight: torch.Tensor, head_bias: torch.Tensor | None, draft_ids: torch.Tensor):
        self.ids = draft_ids.to(head_weight.device)
        weight = head_weight.detach().index_select(0, self.ids).contiguous()
        self.linear = nn.utils.skip_init(nn.Linear, weight.shape[1], weight.shape[0], bias=head_bias is not None,
                                         device=weight.device, dtype=weight.dtype)  # fmt: skip
        self.linear.weight = nn.Parameter(weight, requires_grad=False)
        if head_bias is not None:
            self.linear.bias = nn.Parameter(head_bias.detach().index_select(0, self.ids).contiguous(),
                                            requires_grad=False)  # fmt: skip
        self.vocab_size = head_weight.shape[0]

    @property
    def weight(self) -> torch.Tensor:
        return self.linear.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.linear.bias

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) logits; gradients flow to ``hidden`` only."""
        return self.linear(hidden)

    def to_full(self, draft_values: torch.Tensor, fill: float = float("-inf")) -> torch.Tensor:
        """Scatter (R, D) values into (R, V) at the draft ids, ``fill`` elsewhere."""
        return scatter_to_vocab(draft_values, self.ids, self.vocab_size, fill)


def scatter_to_vocab(draft_values: torch.Tensor, draft_ids: torch.Tensor, vocab_size: int, fill: float = float("-inf")):
    """Scatter (..., D) values over the draft vocabulary into (..., V) at ``draft_ids``, ``fill`` elsewhere."""
    out = draft_values.new_full((*draft_values.shape[:-1], vocab_size), fill)
    out[..., draft_ids] = draft_values
    return out


def full_vocab_probs(logq: torch.Tensor, draft_ids: torch.Tensor | None, vocab_size: int | None) -> torch.Tensor:
    """Probabilities (..., V) of draft log-probability rows: over the full vocabulary already (``draft_ids``
    None), or over the draft ids (..., D), scattered to ``vocab_size`` columns with 0 elsewhere."""
    if draft_ids is None:
        return logq.exp()
    if vocab_size is None:
        raise ValueError("Draft log-probabilities over draft ids need vocab_size (the target's vocabulary size).")
    return scatter_to_vocab(logq.exp(), draft_ids, vocab_size, fill=0.0)


def restrict_target_logits(full_logits: torch.Tensor, draft_ids: torch.Tensor, t2d: torch.Tensor):
    """Target training signal restricted to the draft vocabulary: (logits at the draft ids (..., D),
    mask (...,) of positions whose full-vocabulary argmax is a draft id)."""
    in_vocab = t2d.to(full_logits.device)[full_logits.argmax(-1)]
    return full_logits.index_select(-1, draft_ids.to(full_logits.device)), in_vocab


def draft_labels(labels: torch.Tensor, t2d: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Target-id labels -> draft indices; labels outside the draft vocabulary (and ``ignore_index``) become
    ``ignore_index`` (a token-level drafter's loss over the draft vocabulary, EAGLE-3's masking)."""
    t2d = t2d.to(labels.device)
    index = torch.cumsum(t2d.long(), 0) - 1  # target id -> draft index where t2d
    safe = labels.clamp(min=0)
    keep = (labels >= 0) & t2d[safe]
    return torch.where(keep, index[safe], torch.full_like(labels, ignore_index))
