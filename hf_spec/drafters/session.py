"""The drafting-session contract between the decoding loop and every drafter family.

A drafter's ``new_drafting_session(...)`` returns a :class:`DraftingSession` subclass: the
drafting state of ONE sequence (one batch row) for one ``generate()`` call. The loop calls
:meth:`~DraftingSession.propose` once per cycle, sets :attr:`~DraftingSession.use_router` before
the first call when the session supports it, and at the end lets the session add its own counters
to the row's stats (:meth:`~DraftingSession.record`). Context n-gram branches are no family's
business: the loop wraps any session in :class:`~hf_spec.drafters.hybrid.NGramHybridSession`.
"""

from __future__ import annotations

import torch

from .. import timing
from ..tree.tree import DraftTree


def check_node_count(value, name: str = "ngram_nodes") -> int:
    """``value`` if it is a valid n-gram node count (an integer >= 0), else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0 (0: off), got {value!r}.")
    return value


class DraftingSession:
    """Drafting state of one sequence in one generate() call (subclass per drafter family).

    ``supports_router``: whether it can draft through a CORAL LM-head router, which the loop checks
    before setting :attr:`use_router` (a family may make it a property of the drafter instance).
    """

    supports_router: bool = False

    watch: timing.Stopwatch | None = None
    """Times the drafting work (:meth:`start_timing` / :meth:`stop_timing`); made at the first use."""
    use_router: bool | None = None
    """Draft through the LM-head router (None: the session has none); only when ``supports_router``."""
    copied: bool = False
    """Whether the last tree was a *copy cycle*'s: the n-gram trie of an earlier passage the text is copying, sized
    by the copy budget whatever the tree shape (:class:`~hf_spec.drafters.hybrid.NGramHybridSession`). The speed
    controller does not weigh such cycles between tree shapes (:mod:`hf_spec.controller`)."""
    wants_verify_costs: bool = False
    """Whether the session sizes its trees by the target's measured verification costs: the loop, which has the
    target, then hands them to :meth:`use_verify_costs` before the first :meth:`propose` (the drafter modules do
    not measure: :mod:`hf_spec.verify_cost` is the loop's business)."""

    def use_verify_costs(self, verify_ms: dict[int, float]) -> None:
        """Take the target's verification costs (tree size -> milliseconds) when :attr:`wants_verify_costs`."""
        raise NotImplementedError

    def propose(self, features: torch.Tensor | None, next_tokens: torch.Tensor) -> DraftTree:
        """Commit the pairs the last verification accepted and draft the next tree.

        ``features`` (m, ·): the target's features of the m newly committed positions (what the
        drafter reads of them; token-level drafters ignore them); ``next_tokens`` (m,): the token
        that follows each; the last one is the new root of the returned tree."""
        raise NotImplementedError

    def read_other_arms(self, own: int) -> None:
        """Said before a :meth:`propose` whose pairs span cycles that other arms of the speed controller ran since
        this session's last tree: only the first ``own`` tokens are that tree's commit. A session that learns
        from its own trees' outcomes must not count the rest as one (the n-gram hybrid's cost gate); others need
        not care."""

    @property
    def forward_seconds(self) -> float:
        """Seconds spent drafting (drafter forwards, n-gram lookups), timed by :meth:`propose` (on CUDA with
        events: no host sync per forward)."""
        return self.watch.seconds if self.watch is not None else 0.0

    def start_timing(self, device):
        """Open a timed region of drafting work on ``device``; pass the result to :meth:`stop_timing`."""
        if self.watch is None:
            self.watch = timing.Stopwatch(device)
        return self.watch.start()

    def stop_timing(self, started) -> None:
        self.watch.stop(started)

    def record(self, stats) -> None:
        """Add this session's counters to its row's :class:`~hf_spec.stats.GenerationStats` at the end of a call."""
        stats.drafter_forward_seconds += self.forward_seconds
