"""Choosing between equal computations by timing them in place: what the few-row linear layers
(:mod:`hf_spec.linear_kernels`) and the few-query attention (:mod:`hf_spec.attention_kernels`) share.

Calls of one kind (a weight shape and row count; a query count and cache length) take turns with the kernels, each
timed on its real input where decoding leaves the data; once each kernel has its share of calls, the medians past
each one's first call decide, and another kernel than the default wins only by a margin (a close call keeps the
default). A choice is kept until it is :data:`RECHECK_SECONDS` old; the next block then measures it again
(:func:`expired`): a machine's speed and load drift, and a trial can meet a slow spell (another process on one of two
cores slows a kernel that uses both more than one that uses one), so no choice is final. This module is at the
bottom of the house: it imports nothing of hf_spec.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable

__all__ = ["RECHECK_SECONDS", "ForcedKernel", "decision", "expired", "timed_turn"]

RECHECK_SECONDS = 120.0
"""Age at which a choice goes on trial again, when the next block starts."""


def timed_turn(samples: dict[str, list[float]], kernels: tuple[str, ...], run: Callable[[str], object]):
    """Run the kernel of ``kernels`` with fewest timed calls in ``samples`` (``run(kernel)``), add its seconds to
    ``samples`` and return its output."""
    kernel = min(kernels, key=lambda k: len(samples.get(k, ())))
    start = time.perf_counter()
    out = run(kernel)
    samples.setdefault(kernel, []).append(time.perf_counter() - start)
    return out


def decision(samples: dict[str, list[float]], kernels: tuple[str, ...], share: int, default: str,
             min_gain: float) -> str | None:  # fmt: skip
    """None while a kernel of ``kernels`` has fewer than ``share`` timed calls; then the kernel with the least median
    past its first call (any kernel in ``samples`` with its share), when at least ``min_gain`` faster than
    ``default``'s, else ``default``."""
    if any(len(samples.get(k, ())) < share for k in kernels):
        return None
    medians = {k: statistics.median(t[1:]) for k, t in samples.items() if len(t) >= share}
    best = min(medians, key=medians.get)
    return best if medians[best] < (1.0 - min_gain) * medians[default] else default


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
