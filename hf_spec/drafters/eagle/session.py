"""Drafting session of the EAGLE family (EAGLE/HASS/CORAL, EAGLE-3): a dynamic tree grown over the drafter's KV cache
of committed positions."""

from __future__ import annotations

import torch

from ... import compat
from ...cache import crop_to
from ...tree.dynamic import Frontier, TreeShape, grow_dynamic_tree
from ...tree.tree import DraftTree, causal_mask
from ..session import DraftingSession


class EagleDraftingSession(DraftingSession):
    """Drafting state of one generate() call: the drafter's KV cache of committed positions.

    Drafter position t holds the pair (target feature f_t, token x_{t+1}). Each cycle,
    :meth:`propose` appends the pairs the last verification committed (the accepted path and
    the new root token), grows a dynamic tree whose nodes attend to the committed cache and
    their own ancestors, then crops the tree's entries away again. ``drafter``: an
    :class:`~hf_spec.EagleDrafter` (or a family built on its interface: EAGLE-3, ParallelSpec).
    """

    def __init__(self, drafter, shape: TreeShape, do_sample: bool, temperature: float, prompt_ids=None):
        self.drafter = drafter
        self.shape = shape
        self.do_sample = do_sample
        self.temperature = temperature if do_sample else 1.0
        self.cache = compat.full_dynamic_cache()
        self.committed = 0
        self.use_router = drafter.router is not None and bool(drafter.config.use_router)
        draft_ids = drafter.draft_ids  # derived from the d2t buffer on each access: read once
        self.vocab_ids = draft_ids if draft_ids is not None and draft_ids.numel() >= shape.top_k else None
        """Target ids of the draft vocabulary when the tree is grown over it (draft log-probabilities (R, D),
        drawn ids mapped back); None: over the full vocabulary."""

    @property
    def supports_router(self) -> bool:
        """A CORAL LM-head router to draft through: only drafters that have one."""
        return self.drafter.router is not None

    def _run(self, tokens, features, positions, mask, last_only: bool = False):
        """One drafter forward; log-probabilities for every row, or for the last one only."""
        start = self.start_timing(self.drafter.device)
        out = self.drafter(
            input_ids=tokens.view(1, -1),
            hidden_states=features.unsqueeze(0),
            position_ids=positions.view(1, -1),
            attention_mask=mask,
            past_key_values=self.cache,
            use_cache=True,
        )
        hidden = out.last_hidden_state[0]
        head_input = hidden[-1:] if last_only else hidden  # the LM head is most of a drafter step
        logq = self.drafter.draft_log_probs(head_input, self.temperature, self.use_router,
                                            full_vocab=self.vocab_ids is None)  # fmt: skip
        # A broken drafter (NaN/inf weights) must cost speed, never correctness: such rows
        # propose nothing, and verification falls back to the target alone.
        logq = torch.nan_to_num(logq, nan=float("-inf"), posinf=float("-inf"), neginf=float("-inf"))
        self.stop_timing(start)
        return hidden, logq

    def propose(self, features: torch.Tensor, next_tokens: torch.Tensor) -> DraftTree:
        """Commit pairs (features[i], next_tokens[i]) to the drafter's cache and grow its dynamic tree rooted at
        ``next_tokens[-1]``."""
        device = features.device
        m = features.shape[0]
        positions = torch.arange(self.committed, self.committed + m, device=device)
        mask = causal_mask(self.committed, m, features.dtype, device)
        hidden, logq = self._run(next_tokens, features, positions, mask, last_only=True)
        self.committed += m
        committed = self.committed

        shape = self.shape
        node_hidden = torch.empty(shape.max_nodes, hidden.shape[-1], dtype=hidden.dtype, device=device)
        node_hidden[0] = hidden[-1]

        def expand(frontier: Frontier) -> torch.Tensor:
            attend = frontier.attend
            mask = torch.zeros(attend.shape[0], committed + attend.shape[1], dtype=hidden.dtype, device=device)
            mask[:, committed:].masked_fill_(~attend, torch.finfo(hidden.dtype).min)  # committed prefix: all visible
            out_hidden, out_logq = self._run(
                frontier.tokens,
                node_hidden[frontier.parents],
                committed - 1 + frontier.depths,
                mask.view(1, 1, *mask.shape),
            )
            node_hidden[frontier.nodes] = out_hidden
            return out_logq

        try:
            return grow_dynamic_tree(next_tokens[-1], logq[-1], expand, shape, self.do_sample,  # no host read
                                     vocab_ids=self.vocab_ids, vocab_size=self.drafter.config.target_vocab_size)
        finally:
            crop_to(self.cache, committed)

