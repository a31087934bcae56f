"""EAGLE-style feature drafter (also the architecture of HASS and CORAL checkpoints).

One step maps (target feature f_t, embedding of token x_{t+1}) through
``fc([emb; feat])`` and ``num_layers`` decoder layers of the target's own family to a
predicted feature g_t ≈ f_{t+1}; the target's LM head turns it into the draft distribution
of x_{t+2}. As in EAGLE, the first layer has no input norm (the fc output feeds attention
directly) and no final norm is applied: the target features are already post-norm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.utils import ModelOutput

from ...tree.dynamic import TreeShape
from ...tree.tree import causal_mask
from ..base import SpecDrafterModel
from .config import DECODER_LAYERS, EagleDrafterConfig
from .router import GroupedHead, LMHeadRouter, routed_log_probs
from .session import EagleDraftingSession


@dataclass
class EagleDrafterOutput(ModelOutput):
    """``last_hidden_state``: predicted features (b, s, H); ``logits``: draft logits if asked."""

    last_hidden_state: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    past_key_values: object | None = None


class EagleDrafter(SpecDrafterModel):
    """EAGLE/HASS/CORAL feature drafter: ``fc([emb; feat])`` -> decoder layers -> target LM head."""

    supports_tree_min_prob = True

    config_class = EagleDrafterConfig

    def __init__(self, config: EagleDrafterConfig):
        super().__init__(config)
        layer_config = config.decoder_layer_config()
        layer_class, rotary_class = DECODER_LAYERS[layer_config.model_type]
        hidden = config.target_hidden_size
        self.fc = nn.Linear(2 * hidden, hidden, bias=True)
        self.layers = nn.ModuleList([layer_class(layer_config, i) for i in range(config.num_layers)])
        self.layers[0].input_layernorm = nn.Identity()
        self.rotary_emb = rotary_class(config=layer_config)
        self.router = None
        if config.router_num_groups:
            self._build_router(config.router_num_groups)
        self._grouped_head = None
        self.post_init()

    def _build_router(self, num_groups: int) -> None:
        hidden = self.config.target_hidden_size
        act = self.config.layer_config.get("hidden_act", "silu")
        self.router = LMHeadRouter(hidden, num_groups, act)
        self.register_buffer("router_token_order", torch.arange(self._router_vocab_size()), persistent=True)

    def _router_vocab_size(self) -> int:
        """What the router's groups partition: the draft vocabulary's D indices, else the V target ids."""
        return self.config.draft_vocab_size or self.config.target_vocab_size

    def set_draft_vocab(self, counts_or_ids, size: int | None = None):
        if self.router is not None:
            raise ValueError(
                "This drafter has an LM-head router, whose groups partition its current vocabulary. Fix: attach the "
                "draft vocabulary first, then add (and train) the router."
            )
        self._grouped_head = None
        return super().set_draft_vocab(counts_or_ids, size)

    set_draft_vocab.__doc__ = SpecDrafterModel.set_draft_vocab.__doc__

    def add_router(self, token_order: torch.Tensor, num_groups: int = 16, top_n: int = 2) -> LMHeadRouter:
        """Attach a fresh (untrained) CORAL LM-head router over ``num_groups`` groups of ``token_order``
        (a permutation of the vocabulary, e.g. :func:`hf_spec.drafters.eagle.router.frequency_order`; with a
        draft vocabulary, a permutation of the D draft indices 0..D-1)."""
        vocab = self._router_vocab_size()
        token_order = torch.as_tensor(token_order, dtype=torch.long)
        if token_order.shape != (vocab,) or not torch.equal(token_order.sort().values, torch.arange(vocab)):
            what = "draft vocabulary indices" if self.has_draft_vocab else "vocabulary ids"
            raise ValueError(f"token_order must be a permutation of the {vocab} {what}.")
        if not 1 <= top_n <= num_groups:
            raise ValueError(f"router top_n must be in [1, num_groups={num_groups}], got {top_n}.")
        self._build_router(num_groups)
        self.router.apply(self._init_weights)
        self.router.to(device=self.fc.weight.device, dtype=self.fc.weight.dtype)
        self.router_token_order.copy_(token_order)
        self.config.router_num_groups, self.config.router_top_n, self.config.use_router = num_groups, top_n, True
        self._grouped_head = None
        return self.router

    def draft_log_probs(
        self, hidden: torch.Tensor, temperature: float = 1.0, use_router: bool = False, full_vocab: bool = True
    ) -> torch.Tensor:
        """Float32 draft log-probabilities (R, V) of drafter outputs ``hidden`` (R, H): the full
        LM head, or with ``use_router`` only the router's top-n groups (-inf elsewhere).

        With a draft vocabulary only its D rows of the head are multiplied (the router's groups
        partition those rows) and the log-probabilities are -inf outside it; ``full_vocab=False``
        returns them as (R, D) over :attr:`draft_ids` instead (no (R, V) tensor to fill and scan)."""
        if not use_router:
            if self.has_draft_vocab:
                head = self.draft_head()
                logq = torch.log_softmax(head.logits(hidden).float() / temperature, dim=-1)
                return head.to_full(logq) if full_vocab else logq
            return torch.log_softmax(self.lm_logits(hidden).float() / temperature, dim=-1)
        if self.router is None:
            raise ValueError("This drafter has no LM-head router. Fix: drop use_router, or train one (train_coral.py).")
        if self.has_draft_vocab:
            head = self.draft_head()
            weight, bias, key = head.weight, head.bias, self._draft_head[0]
        else:
            _, lm_head = self._require_bound()
            weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
            key = (weight.data_ptr(), weight.dtype, weight.device)
        if self._grouped_head is None or self._grouped_head[0] != key:
            grouped = GroupedHead(weight, bias, self.router_token_order, self.config.router_num_groups)
            self._grouped_head = (key, grouped)
        router_logits = self.router(hidden.to(self.router.w1.weight.dtype))
        logq = routed_log_probs(hidden, router_logits, self._grouped_head[1], self.config.router_top_n, temperature)
        return head.to_full(logq) if self.has_draft_vocab and full_vocab else logq

    def forward(
        self,
        input_ids: torch.LongTensor,
        hidden_states: torch.Tensor,
        position_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values=None,
        use_cache: bool = False,
        output_logits: bool = False,
        inputs_embeds: torch.Tensor | None = None,
    ) -> EagleDrafterOutput:
        """One drafter pass.

        Args:
            input_ids: (b, s) tokens x_{t+1}.
            hidden_states: (b, s, H) target (or drafter-predicted) features f_t.
            position_ids: (b, s); defaults to past length + arange(s).
            attention_mask: additive float (b|1, 1, s, past + s) mask, or a (b, s) 0/1
                padding mask combined with causal masking; causal when omitted.
            past_key_values: a transformers ``Cache`` for incremental drafting.
            inputs_embeds: (b, s, H) token embeddings used instead of ``embed(input_ids)``
                (subclasses that feed learned embeddings, e.g. ParallelSpec's [MASK]s).
        """
        embeds = (self.embed(input_ids) if inputs_embeds is None else inputs_embeds).to(self.fc.weight.dtype)
        x = self.fc(torch.cat([embeds, hidden_states.to(self.fc.weight.dtype)], dim=-1))
        position_ids, attention_mask = positions_and_mask(x, position_ids, attention_mask, past_key_values)
        position_embeddings = self.rotary_emb(x, position_ids)
        for layer in self.layers:
            x = layer(
                x,
                attention_mask=attention_mask.to(x.dtype),
                position_ids=position_ids,
                past_key_values=past_key_values,
                use_cache=use_cache,
                position_embeddings=position_embeddings,
            )
        return EagleDrafterOutput(
            last_hidden_state=x,
            logits=self.lm_logits(x) if output_logits else None,
            past_key_values=past_key_values,
        )

    def new_drafting_session(self, target, shape: TreeShape, do_sample: bool, temperature: float = 1.0, prompt_ids=None):
        return EagleDraftingSession(self, shape, do_sample, temperature, prompt_ids)


def positions_and_mask(x: torch.Tensor, position_ids, attention_mask, past_key_values):
    """Default position ids (past length + arange) and the additive 4D mask of one drafter pass over
    ``x`` (b, s, ·): a given 4D mask is kept, a (b, past + s) 0/1 padding mask is combined with causal
    masking, and None means causal."""
    batch, length = x.shape[:2]
    past = past_key_values.get_seq_length() if past_key_values is not None else 0
    if position_ids is None:
        position_ids = torch.arange(past, past + length, device=x.device).view(1, -1).expand(batch, -1)
    if attention_mask is None or attention_mask.dim() == 2:
        mask = causal_mask(past, length, x.dtype, x.device)
        if attention_mask is not None:
            keys_valid = attention_mask.bool().view(batch, 1, 1, -1)
            if keys_valid.shape[-1] != past + length:
                raise ValueError("A 2D attention_mask must cover the cached and the new positions.")
            mask = mask.masked_fill(~keys_valid, torch.finfo(x.dtype).min)
        attention_mask = mask
    return position_ids, attention_mask

