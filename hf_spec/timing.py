"""Device-correct wall-clock reads for the decoding loop and the drafters.

CUDA kernels run asynchronously: ``time.perf_counter()`` right after a forward measures the
launch, not the work, and the next timer absorbs it, so the draft / verify split would be wrong.
:func:`clock` waits for ``device``'s queue first when the tensors live on CUDA, and adds
nothing on a CPU.
"""

from __future__ import annotations

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
