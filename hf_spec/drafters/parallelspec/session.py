"""Drafting session of the ParallelSpec family: one drafter forward over the committed pairs and the ``[MASK]``s
gives every depth's distribution; the static tree is built from them."""

from __future__ import annotations

import torch

from ...cache import crop_to
from ...tree.static import StaticTreeShape, build_static_tree
from ...tree.tree import DraftTree, causal_mask
from ..eagle.session import EagleDraftingSession


class ParallelDraftingSession(EagleDraftingSession):
    """Drafting state of one generate() call: the drafter's KV cache of committed pairs.

    Each :meth:`propose` runs ONE drafter forward over the newly committed pairs (the last is
    the root pair) followed by ``[MASK]_1..[MASK]_{D-1}`` for a tree of depth D <= k+1, builds
    the static tree from the D distributions, and crops the masks' KV entries away again.
    Masks deeper than the tree are not run: a mask attends only to the context and the
    earlier masks, so dropping later ones changes no distribution the tree uses.
    """

    def __init__(self, drafter, shape: StaticTreeShape, do_sample: bool, temperature: float,
                 prompt_ids=None):  # fmt: skip
        super().__init__(drafter, shape, do_sample, temperature, prompt_ids)
        self.num_masks = min(drafter.num_mask_tokens, shape.depth - 1)
        """[MASK] positions run per cycle: the tree's depth - 1."""
        self.last_logq = None
        """(num_masks + 1, V) draft log-probabilities of the last cycle (root pair, then each mask)."""

    def draft_distributions(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """Commit the pairs and return the (num_masks + 1, V) draft log-probabilities of the next depths."""
        start = self.start_timing(features.device)
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
                mask_ids=mask_ids.view(1, -1) if k else None,
            )
        finally:
            self.committed += m
            crop_to(self.cache, self.committed)  # the masks' KV entries never stay
        hidden = out.last_hidden_state[0, m - 1 :]
        logq = self.drafter.draft_log_probs(hidden, self.temperature)  # draft vocabulary rows only, if it has one
        # A broken drafter (NaN/inf weights) must cost speed, never correctness.
        logq = torch.nan_to_num(logq, nan=float("-inf"), posinf=float("-inf"), neginf=float("-inf"))
        self.stop_timing(start)
        self.last_logq = logq
        return logq

    def propose(self, features: torch.Tensor, next_tokens: torch.Tensor) -> DraftTree:
        """Commit the pairs and draft a static tree rooted at ``next_tokens[-1]``."""
        logq = self.draft_distributions(features, next_tokens)
        return build_static_tree(next_tokens[-1], logq, self.shape.widths, self.do_sample,
                                 total_tokens=self.shape.total_tokens)  # fmt: skip

