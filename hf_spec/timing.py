"""Device-correct timing for the decoding loop and the drafters.

CUDA kernels run asynchronously: ``time.perf_counter()`` right after a forward measures the
launch, not the work, and the next timer absorbs it, so the draft / verify split would be wrong.
:func:`clock` waits for ``device``'s queue first when the tensors live on CUDA (for a decision that
needs the time now), and adds nothing on a CPU. :class:`Stopwatch` totals timed regions for
statistics without waiting: on CUDA it records events and reads them once, at the end.
"""

from __future__ import annotations

import contextlib
import time

import torch


def clock(device=None) -> float:
    """``time.perf_counter()`` after ``torch.cuda.synchronize(device)`` when ``device`` is a CUDA device."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def timed(fn, device=None):
    """``(fn(), milliseconds it took)``, read with :func:`clock` (so a CUDA device's queue is waited for)."""
    start = clock(device)
    out = fn()
    return out, 1000.0 * (clock(device) - start)


class Stopwatch:
    """The total time of the regions timed with it (``with watch(): ...``), read as :attr:`seconds`.

    On a CUDA device each region is a pair of CUDA events on the current stream: no host sync per region (a sync
    would make the host wait for every forward instead of queueing the next), one when :attr:`seconds` is read.
    An event pair measures the device's time from the region's first queued work to its last, which is the
    region's wall time when the host launches slower than the device runs (an eager forward) and its device time
    when the device is the bottleneck. Elsewhere regions are timed with ``time.perf_counter()``."""

    def __init__(self, device=None):
        self.cuda = device is not None and torch.device(device).type == "cuda"
        self._seconds = 0.0
        self._pending: list = []

    def start(self):
        """Open a region; returns what :meth:`stop` takes (an event on CUDA, a perf_counter reading elsewhere)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, started) -> None:
        """Close the region :meth:`start` opened."""
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((started, end))
        else:
            self._seconds += time.perf_counter() - started

    @contextlib.contextmanager
    def __call__(self):
        started = self.start()
        try:
            yield
        finally:
            self.stop(started)

    @property
    def seconds(self) -> float:
        """Total seconds so far (on CUDA: waits for the last timed region to finish, once)."""
        if self._pending:
            self._pending[-1][1].synchronize()
            self._seconds += sum(start.elapsed_time(end) for start, end in self._pending) / 1000.0
            self._pending.clear()
        return self._seconds
