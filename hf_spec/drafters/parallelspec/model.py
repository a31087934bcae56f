"""ParallelSpec drafter: an EAGLE feature drafter plus k learned ``[MASK]`` embeddings.

One forward over ``[committed pairs…, root pair, [MASK]_1 .. [MASK]_k]`` gives k+1 draft
distributions at once: the root pair's output is q_1 (the token after the root, as in
EAGLE), ``[MASK]_j``'s output is q_{j+1} (j tokens further). The parallel group has size
k+1 (paper §5.1: k=4). Mask positions continue the position ids (root position + j) and
attend to the whole committed context, the root and the earlier masks of their group.

What a mask position feeds the EAGLE input ``fc([emb; feat])``:

- *token slot*: ``[MASK]_j``'s own trainable embedding, in place of a token embedding. The
  paper adds the k masks "to the embedding layer of the draft model" (§4.3) and says that
  EAGLE needs no other adaptation.
- *feature slot*: a zero vector. The paper does not name a feature for mask positions; the
  one it would need (the target feature of a not-yet-verified position) does not exist at
  draft time, so a mask position carries no target information and, like a ``[MASK]`` in a
  plain LM, is defined by its embedding alone (``fc([m_j; 0]) = W_e m_j + b``); everything
  it knows about the context comes through attention. Zeros keep training and inference
  inputs identical by construction (no estimate of a missing feature that could differ).
"""

from __future__ import annotations

import torch
from torch import nn

from ...tree.static import StaticTreeShape, static_tree_size
from ..eagle.model import EagleDrafter, EagleDrafterOutput
from .config import ParallelDrafterConfig
from .session import ParallelDraftingSession


class ParallelDrafter(EagleDrafter):
    """EAGLE drafter + k ``[MASK]`` embeddings: k+1 draft distributions from one forward."""

    config_class = ParallelDrafterConfig
    supports_tree_min_prob = False  # static trees from one forward: nothing to stop growing

    def __init__(self, config: ParallelDrafterConfig):
        super().__init__(config)
        self.mask_embedding = nn.Embedding(config.num_mask_tokens, config.target_hidden_size)
        self.generation_config.tree_widths = list(config.tree_widths)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, nn.Embedding):  # the [MASK] embeddings: same scale as the other weights
            module.weight.data.normal_(mean=0.0, std=self.config.initializer_range)
            return
        super()._init_weights(module)

    @property
    def num_mask_tokens(self) -> int:
        return self.config.num_mask_tokens

    def forward(self, input_ids, hidden_states, position_ids=None, attention_mask=None, past_key_values=None,
                use_cache: bool = False, output_logits: bool = False, mask_ids: torch.LongTensor | None = None,
                ) -> EagleDrafterOutput:  # fmt: skip
        """:meth:`EagleDrafter.forward` where ``mask_ids`` (b, s) marks mask positions.

        ``mask_ids[b, i] = j`` (1..k) makes position i ``[MASK]_j``: its token embedding is the
        j-th mask embedding (``input_ids`` there is ignored) and its feature is zero; 0 marks
        an ordinary (feature, token) pair. None: no mask position (the caller knows: no host read here).
        """
        inputs_embeds = None
        if mask_ids is not None:
            is_mask = (mask_ids > 0).unsqueeze(-1)
            token_ids = input_ids.masked_fill(mask_ids > 0, 0)
            embeds = self.embed(token_ids).to(self.mask_embedding.weight.dtype)
            masks = self.mask_embedding((mask_ids - 1).clamp(min=0))
            inputs_embeds = torch.where(is_mask, masks, embeds)
            hidden_states = hidden_states.masked_fill(is_mask, 0.0)
        return super().forward(
            input_ids=input_ids,
            hidden_states=hidden_states,
            position_ids=position_ids,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            use_cache=use_cache,
            output_logits=output_logits,
            inputs_embeds=inputs_embeds,
        )

    def tree_shape(self, depth=None, top_k=None, total_tokens=None) -> StaticTreeShape:
        """The static tree for one generation.

        Widths come from ``generation_config.tree_widths`` (the config's ``tree_widths``).
        ``tree_top_k`` given: every depth gets that width. ``tree_depth`` given: the widths are
        cut to it, or extended with their last width (at most k+1 depths).
        ``tree_total_tokens`` given: keep that many best-scoring nodes (expanded nodes are
        always kept when sampling); otherwise the configured ``tree_total_tokens`` when it is
        smaller than the whole tree, else the whole tree.
        """
        widths = list(getattr(self.generation_config, "tree_widths", None) or self.config.tree_widths)
        if top_k is not None:
            widths = [top_k] * len(widths)
        if depth is not None:
            if not isinstance(depth, int) or depth < 1:
                raise ValueError(f"tree_depth must be a positive integer, got {depth!r}.")
            if depth > self.num_mask_tokens + 1:
                raise ValueError(
                    f"This ParallelDrafter has {self.num_mask_tokens} [MASK] tokens, so one forward drafts at most "
                    f"{self.num_mask_tokens + 1} depths; got tree_depth={depth}. Fix: tree_depth <= "
                    f"{self.num_mask_tokens + 1}."
                )
            widths = (widths + [widths[-1]] * depth)[:depth]
        full = static_tree_size(widths)[0]
        if total_tokens is None:
            configured = getattr(self.generation_config, "tree_total_tokens", None) or self.config.tree_total_tokens
            total_tokens = min(configured, full) if configured else full
        return StaticTreeShape(depth=len(widths), top_k=max(widths), widths=tuple(widths), total_tokens=total_tokens)

    def new_drafting_session(self, target, shape, do_sample: bool, temperature: float = 1.0, prompt_ids=None):
        if not isinstance(shape, StaticTreeShape):
            shape = self.tree_shape(shape.depth, None, shape.total_tokens)
        return ParallelDraftingSession(self, shape, do_sample, temperature, prompt_ids)

