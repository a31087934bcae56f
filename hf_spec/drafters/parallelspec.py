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

from .. import timing
from ..cache import crop_to
from ..tree.static import StaticTreeShape, build_static_tree, static_tree_size
from ..tree.tree import DraftTree, causal_mask
from .eagle import EagleDrafter, EagleDrafterConfig, EagleDrafterOutput, EagleDraftingSession

DEFAULT_TREE_WIDTHS = (4, 2, 2, 1, 1)
"""Children per expanded node at depths 1..5 (paper A.3: wide near the root, narrowing)."""


class ParallelDrafterConfig(EagleDrafterConfig):
    """Config of :class:`ParallelDrafter`.

    Args:
        num_mask_tokens: k, the number of ``[MASK]`` embeddings; one forward drafts k+1 depths.
        tree_widths: children per expanded node at depths 1..len(tree_widths) (<= k+1) of the
            static draft tree. Every drafted node above the last depth is expanded, so the tree
            has w1 + w1*w2 + ... nodes (default (4, 2, 2, 1, 1): 60).
        Other fields: as :class:`EagleDrafterConfig`. ``tree_depth``/``tree_top_k``/
        ``tree_total_tokens`` default to the widths' depth, first width and tree size.
    """

    model_type = "hf_spec_parallel"
    default_training_method = "parallelspec"

    def __init__(self, num_mask_tokens: int = 4, tree_widths=None, **kwargs):
        self.num_mask_tokens = int(num_mask_tokens)
        if self.num_mask_tokens < 1:
            raise ValueError(f"num_mask_tokens must be >= 1, got {num_mask_tokens!r}.")
        widths = list(tree_widths) if tree_widths is not None else list(DEFAULT_TREE_WIDTHS[: self.num_mask_tokens + 1])
        if len(widths) > self.num_mask_tokens + 1:
            raise ValueError(
                f"tree_widths has {len(widths)} depths but {self.num_mask_tokens} [MASK] tokens draft at most "
                f"{self.num_mask_tokens + 1}. Fix: shorten tree_widths or raise num_mask_tokens."
            )
        self.tree_widths = widths
        kwargs.setdefault("tree_depth", len(widths))
        kwargs.setdefault("tree_top_k", widths[0] if widths else 1)
        kwargs.setdefault("tree_total_tokens", static_tree_size(widths)[0])
        super().__init__(**kwargs)


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
        an ordinary (feature, token) pair.
        """
        inputs_embeds = None
        if mask_ids is not None and bool((mask_ids > 0).any()):
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


class ParallelDraftingSession(EagleDraftingSession):
    """Drafting state of one generate() call: the drafter's KV cache of committed pairs.

    Each :meth:`propose` runs ONE drafter forward over the newly committed pairs (the last is
    the root pair) followed by ``[MASK]_1..[MASK]_{D-1}`` for a tree of depth D <= k+1, builds
    the static tree from the D distributions, and crops the masks' KV entries away again.
    Masks deeper than the tree are not run: a mask attends only to the context and the
    earlier masks, so dropping later ones changes no distribution the tree uses.
    """

    def __init__(self, drafter: ParallelDrafter, shape: StaticTreeShape, do_sample: bool, temperature: float,
                 prompt_ids=None):  # fmt: skip
        super().__init__(drafter, shape, do_sample, temperature, prompt_ids)
        self.num_masks = min(drafter.num_mask_tokens, shape.depth - 1)
        """[MASK] positions run per cycle: the tree's depth - 1."""
        self.last_logq = None
        """(num_masks + 1, V) draft log-probabilities of the last cycle (root pair, then each mask)."""

    def draft_distributions(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """Commit the pairs and return the (num_masks + 1, V) draft log-probabilities of the next depths."""
        start = timing.clock(features.device)
        device = features.device
        m, k = features.shape[0], self.num_masks
        tokens = torch.cat([next_tokens.long(), torch.zeros(k, dtype=torch.long, device=device)])
        mask_ids = torch.cat([torch.zeros(m, dtype=torch.long, device=device),
                              torch.arange(1, k + 1, device=device)])  # fmt: skip
        feats = torch.cat([features, features.new_zeros(k, features.shape[-1])])
        positions = torch.arange(self.committed, self.committed + m + k, device=device)
        try:
            out = self.drafter(
                input_ids=tokens.view(1, -1),
                hidden_states=feats.unsqueeze(0),
                position_ids=positions.view(1, -1),
                attention_mask=causal_mask(self.committed, m + k, features.dtype, device),
                past_key_values=self.cache,
                use_cache=True,
                mask_ids=mask_ids.view(1, -1),
            )
        finally:
            self.committed += m
            crop_to(self.cache, self.committed)  # the masks' KV entries never stay
        hidden = out.last_hidden_state[0, m - 1 :]
        logq = self.drafter.draft_log_probs(hidden, self.temperature)  # draft vocabulary rows only, if it has one
        # A broken drafter (NaN/inf weights) must cost speed, never correctness.
        logq = torch.nan_to_num(logq, nan=float("-inf"), posinf=float("-inf"), neginf=float("-inf"))
        self.forward_seconds += timing.clock(features.device) - start
        self.last_logq = logq
        return logq

    def propose(self, features: torch.Tensor, next_tokens: torch.Tensor) -> DraftTree:
        """Commit the pairs and draft a static tree rooted at ``next_tokens[-1]``."""
        logq = self.draft_distributions(features, next_tokens)
        return build_static_tree(int(next_tokens[-1]), logq, self.shape.widths, self.do_sample,
                                 total_tokens=self.shape.total_tokens)  # fmt: skip
