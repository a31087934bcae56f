"""CORAL's LM-head router (§3.3, App. F): draft with only a few vocabulary groups of the LM head.

The vocabulary is split into ``N`` equal groups of a fixed token order (by default the
training data's token frequency, most frequent first, ties and unseen tokens by id: see
:func:`frequency_order`), so the few groups that carry most of the probability mass are
small blocks of rows of the LM head. A router ``p = softmax(W2(act(W1 h) + h))`` over the
groups picks the top-n groups of each draft row; only those groups' rows of the head are
multiplied (one matmul per selected group, each group's rows read once per call), so a
routed draft step really skips (N - n) / N of the head's FLOPs and weight reads.

Draft distribution (Eq. 8): ``q(x) = p_router(g) / Σ_{g' in top-n} p_router(g') ·
softmax(logits_g / T)(x)`` for x in a selected group g, 0 elsewhere. The router probability is
renormalised over the selected groups so that q sums to 1, and the temperature scales the
in-group logits only. Verification uses exactly this q, so sampling stays lossless
whatever the router's quality; a bad router only costs acceptance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN

from ...draft_vocab import frequency_order  # noqa: F401  (re-exported: the router's token order)


class LMHeadRouter(nn.Module):
    """``p_router = softmax(W2(act(W1 h) + h))`` over ``num_groups`` vocabulary groups (Eq. 7)."""

    def __init__(self, hidden_size: int, num_groups: int, hidden_act: str = "silu"):
        super().__init__()
        self.w1 = nn.Linear(hidden_size, hidden_size, bias=False)
        self.w2 = nn.Linear(hidden_size, num_groups, bias=False)
        self.act = ACT2FN[hidden_act]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Router logits (..., num_groups)."""
        return self.w2(self.act(self.w1(hidden_states)) + hidden_states)


def group_slices(vocab_size: int, num_groups: int) -> list[slice]:
    """Positions of each group in the token order: ``num_groups`` blocks of ceil(V / N) (the last shorter)."""
    if not 1 <= num_groups <= vocab_size:
        raise ValueError(f"router_num_groups must be in [1, vocab size {vocab_size}], got {num_groups}.")
    size = -(-vocab_size // num_groups)
    return [slice(g * size, min((g + 1) * size, vocab_size)) for g in range(num_groups)]


def group_mass(probs: torch.Tensor, token_order: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Probability mass of each group (..., N) from full-vocabulary probabilities (..., V):
    the router's training target q_router (Eq. 9)."""
    ordered = probs.index_select(-1, token_order.to(probs.device))
    return torch.stack([ordered[..., s].sum(-1) for s in group_slices(probs.shape[-1], num_groups)], dim=-1)


class GroupedHead:
    """The LM head's rows regrouped in router order: ``weights[g]`` (|g|, H), ``token_ids[g]`` (|g|,).

    Built once per (head, dtype) at the first routed call; a copy of the head's weights
    (the target's head is borrowed and stays untouched)."""

    def __init__(self, head_weight: torch.Tensor, head_bias: torch.Tensor | None, token_order: torch.Tensor,
                 num_groups: int):  # fmt: skip
        order = token_order.to(head_weight.device)
        self.token_ids = [order[s] for s in group_slices(head_weight.shape[0], num_groups)]
        self.weights = [head_weight.detach().index_select(0, ids).contiguous() for ids in self.token_ids]
        self.biases = [None if head_bias is None else head_bias.detach()[ids] for ids in self.token_ids]
        self.vocab_size = head_weight.shape[0]


def routed_log_probs(
    hidden: torch.Tensor,
    router_logits: torch.Tensor,
    head: GroupedHead,
    top_n: int,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Draft log-probabilities (R, V) of ``hidden`` (R, H) through the top-``top_n`` groups only.

    Tokens outside a row's selected groups get -inf. Each selected group's head rows are
    multiplied once, by exactly the rows that selected it.
    """
    router_logp = torch.log_softmax(router_logits.float(), dim=-1)
    top_logp, top_groups = router_logp.topk(min(top_n, router_logp.shape[-1]), dim=-1)
    top_logp = top_logp - torch.logsumexp(top_logp, dim=-1, keepdim=True)  # renormalise over the selected groups
    out = torch.full((hidden.shape[0], head.vocab_size), float("-inf"), device=hidden.device)
    for group in torch.unique(top_groups).tolist():
        rows, slot = (top_groups == group).nonzero(as_tuple=True)
        logits = F.linear(hidden[rows], head.weights[group], head.biases[group]).float() / temperature
        in_group = torch.log_softmax(logits, dim=-1) + top_logp[rows, slot].unsqueeze(-1)
        out[rows.unsqueeze(1), head.token_ids[group].unsqueeze(0)] = in_group
    return out
