"""Learned drafter skipping for hybrid trees (``ngram_adaptive_skip_nodes``).

A hybrid drafter (a trained drafter whose trees also carry context/datastore n-gram branches)
pays one drafter forward per cycle. Where the n-gram trie alone would commit about as many
tokens, that forward does not pay for itself and the cycle is faster drafting the trie alone, as
:class:`~hf_spec.drafters.ngram.NGramDrafter` does. Measured per cycle, whether it pays depends on
the n-gram match the cycle starts from and on the text: on SmolLM2 the drafter adds 0-3% more
accepted tokens on GSM8K cycles with a datastore match but 5-25% on MT-bench ones, for a forward
that costs ~8% of a cycle (benchmarks/smollm2-drafters-that-pay/zen4_bf16_session34). No fixed
rule fits every workload, so the choice is learned from the workload itself.

:class:`DrafterSkipPolicy` (one per drafter, tree shape and device; it outlives generate() calls,
as one call's ~60 cycles are too few to tell a 5% gain from noise) buckets cycles by their best
n-gram continuation: (match length, found in the context) or None (no match). Per bucket it keeps
decayed means (recent cycles weigh most) of the tokens committed per cycle when the drafter ran,
and of the tokens the n-gram trie alone committed (skipped cycles) or would have committed
(drafted cycles: the committed tokens' longest path through that trie plus the bonus token,
exact under greedy decoding, an estimate under sampling); and decayed means of the wall time of
drafted and of skipped cycles (before any skip: a drafted cycle's time less its drafting time).
A cycle skips the drafter when the trie alone is expected to commit more tokens per second. In a
skipped bucket, every ``explore_every``-th cycle drafts anyway, keeping the drafter's estimate
current.

Exactness: the choice depends on earlier cycles only (committed tokens and timings), never on
the current cycle's draws, and a skipped cycle drafts point-mass n-gram candidates, so
:mod:`hf_spec.verify` keeps greedy output and the sampled distribution exact, as for copy cycles.
Only speed depends on timings.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ngram import Continuation, TrieNodes


def bucket_of(first: Continuation | None, max_match: int) -> tuple[int, bool] | None:
    """A cycle's bucket: (match length, found in the context) of its best continuation; None without one."""
    if first is None:
        return None
    return min(first.match_length, max_match), first.position >= 0


def trie_accepts(trie: TrieNodes, committed: list[int]) -> int:
    """How many of ``committed`` (the tokens a cycle committed after its root, the bonus token included)
    form a path from the root through ``trie``: the drafts the trie alone would have had accepted under
    greedy decoding (a lower bound when it is all of them: beyond them the target's choices are unknown)."""
    children = {(parent, token): node for node, (parent, token) in enumerate(zip(trie.parents, trie.tokens))}
    node, accepted = -1, 0
    for token in committed:
        node = children.get((node, token))
        if node is None:
            break
        accepted += 1
    return accepted


@dataclass
class DecayedMean:
    """A mean in which each new value weighs ``1 / decay`` times the one before it."""

    decay: float = 0.99
    total: float = 0.0
    count: float = 0.0

    def add(self, value: float) -> None:
        self.total = self.total * self.decay + value
        self.count = self.count * self.decay + 1.0

    @property
    def value(self) -> float:
        return self.total / self.count


@dataclass
class SkipCycle:
    """One cycle in flight: its bucket, the n-gram trie it drafted or could have drafted, whether it skipped
    the drafter, its start time and the session's drafting seconds at its start."""

    bucket: tuple[int, bool] | None
    trie: TrieNodes
    skipped: bool
    start: float
    drafting_seconds_before: float


class DrafterSkipPolicy:
    """What drafting sessions of one drafter, tree shape and device learned about skipping the drafter (module
    docstring). A session calls :meth:`learn` with its last :class:`SkipCycle` once that cycle's committed
    tokens are known, and :meth:`should_skip` for the next one.

    Args:
        min_drafted: drafted cycles (decayed count) a bucket needs before it may skip (default 4).
        explore_every: in a skipped bucket, one cycle in this many drafts anyway (default 8).
        decay: weight kept by the older observations at each new one (default 0.99: ~100 cycles).
    """

    def __init__(self, min_drafted: float = 4, explore_every: int = 8, decay: float = 0.99):
        self.min_drafted, self.explore_every, self.decay = min_drafted, explore_every, decay
        self.hybrid_tokens: dict = {}
        """bucket -> mean tokens committed per drafted cycle."""
        self.ngram_tokens: dict = {}
        """bucket -> mean tokens the n-gram trie alone committed (skipped cycles) or would have (drafted ones)."""
        self.drafted_seconds, self.skipped_seconds, self.drafting_seconds = (DecayedMean(decay) for _ in range(3))
        self.skips: dict = {}
        """bucket -> skip decisions since its last drafted cycle."""

    def _mean(self, table: dict, bucket) -> DecayedMean:
        if bucket not in table:
            table[bucket] = DecayedMean(self.decay)
        return table[bucket]

    def learn(self, cycle: SkipCycle, committed: list[int], now: float, drafting_seconds: float) -> None:
        """Learn from ``cycle``, which committed ``committed`` (its tokens after the root, the new root last)
        and ended at ``now``, when the session had drafted ``drafting_seconds`` in all."""
        seconds = now - cycle.start
        if cycle.skipped:
            self.skipped_seconds.add(seconds)
            self._mean(self.ngram_tokens, cycle.bucket).add(len(committed))
            return
        self.drafted_seconds.add(seconds)
        self.drafting_seconds.add(drafting_seconds - cycle.drafting_seconds_before)
        self._mean(self.hybrid_tokens, cycle.bucket).add(len(committed))
        self._mean(self.ngram_tokens, cycle.bucket).add(trie_accepts(cycle.trie, committed) + 1)  # + the bonus

    def should_skip(self, bucket) -> bool:
        """Whether the next cycle, in ``bucket``, should draft the n-gram trie alone (and count the decision)."""
        skip = self._trie_alone_is_faster(bucket)
        if skip:
            self.skips[bucket] = self.skips.get(bucket, 0) + 1
            skip = self.skips[bucket] % self.explore_every != 0
        return skip

    def _trie_alone_is_faster(self, bucket) -> bool:
        hybrid, ngram = self.hybrid_tokens.get(bucket), self.ngram_tokens.get(bucket)
        if hybrid is None or hybrid.count < self.min_drafted:
            return False
        drafted = self.drafted_seconds.value
        skipped = self.skipped_seconds.value if self.skipped_seconds.count else drafted - self.drafting_seconds.value
        return ngram.value * drafted > hybrid.value * max(skipped, 1e-9)
