"""Few-row linear layers on a CPU: of two equal computations, the one this machine runs faster, measured.

Decoding multiplies a few rows (one token; a draft tree's nodes) by every weight matrix of the target and the
drafter. PyTorch's ``F.linear(x, W)`` hands that to its BLAS, whose few-row kernels differ from machine to
machine: on a 2-core AMD EPYC (Zen 4, torch 2.13 with MKL, float32) the one-row product ran in a matrix-vector
kernel on one core; written ``W @ x.T`` (the row padded to two) it took 158 us instead of 312 through a 1536x576
weight and 5.0 ms instead of 10.3 through SmolLM2-135M's 49,152-row head, and a plain float32 step of SmolLM2-135M
went from 58 to 33 ms with the kernels chosen here (benchmarks/few_row_kernels). Products timed in isolation,
weights warm in a cache, can rank the kernels the other way; in bf16 on that EPYC ``F.linear`` won everywhere.

So nothing here is assumed: within :func:`few_row_linears`, the calls with each row count (up to
:data:`MAX_ROWS`) of each weight shape, after each layer's first :data:`WARMUP_CALLS`, alternate the two kernels,
timed in place on their real inputs, and from then on this process runs the faster one (the transposed product only
when it was at least :data:`MIN_GAIN` faster). Choices are per weight shape, dtype, thread count and row count: a
model's 30 layers of one shape settle one within a forward, its LM head (one call per forward) within
:data:`TRIAL_CALLS` forwards. Both kernels compute the same products in another summation order, as a tree
verification already does against a one-token step: greedy output stays that of plain ``generate()`` (the tests
run both kernels), and sampling is unaffected.

hf-spec's decoding and its verification-cost curve run inside it on a CPU; it is public because it speeds up a
plain ``generate()`` just as well (``with hf_spec.few_row_linears(model): model.generate(...)``).
"""

from __future__ import annotations

import contextlib
import statistics
import time

import torch
from torch import nn

__all__ = ["MAX_ROWS", "MIN_GAIN", "TRIAL_CALLS", "WARMUP_CALLS", "few_row_linears", "forced_kernel", "kernel_choices"]

MAX_ROWS = 16
"""Row counts above this always use ``F.linear`` (a matrix product of many rows has no slow few-row kernel)."""
MIN_GAIN = 0.10
"""The transposed product replaces ``F.linear`` only when measured at least this much faster (a close call keeps
the default kernel: the choice is one timing, and it is kept for the process)."""
WARMUP_CALLS = 2
"""Each layer's first calls with a row count run ``F.linear`` untimed: a process's first decoding steps run slower
for reasons of their own (memory touched for the first time), and there, on the EPYC above, the transposed product
measured up to twice its later cost and lost choices it wins from the third step on."""
TRIAL_CALLS = 24
"""Calls of one weight shape with one row count that run on trial (half of them with each kernel) before the
choice: a model's 30 layers of one shape settle it within one forward, its LM head within 24."""
_tables: dict[tuple, dict[int, bool]] = {}
"""(weight shape, dtype, threads) -> {rows: whether the transposed product is the faster}, for this process."""
_trials: dict[tuple, tuple[list[float], list[float]]] = {}
"""((weight shape, dtype, threads), rows) still being measured -> the seconds of their calls so far with
(``F.linear``, the transposed product)."""
_force: bool | None = None
"""Tests set this (through :func:`forced_kernel`) to run one kernel everywhere."""


def kernel_choices() -> dict[str, str]:
    """What this process chose so far: ``{"NxK dtype threads rows": "transposed" | "F.linear"}``."""
    return {f"{shape[0]}x{shape[1]} {str(dtype).removeprefix('torch.')} {threads} threads {rows} rows":
            ("transposed" if transposed else "F.linear")
            for (shape, dtype, threads), table in _tables.items() for rows, transposed in sorted(table.items())}  # fmt: skip


@contextlib.contextmanager
def forced_kernel(transposed: bool):
    """Run every few-row call with one kernel (for tests: both must give plain ``generate()``'s greedy text)."""
    global _force
    previous, _force = _force, transposed
    try:
        yield
    finally:
        _force = previous


def _transposed(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` of the (rows, K) input as ``W @ x.T`` (a single row padded with a zero row, so the BLAS takes
    its matrix-matrix kernel), returned as a contiguous (rows, N)."""
    rows = x2.shape[0]
    if rows == 1:
        x2 = torch.cat([x2, x2.new_zeros(1, x2.shape[1])])
    else:
        x2 = x2.contiguous()
    out = torch.mm(weight, x2.t())[:, :rows].t().contiguous()
    return out if bias is None else out.add_(bias)


def _trial(base: tuple, rows: int, table: dict, x2: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    """One measured call of a row count still on trial: the kernel with fewer samples runs, timed in place on the
    real input with the weight where decoding leaves it (running both on one call would find the weight warm in a
    cache for the second: a 576x576 weight then measured the other way round); once each kernel has
    :data:`TRIAL_CALLS` / 2 calls, the medians past each one's untimed first call decide and ``table`` keeps it."""
    default, transposed = _trials.setdefault((base, rows), ([], []))
    use_transposed = len(transposed) < len(default)
    start = time.perf_counter()
    out = _transposed(x2, weight, bias) if use_transposed else torch.nn.functional.linear(x2, weight, bias)
    (transposed if use_transposed else default).append(time.perf_counter() - start)
    if len(transposed) == TRIAL_CALLS // 2:
        table[rows] = statistics.median(transposed[1:]) < (1.0 - MIN_GAIN) * statistics.median(default[1:])
        del _trials[(base, rows)]
    return out


def _layer_forward(layer: nn.Linear, threads: int):
    """The ``forward`` that :func:`few_row_linears` gives ``layer``: few-row calls by the chosen kernel (or on trial);
    the common path is one dict lookup on top of ``F.linear`` (the 30 layers of a model share a table)."""
    weight, bias = layer.weight, layer.bias
    base = (tuple(weight.shape), weight.dtype, threads)
    table = _tables.setdefault(base, {})
    linear = torch.nn.functional.linear

    seen: dict[int, int] = {}  # row count -> this layer's calls with it so far, while no choice exists

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        transposed = table.get(rows) if _force is None else _force
        if transposed is None:  # no choice yet for this row count
            if 0 < rows <= MAX_ROWS and not torch.is_grad_enabled():
                calls = seen[rows] = seen.get(rows, 0) + 1
                if calls <= WARMUP_CALLS:
                    return linear(x, weight, bias)
                return _trial(base, rows, table, x.reshape(rows, x.shape[-1]), weight, bias).view(
                    *x.shape[:-1], weight.shape[0])  # fmt: skip
        elif transposed and 0 < rows <= MAX_ROWS:
            return _transposed(x.reshape(rows, x.shape[-1]), weight, bias).view(*x.shape[:-1], weight.shape[0])
        return linear(x, weight, bias)

    return forward


@contextlib.contextmanager
def few_row_linears(*modules: nn.Module):
    """Within the block, every ``nn.Linear`` of ``modules`` whose weight lives on a CPU runs calls of up to
    :data:`MAX_ROWS` rows (without autograd) through the kernel measured faster on this machine (module
    docstring). Modules whose ``forward`` something else already replaced (an accelerate hook, a nested block)
    are left alone; everything is restored when the block ends."""
    patched, threads = [], torch.get_num_threads()
    try:
        for module in modules:
            for layer in module.modules():
                if (type(layer) is nn.Linear and "forward" not in layer.__dict__
                        and layer.weight.device.type == "cpu"):  # fmt: skip
                    layer.forward = _layer_forward(layer, threads)
                    patched.append(layer)
        yield
    finally:
        for layer in patched:
            layer.__dict__.pop("forward", None)
