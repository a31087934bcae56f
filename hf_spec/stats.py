"""What one speculative ``generate()`` call did: the stats object the loop records and the
drafter exposes as ``drafter.last_generation_stats`` (the public way to read a call's results)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EarlyExitStats:
    """Work of an early-exit drafter (S2D, :class:`~hf_spec.drafters.s2d.SortedDrafter`) in one call.

    ``exit_counts[i]``: draft tokens that left at exit i; ``layer_calls``: drafter layer forwards
    (whatever the number of positions); ``head_calls``: exit LM-head calls."""

    exit_counts: list[int]
    layer_calls: int = 0
    head_calls: int = 0

    def add(self, other: EarlyExitStats) -> None:
        """Add ``other``'s counts (another row of the same call) to these."""
        self.exit_counts = [a + b for a, b in zip(self.exit_counts, other.exit_counts)]
        self.layer_calls += other.layer_calls
        self.head_calls += other.head_calls


@dataclass
class GenerationStats:
    """What one speculative generate() call (or one row of a batched call) did.

    ``accepted_lengths``: drafted tokens accepted in each cycle (each cycle also emits one
    target token); ``accepted_from_ngram``: how many of those were nodes that only n-gram
    grafting drafted (``ngram_nodes``), the rest came from the drafter
    (:attr:`accepted_from_drafter`); ``tree_sizes``: nodes verified per cycle (root included), the
    size that sets a verification forward's cost. ``verify_forwards``: target verification forwards (one per
    cycle, whatever the number of rows). Seconds: ``target_forward_seconds`` (prefill +
    verification forwards), ``drafter_forward_seconds`` (drafter forwards), ``total_seconds``
    (the whole loop). ``drafter_skipped_cycles``: cycles whose tree held n-gram nodes only and ran no drafter
    forward (the cost gate chose the n-gram trie alone). ``early_exits``: the early-exit drafter's own counters
    (None for the other families), filled by its drafting sessions.
    """

    accepted_lengths: list[int] = field(default_factory=list)
    accepted_from_ngram: int = 0
    tree_sizes: list[int] = field(default_factory=list)
    new_tokens: int = 0
    verify_forwards: int = 0
    target_forward_seconds: float = 0.0
    drafter_forward_seconds: float = 0.0
    drafter_skipped_cycles: int = 0
    total_seconds: float = 0.0
    early_exits: EarlyExitStats | None = None
    arm_per_cycle: list[int] = field(default_factory=list)
    """The speed controller's arm of each cycle (an index into ``controller["arms"]``; arm 0 drafts nothing);
    empty when the call fixed its shape (no controller)."""
    cycle_seconds: list[float] = field(default_factory=list)
    """Wall seconds of each cycle (propose, verify, commit and emit; for a batch, of all its rows), as the speed
    controller measures them."""
    controller: dict | None = None
    """What the speed controller (:mod:`hf_spec.controller`) knew after this call: ``arms`` (labels, ``plain``
    first), ``current`` (the arm it exploits), ``ms_per_token`` (measured wall milliseconds per committed token
    per arm, recent cycles weighing most; None: not measured lately), ``cycles``, ``probes`` and ``moves`` (over
    the process's calls with this drafter, target and settings). None: no controller ran."""
    verify_ms: dict[int, float] | None = None
    """The target's verification costs after this call as this process measures them (tree size -> wall ms,
    :meth:`hf_spec.verify_cost.VerifyCosts.curve`: the timed prior corrected by decoding's own verifications), which
    the next call's n-gram trees and cost gate are sized by. None: no drafter of this call sizes trees by them."""
    engines: dict | None = None
    """What the engine chooser (:class:`~hf_spec.controller.EngineChooser`) of a compiled static layout
    (``cache_implementation="static"`` with compilation) knew after this call, per bucket size (nodes a verification
    forward is padded to): ``engine`` (``"eager"`` or ``"compiled"``, the one in use), ``ms_per_forward`` per engine
    (median of its last timed forwards; None: not timed yet), ``calls`` per engine and ``checks`` (over the
    process's calls with this target and settings). None: no compiled call, so every forward ran eagerly."""

    @property
    def cycles(self) -> int:
        return len(self.accepted_lengths)

    @property
    def accepted_from_drafter(self) -> int:
        """Accepted drafted tokens that the drafter itself drafted."""
        return sum(self.accepted_lengths) - self.accepted_from_ngram

    def record(self, tree, walk) -> None:
        """Count one verified cycle: its accepted drafts, and those from n-gram-only nodes."""
        self.accepted_lengths.append(walk.num_accepted_drafts)
        self.tree_sizes.append(len(tree))
        if tree.from_ngram is not None and walk.num_accepted_drafts:
            self.accepted_from_ngram += sum(bool(tree.from_ngram[node]) for node in walk.nodes[1:])

    def add_row(self, row: GenerationStats) -> None:
        """Add one row's cycles and counters (a batched call's totals over its rows)."""
        self.accepted_lengths += row.accepted_lengths
        self.tree_sizes += row.tree_sizes
        self.accepted_from_ngram += row.accepted_from_ngram
        self.new_tokens += row.new_tokens
        self.drafter_forward_seconds += row.drafter_forward_seconds
        self.drafter_skipped_cycles += row.drafter_skipped_cycles
        if row.early_exits is not None:
            if self.early_exits is None:
                self.early_exits = EarlyExitStats([0] * len(row.early_exits.exit_counts))
            self.early_exits.add(row.early_exits)

    @property
    def tau(self) -> float:
        """Mean tokens emitted per verification forward (accepted drafts + 1)."""
        if not self.accepted_lengths:
            return float("nan")
        return sum(self.accepted_lengths) / len(self.accepted_lengths) + 1.0

    def acceptance_by_position(self) -> list[float]:
        """Share of cycles whose i-th draft position (i = 1, 2, …) was accepted."""
        if not self.accepted_lengths:
            return []
        deepest = max(self.accepted_lengths)
        return [sum(a >= i for a in self.accepted_lengths) / self.cycles for i in range(1, deepest + 1)]

    @property
    def overhead_share(self) -> float:
        """Share of the loop's wall time spent outside the two models' forwards."""
        if self.total_seconds <= 0:
            return float("nan")
        return 1.0 - (self.target_forward_seconds + self.drafter_forward_seconds) / self.total_seconds


@dataclass
class BatchGenerationStats(GenerationStats):
    """:class:`GenerationStats` of a batched call: the fields aggregate over rows.

    ``accepted_lengths`` lists every row's cycles (so ``tau`` is tokens per row per
    verification); ``rows`` holds each row's own stats; ``verify_forwards`` counts the
    batched target forwards (one per cycle, whatever the number of rows).
    """

    rows: list[GenerationStats] = field(default_factory=list)
