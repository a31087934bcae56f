"""Learned per-cycle drafter skipping for hybrid trees (``ngram_adaptive_skip_nodes``).

A hybrid drafter (a trained drafter whose trees also carry context/datastore n-gram branches)
pays one drafter forward per cycle. Where the n-gram trie alone would commit about as many
tokens, that forward does not pay for itself and the cycle is faster drafting the trie alone, as
:class:`~hf_spec.drafters.ngram.NGramDrafter` does. Which cycles those are depends on the text
(an arithmetic answer repeats the question's numbers and the corpus's phrases; a chat answer
does not) and on the machine (what a drafter forward costs beside a verification), so no fixed
rule holds everywhere: a rule of match length alone won on tuned prompts and lost on fresh ones
(benchmarks/smollm2-drafters-that-pay/zen4_bf16_session33/match_cycles_ab).

:class:`DrafterSkipPolicy` learns it online, within one generate() call. A cycle's *bucket* is
the n-gram match it starts from (its best continuation's match length, and whether that
continuation is in the context or only in the datastore; no continuation at all is a bucket
too). Per bucket it keeps the mean tokens per cycle committed when the drafter ran (the hybrid
tree), and the mean tokens per cycle of the n-gram trie alone: measured on skipped cycles, and
on drafted cycles read off the committed tokens (the longest path of them through the trie the
cycle would have drafted; exact under greedy decoding, an estimate under sampling). It also
keeps the mean wall time of drafted and of skipped cycles (before any skip: a drafted cycle's
time less its drafting time). A cycle skips the drafter when the trie alone is expected to commit
more tokens per second; after ``explore_every`` skips in a row in a bucket it drafts once, so
the estimate of the drafter's worth there stays current.

Exactness: the choice depends on earlier cycles only (their committed tokens and timings),
never on the current cycle's draws, and a skipped cycle drafts point-mass n-gram candidates,
so :mod:`hf_spec.verify` keeps greedy output and the sampled distribution exact, as for copy
cycles. Only speed depends on timings.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ngram import Continuation, TrieNodes


def bucket_of(first: Continuation | None, max_match: int) -> tuple[int, bool] | None:
    """The cycle's bucket: (match length, found in the context) of its best continuation; None without one."""
    if first is None:
        return None
    return min(first.match_length, max_match), first.position >= 0


def trie_accepts(trie: TrieNodes, committed: list[int]) -> int:
    """How many of ``committed`` (the tokens a cycle committed after its root, the bonus token included)
    form a path from the root through ``trie``: the drafts the trie alone would have had accepted, under
    greedy decoding (a lower bound when it is all of them: beyond them the target's choices are unknown)."""
    children: dict[tuple[int, int], int] = {(parent, token): node
                                            for node, (parent, token) in enumerate(zip(trie.parents, trie.tokens))}  # fmt: skip
    node, accepted = -1, 0
    for token in committed:
        node = children.get((node, token))
        if node is None:
            break
        accepted += 1
    return accepted


@dataclass
class _Mean:
    total: float = 0.0
    count: int = 0

    def add(self, value: float) -> None:
        self.total += value
        self.count += 1

    @property
    def value(self) -> float:
        return self.total / self.count


@dataclass
class _Cycle:
    bucket: tuple[int, bool] | None
    trie: TrieNodes
    skipped: bool
    start: float
    drafting_seconds_before: float


class DrafterSkipPolicy:
    """Chooses, each cycle of one generate() call, between drafting the hybrid tree and the n-gram trie
    alone (module docstring). The session calls :meth:`observe` at the start of every cycle, then either
    :meth:`forget` (a cycle this policy does not choose, e.g. a copy cycle) or :meth:`should_skip`
    followed by :meth:`begin`.

    Args:
        min_drafted: drafted cycles a bucket needs before it may skip (default 2).
        explore_every: after this many skips in a row in a bucket, draft once (default 4).
    """

    def __init__(self, min_drafted: int = 2, explore_every: int = 4):
        self.min_drafted = min_drafted
        self.explore_every = explore_every
        self.hybrid_tokens: dict = {}
        """bucket -> mean tokens committed per drafted cycle."""
        self.ngram_tokens: dict = {}
        """bucket -> mean tokens the n-gram trie alone committed (skipped cycles) or would have (drafted)."""
        self.drafted_seconds, self.skipped_seconds, self.drafting_seconds = _Mean(), _Mean(), _Mean()
        self.skips_in_a_row: dict = {}
        self.skipped_cycles = 0
        self._cycle: _Cycle | None = None

    def observe(self, committed: list[int], now: float, drafting_seconds: float) -> None:
        """Learn from the last cycle: ``committed``, the tokens it committed after its root (the new root
        last); ``now``, this cycle's start; ``drafting_seconds``, the session's drafting time so far."""
        cycle, self._cycle = self._cycle, None
        if cycle is None:
            return
        seconds = now - cycle.start
        ngram = self.ngram_tokens.setdefault(cycle.bucket, _Mean())
        if cycle.skipped:
            self.skipped_seconds.add(seconds)
            ngram.add(len(committed))
            return
        self.drafted_seconds.add(seconds)
        self.drafting_seconds.add(drafting_seconds - cycle.drafting_seconds_before)
        self.hybrid_tokens.setdefault(cycle.bucket, _Mean()).add(len(committed))
        ngram.add(trie_accepts(cycle.trie, committed) + 1)  # + the bonus token

    def forget(self) -> None:
        """This cycle is not the policy's choice (a copy cycle): nothing to learn from it."""
        self._cycle = None

    def should_skip(self, bucket) -> bool:
        """Whether this cycle, in ``bucket``, should draft the n-gram trie alone."""
        hybrid, ngram = self.hybrid_tokens.get(bucket), self.ngram_tokens.get(bucket)
        if hybrid is None or hybrid.count < self.min_drafted or ngram is None:
            return False
        if self.skips_in_a_row.get(bucket, 0) >= self.explore_every:
            return False
        drafted = self.drafted_seconds.value
        skipped = self.skipped_seconds.value if self.skipped_seconds.count else drafted - self.drafting_seconds.value
        return ngram.value * drafted > hybrid.value * max(skipped, 1e-9)

    def begin(self, bucket, trie: TrieNodes, skipped: bool, now: float, drafting_seconds: float) -> None:
        """Start a cycle in ``bucket`` that drafts ``trie`` alone (``skipped``) or the hybrid tree, whose
        n-gram-alone counterpart is ``trie``."""
        self.skips_in_a_row[bucket] = self.skips_in_a_row.get(bucket, 0) + 1 if skipped else 0
        self.skipped_cycles += skipped
        self._cycle = _Cycle(bucket, trie, skipped, now, drafting_seconds)
