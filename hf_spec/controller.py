"""The online speed controller: which arm each decoding cycle uses, from this process's own measured cycles.

An *arm* is one way to run a cycle. Arm 0 is always **plain**: no draft, one target step through the same
loop (exact by construction, and as fast as plain ``generate()``). Arms 1..n are the drafter's tree shapes
with their n-gram budgets, ordered from cheap to costly, a *ladder*. Along one dimension (a bigger tree at one n-gram
budget, or a bigger budget with one tree) speed is close to unimodal: more nodes buy more accepted tokens until
verification and drafting cost more than they buy. A ladder that mixes two dimensions is not: the rung after a
small tree with 3 n-gram nodes may be a bigger tree with 8 and slower than both its neighbours while the bigger
tree with 3 is the fastest. So arms may carry *positions* (tree rank, n-gram rank): an arm's neighbours are then
also the nearest arms that differ from it in one coordinate only, and the climb moves one dimension at a time.

What the controller measures is what a user feels: wall seconds per committed token, for each arm, from the
cycles that arm ran (the loop reports each cycle's wall time and committed tokens). Estimates are ratios of
exponentially discounted sums (half-life :attr:`SpeedController.half_life` cycles of the whole run, so an old
measurement fades whether or not its arm runs again: the machine's speed drifts and an answer moves from prose
to code).

The policy is a hill climb with probes:

- it *exploits* one arm (``current``); every so often it *probes* a neighbour (one rung cheaper or costlier, an
  arm one step away in one coordinate, plain, which bounds the worst case, from any rung, and from a drafted arm
  the drafted arm further away that measured fastest, when it measured faster than the exploited one: a lucky
  spell can leave the climb on an arm whose neighbours are all slower) for a few cycles, until the probe has
  committed ``probe_tokens`` tokens in two measured cycles or more (at most ``max_probe_cycles`` cycles);
- after a probe it moves to the neighbour when that measured faster per token by more than ``margin`` (between plain
  and a drafted arm that commits hardly more tokens per cycle than a plain step, the token counts decide: plain) and,
  between two drafted arms, when the neighbour's probe cycles since the last move (the latest ``evidence_cycles``) say
  so beyond ``significance`` standard errors: how many tokens a cycle commits varies from one to the whole tree, so a
  probe of a few cycles reads an arm as fast or slow by chance, and the margin alone walked the controller between
  drafted arms of about equal speed (on a 2-core Xeon in float32 HASS walked to costlier trees and ran 1.30x plain
  where EAGLE kept the small ones and ran 1.46x); else the next probe of that neighbour waits as long as an
  *exploration budget* allows: a probe that cost L seconds more than exploiting would have waits about L /
  (``exploration_budget`` x the exploited arm's seconds per cycle) cycles (at least ``first_interval``, at most
  ``max_interval``). So a neighbour that is hopeless is probed rarely, one that is close is probed often (cheaply: the
  text may have moved to where it wins, e.g. from prose to a passage the n-gram branches copy), and exploration costs
  about ``exploration_budget`` of the time whatever the arms are; a probe of a neighbour far slower ends after two
  cycles (``give_up``). A drafted neighbour is also probed at once when the exploited arm's time per token comes near
  what the neighbour measured (``catch_up``), and a costlier drafted neighbour when the exploited drafted arm's time
  per token has fallen much since the neighbour's last probe (``easier``: the text became easier to draft);
- after a move it probes the next rungs the same way up or down the ladder soon (``momentum``); while plain is
  exploited, each new ``generate()`` call probes the drafted neighbour early when the drafter's drafts are accepted
  at all (``new_call_probe``): plain's own timing cannot show that a new text favours drafting;
- a *copy cycle* (the text is copying an earlier passage: the cycle verified the n-gram trie of that passage, sized
  by the copy budget whatever the arm) commits up to tens of tokens on any drafted arm, so it says nothing about
  which drafted arm is faster: it counts for plain against drafting but not between drafted arms (one copy-heavy
  answer made whichever arms ran during it read several times faster than they are for the answers after it, and the
  controller ran those arms there);
- the first cycle after a switch is not measured (it carries the catch-up work of an arm that had not run:
  its drafter reads the committed tokens it missed), nor the first cycle of a call (the drafter reads the
  prompt), nor a cycle that packed a weight (a CPU kernel trial's first-time work, whatever the arm:
  :func:`hf_spec.linear_kernels.weights_packed`); a cycle counts at most ``outlier`` times its arm's mean cycle time
  (a stall must not condemn an arm).

Nothing is cached on disk and nothing is final: the controller lives as long as the process, one per
(drafter, target, device, dtype, threads, batch size class, sampling) (:func:`controller_for`), and keeps
probing. Its choices change speed only: every arm's trees are verified exactly, and the choice of the next
cycle's arm depends on past cycles only, so greedy output stays identical to plain ``generate()`` and sampled
output keeps the target's distribution, whenever the arm changes.

The same measured-cost idea chooses the *engine* of a static layout's verification forwards
(:class:`EngineChooser`): where a compiled call exists, eager and compiled give the same logits, so which one runs
is a pure cost choice, made per bucket size from the wall seconds of that bucket's forwards.

This module is at the bottom of the package: it imports nothing from hf_spec, and the loop
(:mod:`hf_spec.decoding`) and the static layout (:mod:`hf_spec.static_cache`) feed it numbers, so it is tested
on a fake clock.
"""

from __future__ import annotations

import math
import statistics
import weakref
from dataclasses import dataclass, field

__all__ = ["ENGINES", "EngineChooser", "SpeedController", "controller_for"]


@dataclass
class _Estimate:
    """Discounted sums of one arm's measured cycles."""

    seconds: float = 0.0
    tokens: float = 0.0
    weight: float = 0.0  # discounted count of cycles
    rows: float = 0.0  # discounted count of row-cycles (a cycle of a batch of b rows counts b)
    cycles: int = 0  # measured cycles ever (not discounted)

    def add(self, seconds: float, tokens: float, rows: float) -> None:
        """One measured cycle."""
        self.seconds += seconds
        self.tokens += tokens
        self.weight += 1.0
        self.rows += rows
        self.cycles += 1

    def decay(self, factor: float) -> None:
        self.seconds *= factor
        self.tokens *= factor
        self.weight *= factor
        self.rows *= factor

    @property
    def seconds_per_cycle(self) -> float | None:
        return self.seconds / self.weight if self.weight >= 1.0 else None

    @property
    def seconds_per_token(self) -> float | None:
        return self.seconds / self.tokens if self.tokens > 0 else None

    @property
    def tokens_per_row(self) -> float | None:
        """Tokens one row commits per cycle (a plain step: exactly 1)."""
        return self.tokens / self.rows if self.rows > 0 else None


@dataclass
class SpeedController:
    """Chooses the arm of each cycle on a ladder of ``len(labels)`` arms (arm 0: plain, no draft).

    The loop calls :meth:`start_call` once per ``generate()`` call, :meth:`choose` before each cycle and
    :meth:`record` after it with the cycle's wall seconds and committed tokens (all rows). ``start``: the arm
    to exploit first (the prior, e.g. the drafter's configured shape). See the module docstring for the policy.
    """

    labels: list[str]
    start: int = 1
    positions: list[tuple[int, ...] | None] | None = None
    """Per arm, its coordinates (e.g. tree rank, n-gram rank; None for plain), or None: neighbours on the ladder
    only. With them, an arm's neighbours are also, per coordinate and direction, the nearest arm equal to it in
    every other coordinate (see the module docstring)."""
    half_life: float = 48.0
    """Cycles (of the whole run, any arm) after which a measurement weighs half."""
    probe_tokens: int = 6
    """A probe lasts until it has committed this many tokens…"""
    max_probe_cycles: int = 6
    """…or this many measured cycles."""
    first_interval: int = 8
    """Exploited cycles before the first probe of a neighbour (and again after a move)."""
    max_interval: int = 512
    """Longest wait between probes of one neighbour."""
    exploration_budget: float = 0.01
    """Fraction of the time failed probes may cost: the wait after a failed probe is its cost over this budget."""
    catch_up: float = 0.02
    """A neighbour is probed at once when the exploited arm's time per token has come within this fraction of what
    that neighbour measured at its last failed probe, having grown by this fraction since (the machine or the
    text changed; a new prompt moves every drafted arm's time per token, plain's hardly). Not while the gap is
    what that probe found: a neighbour that failed narrowly would be probed without end."""
    easier: float | None = 0.2
    """A costlier drafted neighbour (a later rung) whose last probe failed is probed at once when the exploited
    drafted arm's time per token has fallen by this fraction since that probe (None: never): the text became easier
    to draft (an answer moved from prose to code, a new prompt), and bigger trees gain most where drafts are
    accepted, so a probe that failed on the hard text says little of the easy one. Its wait, budgeted on the hard
    text, could keep a code answer on the smallest tree for hundreds of cycles."""
    recent_half_life: float = 16.0
    """Cycles after which a measurement weighs half in the estimate the :attr:`easier` test reads (a text's change
    shows within tens of cycles, not the ``half_life``'s hundred)."""
    give_up: float = 0.5
    """A probe ends after two measured cycles when the neighbour is already this much slower per token."""
    outlier: float = 3.0
    """A cycle counts at most this many times the arm's mean cycle time (or, for an arm without one, the slowest
    arm's): one stall (another process, a pause, a first-time kernel build) must not condemn an arm for hundreds of
    cycles."""
    margin: float = 0.02
    """A neighbour must measure this much faster per token to be moved to (noise guard). Between plain and a drafted
    arm whose cycles commit less than this fraction more tokens per row than plain's one, the token counts decide
    and plain is chosen, whatever the times read: a drafted cycle costs at least a plain step (a verification of
    more tokens, and drafting), so such an arm cannot be faster by the margin, and a noisy machine's timings (slow
    spells lasting seconds) would otherwise keep a drafter that accepts nothing running for a third of its cycles or
    more."""
    significance: float = 0.5
    """…and, between two drafted arms, its probes' cycles must put it faster by the margin plus this many standard
    errors of theirs: each cycle counts its time in units of the exploited arm's time per token, minus the tokens it
    committed; the mean of that, plus this many standard errors, must be below minus the margin's share of a cycle's
    tokens (a one-sided test of the gain). Moves between plain and a drafted arm take the margin alone: those arms
    differ by much more than the noise when drafting pays, and a drafter that stops paying must be left within tens
    of cycles."""
    evidence_cycles: int = 24
    """Measured probe cycles of a neighbour that the test weighs (the latest; all are dropped at a move, when the
    exploited arm they were measured against changes)."""
    new_call_probe: float | None = 0.1
    """While plain is exploited, a new call probes the drafted neighbour in its second cycle when any drafted arm's
    cycles committed at least this fraction more tokens per row than plain's one (the drafter's drafts are accepted
    at all; None: never early). Plain's time per token does not depend on the text, so nothing plain measures says
    that a new prompt (code after prose) now favours drafting: a drafter that did not pay on a prose answer must not
    keep the next answer on plain for hundreds of cycles. A drafter whose drafts are not accepted (an untrained one)
    is not re-probed per call once its drafted cycles number :attr:`new_call_evidence`: its probes wait what they
    cost over the exploration budget, so the worst case stays bounded."""
    new_call_evidence: int = 32
    """Measured drafted cycles (all drafted arms, ever) before the drafter's drafts may count as not accepted (see
    :attr:`new_call_probe`): a cold process whose first answer is prose may draft a few cycles that accept nothing,
    and those must not keep every later call, code included, on plain steps. An untrained drafter reaches this count
    within a few calls, once per process."""
    momentum: int = 2
    """After a move that gained at least ``momentum_gain``, the next rung the same way is probed after this many
    cycles (not ``first_interval``): a rung that won clearly points the way, so a climb from plain to the rung a
    text needs takes tens of cycles, not a call. A narrow win (near the best rung, or noise) does not hurry on."""
    momentum_gain: float = 0.1
    """The gain per token (fraction) that makes a move hurry on to the next rung."""
    current: int = field(init=False)
    cycle: int = field(init=False, default=0)
    moves: int = field(init=False, default=0)
    probes: int = field(init=False, default=0)

    def __post_init__(self):
        if not self.labels:
            raise ValueError("A speed controller needs at least one arm.")
        if not 0 <= self.start < len(self.labels):
            raise ValueError(f"start={self.start} is not an arm of {len(self.labels)}.")
        self.current = self.start
        self._adjacent = _adjacency(len(self.labels), self.positions)
        self._estimates = [_Estimate() for _ in self.labels]
        self._recent = [_Estimate() for _ in self.labels]
        """Per arm, its copy-free cycles discounted over :attr:`recent_half_life` cycles (the :attr:`easier` test)."""
        self._copy_free = [_Estimate() for _ in self.labels]
        """Per arm, its cycles that were not copy cycles: what comparisons between two drafted arms weigh."""
        self._interval = [self.first_interval] * len(self.labels)
        self._due = [self.first_interval] * len(self.labels)
        self._theirs: list[tuple[float, float, float] | None] = [None] * len(self.labels)
        """Per neighbour, at its last failed probe: (its seconds per token, the exploited arm's, and the exploited
        arm's over its recent cycles)."""
        self._probe: int | None = None
        self._probe_cycles = 0
        self._probe_tokens = 0.0
        self._probe_cost = [0.0, 0.0]  # wall seconds and tokens of every cycle of the probe, switch cycle included
        self._evidence: list[list[tuple[float, float]]] = [[] for _ in self.labels]
        """Per drafted neighbour of a drafted exploited arm, its probe cycles since the last move: (seconds over the
        exploited arm's seconds per token, tokens committed)."""
        self._last: int | None = None  # arm of the last cycle (None: none yet in this call)
        self._decay = 0.5 ** (1.0 / self.half_life)
        self._recent_decay = 0.5 ** (1.0 / self.recent_half_life)

    # -- the loop's side ---------------------------------------------------------------------------
    def start_call(self) -> None:
        """A new ``generate()`` call: its first cycle is not measured (the drafter reads the prompt). When plain is
        exploited, the drafted neighbour is probed early in the call (see :attr:`new_call_probe`)."""
        self._last = None
        if self.current == 0 and self.new_call_probe is not None and self._drafts_accepted():
            for n in self._neighbours():
                if self._due[n] > self.cycle + 2:  # the call's first cycle is not measured
                    self._due[n], self._theirs[n] = self.cycle + 2, None

    def choose(self) -> int:
        """The arm of the next cycle."""
        if self._probe is None and len(self.labels) > 1:
            neighbours = self._neighbours()
            lately = self._recent[self.current].seconds_per_token if self.easier is not None else None
            for n in neighbours:
                failed, ours = self._theirs[n], self._seconds_per_token(self.current, n)
                if ours is None or failed is None:
                    continue
                caught_up = ours > max(failed[0] * (1.0 - self.catch_up), failed[1] * (1.0 + self.catch_up))
                easier = lately is not None and 0 < self.current < n and lately < failed[2] * (1.0 - self.easier)
                if caught_up or easier:
                    self._due[n], self._theirs[n] = self.cycle, None
                if easier:  # the probes' evidence from the harder text is stale
                    self._evidence[n].clear()
            due = [n for n in neighbours if self.cycle >= self._due[n]]
            if due and self._estimates[self.current].seconds_per_token is not None:
                self._probe = min(due, key=lambda n: self._due[n])
                self._probe_cycles, self._probe_tokens, self._probe_cost = 0, 0.0, [0.0, 0.0]
                self.probes += 1
        return self._probe if self._probe is not None else self.current

    def record(self, arm: int, seconds: float, tokens: int, rows: int = 1, copied: bool = False,
               typical: bool = True) -> None:  # fmt: skip
        """One finished cycle of ``arm``: its wall ``seconds``, the tokens it committed (every row), the rows it
        ran (a plain cycle commits one token per row), whether it was a copy cycle (see the module docstring) and
        whether its time is typical of the arm (False, e.g. it packed a weight: not measured, as a switch's first
        cycle is not)."""
        measured = self._last == arm and typical
        self._last = arm
        self.cycle += 1
        for estimate in (*self._estimates, *self._copy_free):
            estimate.decay(self._decay)
        for estimate in self._recent:
            estimate.decay(self._recent_decay)
        if measured and tokens > 0:
            typical = self._estimates[arm].seconds_per_cycle
            if typical is None:
                typical = max((e.seconds_per_cycle for e in self._estimates if e.seconds_per_cycle), default=None)
            if typical is not None:
                seconds = min(seconds, self.outlier * typical)
            self._estimates[arm].add(seconds, tokens, rows)
            if not copied:
                self._copy_free[arm].add(seconds, tokens, rows)
                self._recent[arm].add(seconds, tokens, rows)
        if self._probe is not None and arm == self._probe:
            self._probe_cost[0] += seconds
            self._probe_cost[1] += tokens
            if measured:
                self._probe_cycles += 1
                self._probe_tokens += tokens
                ours = self._seconds_per_token(self.current, arm)
                if ours and arm != 0 and self.current != 0 and not copied:  # moves between drafted arms weigh it
                    evidence = self._evidence[arm]
                    evidence.append((seconds / ours, float(tokens)))
                    del evidence[: -self.evidence_cycles]
            enough = (self._probe_tokens >= self.probe_tokens or self._probe_cycles >= self.max_probe_cycles
                      or self._hopeless(arm))  # fmt: skip
            if self._probe_cycles >= 2 and enough:
                self._end_probe()

    # -- policy ------------------------------------------------------------------------------------
    def _neighbours(self) -> list[int]:
        """The rungs next to the exploited one (and those one step away in one coordinate, with positions), plain
        (arm 0), which bounds the worst case, from anywhere, and from a drafted arm the :meth:`_far` arm."""
        near = self._adjacent[self.current]
        far = self._far()
        return near if far is None else near + [far]

    def _far(self) -> int | None:
        """The drafted arm, not next to the exploited drafted one, whose copy-free cycles measured fastest, when
        faster than the exploited arm's by the margin: a climb can end on an arm whose neighbours are all slower
        while an arm two steps away is faster (a lucky spell moved it past them); its probes wait what they cost,
        as a neighbour's do."""
        if self.current == 0:
            return None
        ours = self._copy_free[self.current].seconds_per_token
        near = self._adjacent[self.current]
        measured = [(e.seconds_per_token, arm) for arm, e in enumerate(self._copy_free)
                    if arm and arm != self.current and arm not in near and e.seconds_per_token is not None]  # fmt: skip
        if ours is None or not measured:
            return None
        theirs, arm = min(measured)
        return arm if theirs < ours * (1.0 - self.margin) else None

    def _seconds_per_token(self, arm: int, other: int) -> float | None:
        """``arm``'s measured seconds per token as weighed against ``other``: between two drafted arms, from the
        cycles that were not copy cycles (see the module docstring)."""
        estimates = self._copy_free if arm != 0 and other != 0 else self._estimates
        return estimates[arm].seconds_per_token

    def _accepts(self, arm: int, fraction: float) -> bool:
        """Whether ``arm``'s measured cycles commit ``fraction`` more tokens per row than a plain step's one (True when
        it has not been measured). Token counts fade as slowly as times, so this remembers a drafter's last texts."""
        per_row = self._estimates[arm].tokens_per_row
        return per_row is None or per_row >= 1.0 + fraction

    def _drafts_accepted(self) -> bool:
        """Whether any drafted arm's measured cycles commit :attr:`new_call_probe` more tokens per row than plain's
        one (True while the drafted arms have measured fewer than :attr:`new_call_evidence` cycles): whether the
        drafter's drafts are accepted at all. Any arm: the cheapest, plain's neighbour, drafts one token and may have
        run three cycles of a prose answer."""
        measured = [arm for arm in range(1, len(self.labels)) if self._estimates[arm].tokens_per_row is not None]
        if sum(self._estimates[arm].cycles for arm in measured) < self.new_call_evidence:
            return True  # too few drafted cycles to say their drafts are not accepted
        return any(self._accepts(arm, self.new_call_probe) for arm in measured)

    def _hopeless(self, probe: int) -> bool:
        theirs = self._seconds_per_token(probe, self.current)
        ours = self._seconds_per_token(self.current, probe)
        return theirs is not None and ours is not None and theirs > ours * (1.0 + self.give_up)

    def _end_probe(self) -> None:
        probe, self._probe = self._probe, None
        theirs = self._seconds_per_token(probe, self.current)
        ours = self._seconds_per_token(self.current, probe)
        faster = theirs is not None and (ours is None or theirs < ours * (1.0 - self.margin))
        if probe == 0 and theirs is not None and not self._accepts(self.current, self.margin):
            faster = True  # drafting that commits hardly more than plain steps cannot beat them: timing noise said so
        elif self.current == 0 and not self._accepts(probe, self.margin):
            faster = False
        unmeasured = ours is None and (probe == 0 or self.current == 0)  # nothing to weigh the probe against
        if faster and (unmeasured or self._clearly_faster(probe)):
            left, self.current = self.current, probe
            self.moves += 1
            for evidence in self._evidence:
                evidence.clear()
            steep = ours is None or theirs < ours * (1.0 - self.momentum_gain)
            for n in self._neighbours():  # look further the same way soon; back where it came from later
                onward = steep and n != 0 and (n > self.current) == (self.current > left)
                self._interval[n] = self.momentum if onward else self.first_interval * (2 if n == left else 1)
                self._due[n], self._theirs[n] = self.cycle + self._interval[n], None
        else:
            self._interval[probe] = self._budgeted_wait(ours)
            self._due[probe] = self.cycle + self._interval[probe]
            lately = self._recent[self.current].seconds_per_token or ours
            self._theirs[probe] = (theirs, ours, lately) if theirs is not None and ours is not None else None

    def _clearly_faster(self, probe: int) -> bool:
        """Whether ``probe``'s cycles since the last move put it faster per token than the exploited arm by
        :attr:`margin`, beyond :attr:`significance` standard errors (see there)."""
        if probe == 0 or self.current == 0:
            return True  # plain against drafting: the margin alone
        evidence = self._evidence[probe]
        if len(evidence) < 2:
            return False
        excess = [time - tokens for time, tokens in evidence]  # time in the exploited arm's tokens, minus tokens
        mean_tokens = sum(tokens for _, tokens in evidence) / len(evidence)
        bound = statistics.fmean(excess) + self.significance * statistics.stdev(excess) / math.sqrt(len(excess))
        return bound < -self.margin * mean_tokens

    def _budgeted_wait(self, ours: float | None) -> int:
        """Cycles until the next probe of a neighbour whose probe just failed: what the probe cost (its wall time
        minus what the exploited arm would have taken for the same tokens) over the exploration budget."""
        per_cycle = self._estimates[self.current].seconds_per_cycle
        if ours is None or not per_cycle:
            return self.max_interval
        seconds, tokens = self._probe_cost
        lost = max(0.0, seconds - tokens * ours)
        wait = lost / (self.exploration_budget * per_cycle)
        return int(min(self.max_interval, max(self.first_interval, wait)))

    # -- what it did -------------------------------------------------------------------------------
    def ms_per_token(self) -> dict[str, float | None]:
        """Current estimate per arm (milliseconds per committed token; None: not measured lately)."""
        out = {}
        for label, estimate in zip(self.labels, self._estimates):
            value = estimate.seconds_per_token
            out[label] = None if value is None else round(1000.0 * value, 3)
        return out

    def summary(self) -> dict:
        """The controller's state as plain data (what ``last_generation_stats.controller`` reports)."""
        return {"arms": list(self.labels), "current": self.labels[self.current], "cycles": self.cycle,
                "probes": self.probes, "moves": self.moves, "ms_per_token": self.ms_per_token()}  # fmt: skip


def _adjacency(arms: int, positions: list[tuple[int, ...] | None] | None) -> list[list[int]]:
    """Per arm, its neighbours: plain (arm 0), the rungs before and after it, and, with ``positions``, per
    coordinate and direction the nearest arm equal to it in every other coordinate."""
    if positions is not None:
        if len(positions) != arms or positions[0] is not None:
            raise ValueError(f"positions must give one entry per arm ({arms}), None for plain (arm 0); got {positions!r}.")
        if any(p is None for p in positions[1:]) or len({len(p) for p in positions[1:]}) > 1:
            raise ValueError(f"positions of the drafted arms must be tuples of one length; got {positions!r}.")
    adjacent = []
    for arm in range(arms):
        near = {n for n in (0, arm - 1, arm + 1) if 0 <= n < arms}
        mine = positions[arm] if positions is not None else None
        for axis in range(len(mine) if mine is not None else 0):
            line = [n for n in range(1, arms)  # the arms that differ from this one in `axis` at most
                    if all(theirs == own for k, (theirs, own) in enumerate(zip(positions[n], mine)) if k != axis)]
            below = [n for n in line if positions[n][axis] < mine[axis]]
            above = [n for n in line if positions[n][axis] > mine[axis]]
            if below:
                near.add(max(below, key=lambda n: positions[n][axis]))
            if above:
                near.add(min(above, key=lambda n: positions[n][axis]))
        adjacent.append(sorted(near - {arm}))
    return adjacent


_CONTROLLERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def controller_for(owner, key: tuple, labels: list[str], start: int,
                   positions: list[tuple[int, ...] | None] | None = None) -> SpeedController:  # fmt: skip
    """The process's controller for ``owner`` (the drafter; weakly held) and ``key`` (what its costs depend on:
    target, device, dtype, threads, batch size class, sampling), created on first use; a new one when the arms
    differ (the drafter's candidates changed)."""
    mine = _CONTROLLERS.setdefault(owner, {})
    controller = mine.get(key)
    if controller is None or controller.labels != list(labels) or controller.positions != positions:
        controller = mine[key] = SpeedController(list(labels), start=start, positions=positions)
    return controller


# -- eager or compiled verification forwards -------------------------------------------------------------------
ENGINES = ("eager", "compiled")
"""The two ways a static layout with a compiled call runs a verification forward (:class:`EngineChooser`)."""


@dataclass
class _Bucket:
    """What an :class:`EngineChooser` knows of one bucket size."""

    current: str
    calls: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ENGINES, 0))
    times: dict[str, list[float]] = field(default_factory=lambda: {engine: [] for engine in ENGINES})
    """Each engine's last timed forwards (seconds, at most ``samples``)."""
    fresh: dict[str, int] | None = field(default_factory=lambda: dict.fromkeys(ENGINES, 0))
    """Timed forwards per engine in the check under way (None: no check under way; a bucket starts with one)."""
    checks: int = 1
    wait: int = 0
    """Forwards from the end of the last check to the next (0: no check has ended)."""
    due: int = 0
    """The bucket's forward count at which the next check starts."""
    last: str | None = None
    """The engine of the bucket's last forward (a check alternates)."""

    @property
    def total(self) -> int:
        return sum(self.calls.values())


@dataclass
class EngineChooser:
    """Chooses, per bucket size, whether a static layout's verification forward runs eagerly or compiled (one of
    :data:`ENGINES`), from the measured wall seconds of that bucket's forwards.

    The layout calls :meth:`choose` before each forward (the engine, and whether to time it) and :meth:`record`
    after it. Policy, per bucket:

    - a bucket starts with a *check*: the engines alternate (``prior`` first) until each has run ``samples`` timed
      forwards; each engine's first ``warmup`` forwards in the bucket are never timed (compilation, CUDA-graph
      capture and first-run work take seconds and must not condemn the compiled engine);
    - an engine's cost is the median of its last ``samples`` timed forwards (one stall does not decide); after a
      check the other engine is exploited when it measured faster by more than ``margin``;
    - the engine not in use is checked again (with the one in use, alternating) after a wait that doubles while it
      keeps losing and is at least what its timed forwards lost over ``exploration_budget`` (from ``first_wait``
      to ``max_wait`` forwards of the bucket): exploration stays bounded, and a change of costs (another load on
      the machine) is found within ``max_wait`` forwards.

    Forwards outside checks are not timed, so on CUDA they add no host sync.
    """

    prior: str = "compiled"
    """The engine exploited until a check says otherwise (transformers' rule said compile)."""
    warmup: int = 3
    """Forwards of each engine per bucket that are never timed."""
    samples: int = 3
    """Timed forwards of each engine per check."""
    margin: float = 0.03
    """The other engine must measure this much faster (fraction) to be switched to (noise guard)."""
    first_wait: int = 32
    """Shortest wait between checks of a bucket (forwards), and the wait after a check that switched engines."""
    max_wait: int = 512
    """Longest wait between checks of a bucket."""
    exploration_budget: float = 0.02
    """A check whose losing engine cost L seconds more than the engine in use waits at least L / (this x the engine
    in use's seconds per forward) forwards."""

    def __post_init__(self):
        if self.prior not in ENGINES:
            raise ValueError(f"prior={self.prior!r} is not one of {ENGINES}.")
        self._buckets: dict[int, _Bucket] = {}

    def choose(self, size: int) -> tuple[str, bool]:
        """The engine of the next forward of bucket ``size``, and whether to time it."""
        bucket = self._buckets.get(size)
        if bucket is None:
            bucket = self._buckets[size] = _Bucket(current=self.prior)
        if bucket.fresh is None:
            return bucket.current, False
        pending = [e for e in (bucket.current, self._other(bucket)) if bucket.fresh[e] < self.samples]
        engine = next((e for e in pending if e != bucket.last), pending[0])
        return engine, bucket.calls[engine] >= self.warmup

    def record(self, size: int, engine: str, seconds: float | None) -> None:
        """One forward of bucket ``size`` ran on ``engine``; ``seconds``: its wall time when :meth:`choose` asked to
        time it, else None."""
        bucket = self._buckets[size]
        bucket.calls[engine] += 1
        bucket.last = engine
        if bucket.fresh is not None and seconds is not None:
            bucket.times[engine] = (bucket.times[engine] + [seconds])[-self.samples :]
            bucket.fresh[engine] += 1
            if min(bucket.fresh.values()) >= self.samples:
                self._end_check(bucket)
        elif bucket.fresh is None and bucket.total >= bucket.due:
            bucket.fresh = dict.fromkeys(ENGINES, 0)
            bucket.checks += 1

    def _end_check(self, bucket: _Bucket) -> None:
        bucket.fresh = None
        other = self._other(bucket)
        ours, theirs = statistics.median(bucket.times[bucket.current]), statistics.median(bucket.times[other])
        if theirs < ours * (1.0 - self.margin):
            bucket.current, bucket.wait = other, self.first_wait
        else:
            lost = self.samples * (theirs - ours)
            budgeted = lost / (self.exploration_budget * ours) if ours > 0 else self.max_wait
            bucket.wait = int(min(self.max_wait, max(self.first_wait, 2 * bucket.wait, budgeted)))
        bucket.due = bucket.total + bucket.wait

    @staticmethod
    def _other(bucket: _Bucket) -> str:
        return ENGINES[1 - ENGINES.index(bucket.current)]

    def summary(self) -> dict:
        """Per bucket size: ``engine`` (in use), ``ms_per_forward`` per engine (median of its last timed forwards;
        None: not timed yet), ``calls`` per engine and ``checks`` (the first included)."""
        return {size: {"engine": bucket.current,
                       "ms_per_forward": {e: round(1000.0 * statistics.median(t), 3) if t else None
                                          for e, t in bucket.times.items()},
                       "calls": dict(bucket.calls), "checks": bucket.checks}
                for size, bucket in sorted(self._buckets.items())}  # fmt: skip
