"""Choosing between equal computations by timing them in place: what the few-row linear layers
(:mod:`hf_spec.linear_kernels`) and the few-query attention (:mod:`hf_spec.attention_kernels`) share.

Calls of one kind (a weight shape and row count; a query count and cache length) take turns with the kernels, each
timed on its real input where decoding leaves the data; once each kernel still running has its share of calls, the
trial's medians past each one's first call are added to that kind's :class:`KernelEvidence`, and the evidence
decides: the kernel with the least discounted mean of log time against the default's, when it is at least a margin
faster (a close call keeps the default). A kernel whose first calls measure far behind another's stops taking turns
in that trial (:data:`EARLY_CALLS`), and a trial left with one kernel ends there: a kind on trial runs the slow
kernels in some of its calls, and a large weight called once per forward (an LM head) stays on trial for many
forwards. A choice is kept until it is :data:`RECHECK_SECONDS` old; the next block then runs another trial
(:func:`expired`): a machine's speed and load drift, so no choice is final; but each trial adds to the evidence
rather than deciding alone, and a kernel far behind sits out a doubling number of trials (:data:`FAR_BEHIND`). Why:
one trial of eight calls per kernel met a slow spell often enough (another process on one of two cores slows a
kernel that uses both more than one that uses one) that two processes on one machine ended a 25-minute benchmark
with different choices for eleven shapes, so their verification costs, and the trees sized by them, differed. This
module is at the bottom of the house: it imports nothing of hf_spec.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from typing import Callable

__all__ = ["DISCOUNT", "EARLY_CALLS", "FAR_BEHIND", "RECHECK_SECONDS", "ForcedKernel", "KernelEvidence", "decision",
           "expired", "running", "timed_turn", "trial_samples"]

RECHECK_SECONDS = 120.0
"""Age at which a choice goes on trial again, when the next block starts."""
DISCOUNT = 0.75
"""Weight of the evidence so far when a new trial is added (the last four or so trials decide)."""
FAR_BEHIND = 1.5
"""A kernel the evidence puts at this many times the default's time sits out the next trial, then twice as many
after each later trial that still finds it this far behind (the losers' calls are a trial's cost: on a 2-core
Xeon with AMX in float32 a weight packed for oneDNN ran a layer 6x slower than ``F.linear``, and every recheck ran it
again)."""
EARLY_CALLS = 3
"""Within a trial, a kernel whose calls past its first (at least this many) have a median of :data:`FAR_BEHIND` times
the least median of another kernel with as many calls or more stops taking turns (:func:`running`); its calls so far
still join the evidence. A trial left with one kernel ends there. Why: in float32 on a 2-core AMD EPYC (Zen 1)
SmolLM2-135M's 49,152-row head took 22.9 ms through ``F.linear`` over 4 rows, 18.4 packed and 8.5 transposed, so a
verification of 4 tokens on trial ran its head at twice the chosen kernel's cost; the head is called once per
forward, and the sizes that cost most on trial are the ones the loop then chose least, so they stayed on trial."""


class KernelEvidence:
    """What the trials of one kind of call found: per kernel, the discounted sum of log(median / the default's
    median) and its weight (each trial weighs 1; older ones :data:`DISCOUNT` times less per later trial)."""

    def __init__(self):
        self.sums: dict[str, list[float]] = {}  # kernel -> [discounted sum of log ratios, discounted weight]
        self.trials = 0
        self.sitting_out: dict[str, list[int]] = {}  # kernel far behind -> [trials left to sit out, the last wait]

    def start_trial(self, kernels: tuple[str, ...]) -> tuple[str, ...]:
        """The kernels of ``kernels`` that run in the trial starting now: those not sitting out (each that does has
        one trial less to wait)."""
        running = []
        for kernel in kernels:
            wait = self.sitting_out.get(kernel)
            if wait is not None and wait[0] > 0:
                wait[0] -= 1
            else:
                running.append(kernel)
        return tuple(running)

    def add(self, medians: dict[str, float], default: str) -> None:
        """One trial's median seconds per kernel (``default`` among them)."""
        for sums in self.sums.values():
            sums[0] *= DISCOUNT
            sums[1] *= DISCOUNT
        base = max(medians[default], 1e-12)
        for kernel, median in medians.items():
            sums = self.sums.setdefault(kernel, [0.0, 0.0])
            sums[0] += math.log(max(median, 1e-12) / base)
            sums[1] += 1.0
        self.trials += 1
        for kernel in medians:
            if kernel != default and self.ratio(kernel) >= FAR_BEHIND:
                last = self.sitting_out.get(kernel, [0, 0])[1]
                self.sitting_out[kernel] = [max(1, 2 * last)] * 2
            else:
                self.sitting_out.pop(kernel, None)

    def ratio(self, kernel: str) -> float:
        """The kernel's time over the default's, as the evidence so far has it (1.0: no evidence)."""
        total, weight = self.sums.get(kernel, (0.0, 0.0))
        return math.exp(total / weight) if weight else 1.0

    def choice(self, kernels: tuple[str, ...], default: str, min_gain: float) -> str:
        """The kernel of ``kernels`` with the least :meth:`ratio`, when it is at least ``min_gain`` faster than
        ``default``; else ``default``."""
        best = min(kernels, key=self.ratio)
        return best if self.ratio(best) < 1.0 - min_gain else default


def trial_samples(trials: dict, evidences: dict, key, kernels: tuple[str, ...],
                  default: str) -> dict[str, list[float]] | None:  # fmt: skip
    """The samples of ``key``'s trial under way in ``trials``, or of a new one of the ``kernels`` not sitting out
    (:meth:`KernelEvidence.start_trial` of ``evidences[key]``, made on first use); None when only ``default`` would
    run: it is then the choice, with no trial."""
    samples = trials.get(key)
    if samples is None:
        running = evidences.setdefault(key, KernelEvidence()).start_trial(kernels)
        if running == (default,):
            return None
        samples = trials[key] = {kernel: [] for kernel in running}
    return samples


def running(samples: dict[str, list[float]], kernels: tuple[str, ...]) -> tuple[str, ...]:
    """The kernels of ``kernels`` still taking turns in the trial of ``samples``: all but those far behind after
    their early calls (:data:`EARLY_CALLS`)."""
    early = {k: statistics.median(samples[k][1:]) for k in kernels if len(samples.get(k, ())) > EARLY_CALLS}
    return tuple(k for k in kernels if k not in early or not any(
        early[k] >= FAR_BEHIND * early[other] and len(samples[other]) >= len(samples[k])
        for other in early if other != k))  # fmt: skip


def timed_turn(samples: dict[str, list[float]], kernels: tuple[str, ...], run: Callable[[str], object]):
    """Run the kernel of ``kernels`` still :func:`running` with fewest timed calls in ``samples`` (``run(kernel)``),
    add its seconds to ``samples`` and return its output."""
    kernel = min(running(samples, kernels), key=lambda k: len(samples.get(k, ())))
    start = time.perf_counter()
    out = run(kernel)
    samples.setdefault(kernel, []).append(time.perf_counter() - start)
    return out


def decision(samples: dict[str, list[float]], kernels: tuple[str, ...], share: int, default: str, min_gain: float,
             evidence: KernelEvidence | None = None) -> str | None:  # fmt: skip
    """None while a kernel of ``kernels`` still :func:`running` has fewer than ``share`` timed calls (and more than
    one runs); then the trial's medians past each kernel's first call join ``evidence`` (a new :class:`KernelEvidence`
    if None), which chooses among ``kernels`` (:meth:`KernelEvidence.choice`)."""
    left = running(samples, kernels)
    if any(len(samples.get(k, ())) < (share if len(left) > 1 else EARLY_CALLS + 1) for k in left):
        return None
    evidence = KernelEvidence() if evidence is None else evidence
    evidence.add({k: statistics.median(samples[k][1:]) for k in kernels}, default)
    return evidence.choice(kernels, default, min_gain)


def expired(made: dict, now: float | None = None) -> list:
    """The keys of ``made`` (key -> the ``time.perf_counter()`` its choice was made) older than
    :data:`RECHECK_SECONDS`, removed from ``made``."""
    now = time.perf_counter() if now is None else now
    old = [key for key, at in made.items() if now - at > RECHECK_SECONDS]
    for key in old:
        del made[key]
    return old


class ForcedKernel:
    """The tests' switch: the kernel every call runs (:attr:`kernel`; None: the measured choice)."""

    def __init__(self, kernels: tuple[str, ...]):
        self.kernels = kernels
        self.kernel: str | None = None

    @contextlib.contextmanager
    def __call__(self, kernel: str):
        if kernel not in self.kernels:
            raise ValueError(f"kernel must be one of {self.kernels}, got {kernel!r}.")
        previous, self.kernel = self.kernel, kernel
        try:
            yield
        finally:
            self.kernel = previous
