"""EAGLE-3 drafter: multi-layer feature fusion and its own draft head (Li et al., 2025).

The target's hidden states at three layers (default ``(2, L//2, L-3)``: the *inputs* of those
decoder layers, HF ``hidden_states[i]``) are concatenated and fused by ``fc`` (3H -> H, no
bias) into h. One decoder layer reads ``cat[input_layernorm(embed(x_{t+1})), hidden_norm(h)]``
(2H) in q/k/v and h in its residual; its output (pre-norm) is the drafter's hidden state,
fed back as h at the next tree depth (no fc for the drafter's own states). The draft
distribution is the drafter's OWN ``lm_head(norm(hidden))`` over the draft vocabulary
(``d2t``/``t2d``, :mod:`hf_spec.draft_vocab`). The token embedding is borrowed from the target
at bind time, like the other families. Drafting reuses :class:`~hf_spec.drafters.eagle.EagleDraftingSession`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from ... import draft_vocab
from ...tree.dynamic import TreeShape
from ..base import SpecDrafterModel
from ..eagle.model import EagleDrafterOutput, positions_and_mask
from ..eagle.session import EagleDraftingSession
from .config import Eagle3DrafterConfig


class Eagle3DecoderLayer(LlamaDecoderLayer):
    """transformers' Llama decoder layer whose q/k/v read 2H: ``cat[input_layernorm(embeds), hidden_norm(h)]``."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool = False):
        super().__init__(config, layer_idx=0)
        for name in ("q_proj", "k_proj", "v_proj"):
            out_features = getattr(self.self_attn, name).out_features
            setattr(self.self_attn, name, nn.Linear(2 * config.hidden_size, out_features, bias=False))
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.norm_before_residual = norm_before_residual

    def forward(self, hidden_states: torch.Tensor, input_embeds: torch.Tensor, **attention_kwargs) -> torch.Tensor:
        normed = self.hidden_norm(hidden_states)
        residual = normed if self.norm_before_residual else hidden_states
        attn_input = torch.cat([self.input_layernorm(input_embeds), normed], dim=-1)
        hidden_states = residual + self.self_attn(hidden_states=attn_input, **attention_kwargs)[0]
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class Eagle3Drafter(SpecDrafterModel):
    """EAGLE-3 drafter: ``fc`` over the target's fused layers -> one 2H-input decoder layer -> own
    ``norm`` + ``lm_head`` over the draft vocabulary (``d2t``/``t2d``; the full vocabulary without one)."""

    supports_tree_min_prob = True

    config_class = Eagle3DrafterConfig
    owns_draft_head = True
    """Its draft head (``norm`` + ``lm_head``) is its own and trained: training scores inside :meth:`forward`
    (``output_logits=True``), so data-parallel training sees every parameter use in the forward."""

    def __init__(self, config: Eagle3DrafterConfig):
        super().__init__(config)
        if config.eagle_aux_hidden_state_layer_ids is None:
            raise ValueError("Eagle3DrafterConfig needs eagle_aux_hidden_state_layer_ids. Fix: build it with for_target().")
        layer_config = config.decoder_layer_config()
        hidden = config.target_hidden_size
        self.fc = nn.Linear(len(config.eagle_aux_hidden_state_layer_ids) * hidden, hidden, bias=config.fc_bias)
        self.layers = nn.ModuleList([Eagle3DecoderLayer(layer_config, config.norm_before_residual)])
        self.norm = LlamaRMSNorm(hidden, eps=layer_config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size or config.target_vocab_size, bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(config=layer_config)
        self.router = None  # the drafting session's CORAL switch: none here
        self.post_init()

    def target_feature_layers(self) -> tuple[int, ...]:
        return tuple(self.config.eagle_aux_hidden_state_layer_ids)

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
        """One drafter pass; arguments as :meth:`EagleDrafter.forward`, except ``hidden_states``: (b, s, kH)
        fused target features (go through ``fc``) or (b, s, H) drafter hidden states (used as they are).
        ``last_hidden_state`` is pre-norm; ``logits`` are over the draft vocabulary (b, s, D)."""
        dtype = self.fc.weight.dtype
        embeds = (self.embed(input_ids) if inputs_embeds is None else inputs_embeds).to(dtype)
        h = self.project_features(hidden_states)
        position_ids, attention_mask = positions_and_mask(h, position_ids, attention_mask, past_key_values)
        h = self.layers[0](
            h,
            embeds,
            attention_mask=attention_mask.to(dtype),
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            position_embeddings=self.rotary_emb(h, position_ids),
        )
        return EagleDrafterOutput(last_hidden_state=h, logits=self.draft_logits(h) if output_logits else None,
                                  past_key_values=past_key_values)  # fmt: skip

    def project_features(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Fused target layers (..., kH) -> the decoder layer's hidden input (..., H) through ``fc``; H-wide
        drafter hidden states pass unchanged (what :meth:`forward` does with its ``hidden_states``)."""
        h = hidden_states.to(self.fc.weight.dtype)
        return self.fc(h) if h.shape[-1] == self.fc.in_features else h

    def decoding_modules(self) -> tuple[nn.Module, ...]:
        """Nothing: the draft head is the drafter's own ``lm_head``, a submodule."""
        return ()

    def draft_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The drafter's own head: ``lm_head(norm(hidden))`` (..., D) (D = V without a draft vocabulary)."""
        return self.lm_head(self.norm(hidden_states))

    def draft_log_probs(
        self, hidden: torch.Tensor, temperature: float = 1.0, use_router: bool = False, full_vocab: bool = True
    ) -> torch.Tensor:
        """Float32 draft log-probabilities (R, V) of drafter hidden states (R, H); -inf outside the draft vocabulary
        (``full_vocab=False``: (R, D) over :attr:`draft_ids`)."""
        if use_router:
            raise ValueError("Eagle3Drafter has no LM-head router. Fix: drop use_router.")
        logq = torch.log_softmax(self.draft_logits(hidden).float() / temperature, dim=-1)
        if not self.has_draft_vocab or not full_vocab:
            return logq
        return draft_vocab.scatter_to_vocab(logq, self.draft_ids, self.config.target_vocab_size)

    def set_draft_vocab(self, counts_or_ids, size: int | None = None):
        """As :meth:`SpecDrafterModel.set_draft_vocab`; the own head keeps its rows at the new ids, which must
        lie in the current vocabulary."""
        ids = draft_vocab.draft_ids_from(counts_or_ids, size, self.config.target_vocab_size).to(self.lm_head.weight.device)
        current = self.draft_ids if self.has_draft_vocab else torch.arange(self.config.target_vocab_size, device=ids.device)
        rows = torch.searchsorted(current, ids).clamp(max=current.numel() - 1)
        if not torch.equal(current[rows], ids):
            raise ValueError("The new draft vocabulary must be a subset of the current one (the head has no rows for "
                             "other ids). Fix: build a fresh drafter with from_target() and set it there.")  # fmt: skip
        self.lm_head.weight = nn.Parameter(self.lm_head.weight.detach()[rows].clone())
        self.lm_head.out_features = ids.numel()
        super().set_draft_vocab(ids.cpu(), None)
        return self

    def clear_draft_vocab(self):
        raise ValueError("An Eagle3Drafter's own head covers only its draft vocabulary. Fix: build a fresh drafter "
                         "with from_target() for the full vocabulary.")  # fmt: skip

    def new_drafting_session(self, target, shape: TreeShape, do_sample: bool, temperature: float = 1.0, prompt_ids=None):
        return EagleDraftingSession(self, shape, do_sample, temperature, prompt_ids)

