"""Drafting session of the S2D family: adaptive early-exit chain drafting with lazy catch-up (the KV-cache scheme:
:mod:`hf_spec.drafters.s2d`)."""

from __future__ import annotations

import torch

from ... import compat, draft_vocab
from ...stats import EarlyExitStats
from ...tree.dynamic import TreeShape, draw_candidates
from ...tree.tree import DraftTree, causal_mask
from ..session import DraftingSession


class SortedDraftingSession(DraftingSession):
    """Drafting state of one generate() call: adaptive early-exit chain drafting with lazy catch-up.

    Token position t holds committed token x_t; the drafter's output there predicts x_{t+1}.
    See :mod:`hf_spec.drafters.s2d` for the KV-cache scheme. ``exit_counts[i]``: draft tokens that
    left at exit i; ``last_exits``: the exit of each token of the last draft; cost counters
    ``layer_calls`` (layer forwards, whatever the number of positions) and ``head_calls``;
    :meth:`record` puts them into the row's stats (``early_exits``).
    """

    def __init__(self, drafter, shape: TreeShape, do_sample, temperature, prompt_ids):
        self.drafter = drafter
        self.depth = min(shape.depth, shape.total_tokens)
        self.min_score = shape.min_score  # log of tree_min_prob: the chain stops below it (None: off)
        self.do_sample = do_sample
        self.temperature = temperature if do_sample else 1.0
        self.thresholds = list(drafter.thresholds)
        self.segments = drafter.segments
        self.first_token = prompt_ids[0, :1].to(drafter.device)
        self.started = False
        self.cache = compat.full_dynamic_cache()
        num_segments = len(self.segments)
        self.done = [0] * num_segments  # positions each segment has processed
        self.pending = [None] * num_segments  # inputs of segment s for positions done[s]..done[s-1]-1
        self.committed = 0
        self.exit_counts = [0] * num_segments
        self.last_exits: list[int] = []
        self.layer_calls = 0
        self.head_calls = 0
        self.draft_ids = drafter.draft_ids if drafter.has_draft_vocab else None
        """Target ids of the draft vocabulary (tokens are drawn among its D columns and mapped back); None: full."""

    def record(self, stats) -> None:
        super().record(stats)
        mine = EarlyExitStats(list(self.exit_counts), self.layer_calls, self.head_calls)
        if stats.early_exits is None:
            stats.early_exits = mine
        else:  # another session of the same row (another arm of the speed controller)
            stats.early_exits.add(mine)

    def _run_segment(self, s: int, hidden: torch.Tensor) -> torch.Tensor:
        """Segment s over ``hidden`` (n, H), the inputs of positions done[s].. ; returns outputs (n, H)."""
        start, end = self.segments[s]
        past, n = self.done[s], hidden.shape[0]
        positions = torch.arange(past, past + n, device=hidden.device).view(1, -1)
        mask = causal_mask(past, n, hidden.dtype, hidden.device)
        out = self.drafter.run_layers(hidden.unsqueeze(0), start, end, positions, mask, self.cache)[0]
        self.done[s] = past + n
        self.layer_calls += end - start
        if s + 1 < len(self.segments):
            previous = self.pending[s + 1]
            self.pending[s + 1] = out if previous is None else torch.cat([previous, out])
        return out

    def _extend(self, tokens: torch.Tensor) -> torch.Tensor:
        """Embed ``tokens`` at the next positions and run the first segment; the last one's output."""
        hidden = self.drafter.embed_tokens(tokens.view(-1))
        return self._run_segment(0, hidden)[-1]

    def _deepen(self, s: int) -> torch.Tensor:
        """Run segment s on all its pending inputs (lazy catch-up); the newest position's output."""
        inputs = self.pending[s]
        self.pending[s] = None
        return self._run_segment(s, inputs)[-1]

    def _adaptive_exit(self, hidden: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Alg. 1's inner loop for the newest position: (logits at the chosen exit, exit index)."""
        last = len(self.segments) - 1
        for s in range(last + 1):
            if s > 0:
                hidden = self._deepen(s)
            if s < last and self.thresholds[s] > 1.0:
                continue  # a confidence never exceeds 1: skip this exit's LM head (fixed deeper sub-model)
            logits = self.drafter.exit_logits(hidden, s).float()
            self.head_calls += 1
            if s == last:
                return logits, s
            confidence = float(torch.softmax(logits, dim=-1).max())
            if confidence >= self.thresholds[s]:  # NaN confidence never exits early
                return logits, s

    def _rollback(self, length: int) -> None:
        """Forget every position >= ``length`` (draft tokens), keeping catch-up work on committed ones."""
        for s, (start, end) in enumerate(self.segments):
            if s > 0 and self.pending[s] is not None:
                keep = max(0, length - self.done[s])
                self.pending[s] = self.pending[s][:keep] if keep else None
            self.done[s] = min(self.done[s], length)
            compat.crop_cache_layers(self.cache, range(start, end), self.done[s])

    @torch.no_grad()
    def propose(self, features, next_tokens: torch.Tensor) -> DraftTree:
        """Commit ``next_tokens`` (the last is the new root) and draft a chain of ``depth`` tokens."""
        begin = self.start_timing(self.drafter.device)
        tokens = next_tokens.to(self.first_token.device).view(-1)
        if not self.started:
            tokens = torch.cat([self.first_token, tokens])
            self.started = True
        hidden = self._extend(tokens)
        self.committed = self.done[0]
        root = tokens[-1]
        drafts, rows, exits = [], [], []
        score = 0.0
        try:
            for d in range(self.depth):
                logits, s = self._adaptive_exit(hidden)
                logq = torch.log_softmax(logits / self.temperature, dim=-1)  # (D,) with a draft vocabulary
                # A broken drafter (NaN/inf) must cost speed, never correctness.
                logq = torch.nan_to_num(logq, nan=float("-inf"), posinf=float("-inf"), neginf=float("-inf"))
                if not bool(torch.isfinite(logq).any()):
                    break
                token, _ = draw_candidates(logq.view(1, -1), 1, self.do_sample)
                if self.min_score is not None:  # a chain's node score: its cumulative draft log-probability
                    score = score + float(logq[token.view(())])
                    if d > 0 and score < self.min_score:
                        break  # the first draft token is always verified (a dynamic tree's pinned node)
                token = token.view(1) if self.draft_ids is None else self.draft_ids[token.view(1)]
                drafts.append(token)
                rows.append(logq)
                exits.append(s)
                self.exit_counts[s] += 1
                if d + 1 < self.depth:
                    hidden = self._extend(token)
        finally:
            self._rollback(self.committed)
            self.last_exits = exits
            self.stop_timing(begin)
        draft_tokens = torch.cat(drafts) if drafts else root.new_empty(0)
        tree = DraftTree.chain(root, draft_tokens)
        if self.do_sample and drafts:  # the draft distributions over the full vocabulary, 0 outside the draft one
            tree.draft_probs = draft_vocab.full_vocab_probs(torch.stack(rows), self.draft_ids,
                                                            self.drafter.config.target_vocab_size)  # fmt: skip
        elif self.do_sample:
            tree.draft_probs = torch.zeros(0, self.drafter.config.target_vocab_size, device=root.device)
        return tree

