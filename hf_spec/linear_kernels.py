"""Few-row linear layers on a CPU: of equal computations, the one this machine runs fastest, measured.

Decoding multiplies a few rows (one token; a draft tree's nodes) by every weight matrix of the target and the
drafter. PyTorch's ``F.linear(x, W)`` hands that to its BLAS, whose few-row kernels differ from machine to machine,
and in bf16 to oneDNN, which reorders the weight into its blocked layout on every call. Three kernels compute it:

- ``F.linear`` itself;
- ``transposed``: ``W @ x.T`` (a single row padded to two). On a 2-core AMD EPYC (Zen 4, torch 2.13 with MKL,
  float32) the one-row product ran in a matrix-vector kernel on one core; written this way it took 158 us instead of
  312 through a 1536x576 weight and 5.0 ms instead of 10.3 through SmolLM2-135M's 49,152-row head, and a plain
  float32 step of SmolLM2-135M went from 58 to 33 ms (benchmarks/few_row_kernels);
- ``padded``: ``W @ x.T`` over the rows padded with zero rows to the next power of two. The BLAS's matrix-matrix
  kernels work in blocks of rows, and a row count between two blocks can cost more than the next block: on a 2-core
  AMD EPYC (Zen 1, float32) a SmolLM2-135M forward over 3 tokens took 88 ms through ``W @ x.T`` and 81 padded to 4,
  its LM head 10.5 ms against 7.8 (over 5 rows padding to 8 lost: 104 against 88, so it is measured, like the others;
  row counts that are powers of two have nothing to pad and leave it out);
- ``packed``: the weight packed once (kept for the process while it pays, as torch's compiler freezes linear layers;
  :func:`hf_spec.compat.pack_linear_weight`), then multiplied without the per-call packing: in bf16 into oneDNN's
  layout (on that EPYC a SmolLM2-135M forward over 1 token went from 42 to 34 ms and over 8 tokens from 46 to 34, with
  the same bits as ``F.linear``), in float32 into MKL's packed sgemm layout (MKL packs the weight on every call of 4 or
  more rows: on a 2-core Xeon with AMX a forward over 4 tokens went from 43.3 to 40.4 ms, over 8 from 53.9 to 48.0).
  The copy costs the weight's memory again; packing stops before packed copies would take more than
  :data:`PACK_MEMORY_SHARE` of the memory that was free.

Products timed in isolation, weights warm in a cache, can rank the kernels the other way. So nothing here is assumed:
within :func:`few_row_linears`, the calls with each row count (up to :data:`MAX_ROWS`) of each weight shape, after each
layer's first :data:`WARMUP_CALLS`, take turns with the kernels, timed in place on their real inputs, and from then on
this process runs the fastest (another kernel than ``F.linear`` only when it was at least :data:`MIN_GAIN` faster) until
the choice is :data:`~hf_spec.kernel_trials.RECHECK_SECONDS` old and measured again, the new trial added to the old
ones' evidence (:class:`~hf_spec.kernel_trials.KernelEvidence`). Choices are per weight shape,
dtype, thread count and row count: a model's 30 layers of one shape settle one within a forward or two, its LM head (one
call per forward) within :data:`TRIAL_CALLS` forwards. The kernels compute the same products, at most in another
summation order, as a tree verification already does against a one-token step: greedy output stays that of plain
``generate()`` (the tests run every kernel), and sampling is unaffected.

hf-spec's decoding and its verification-cost curve run inside it on a CPU; it is public because it speeds up a
plain ``generate()`` just as well (``with hf_spec.few_row_linears(model): model.generate(...)``).
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref

import torch
from torch import nn

from . import compat
from .kernel_trials import ForcedKernel, KernelEvidence, decision, expired, timed_turn, trial_samples

__all__ = ["KERNELS", "MAX_ROWS", "MIN_GAIN", "PACK_MEMORY_SHARE", "TRIAL_CALLS", "WARMUP_CALLS", "chosen_kernel",
           "few_row_linears", "forced_kernel", "kernel_choices", "weights_packed"]  # fmt: skip

KERNELS = ("F.linear", "transposed", "padded", "packed")
"""The kernels a few-row call may run (module docstring); ``F.linear`` is the default."""
MAX_ROWS = 16
"""Row counts above this always use ``F.linear`` (a matrix product of many rows has no slow few-row kernel)."""
MIN_GAIN = 0.10
"""Another kernel replaces ``F.linear`` only when the trials so far measured it at least this much faster (a close
call keeps the default kernel)."""
WARMUP_CALLS = 2
"""Each layer's first calls with a row count in this process run untimed: a process's first decoding steps run
slower for reasons of their own (memory touched for the first time), and there, on the EPYC above, the transposed
product measured up to twice its later cost and lost choices it wins from the third step on. They run the kernel
chosen for the nearest row count of the shape, if any (``F.linear`` can be the slowest by far: SmolLM2-135M's
49,152-row head over 5 rows took 25 ms through it against 10 transposed on a Zen 1 in float32)."""
TRIAL_CALLS = 32
"""Calls of one weight shape with one row count that run on trial (in turns, as many with each kernel: 8) before the
choice: a model's 30 layers of one shape settle it within a forward or two, its LM head within 32 (fewer where a
kernel falls far behind, :data:`~hf_spec.kernel_trials.EARLY_CALLS`)."""
PACK_MEMORY_SHARE = 0.5
"""Packed copies of weights may take at most this share of the memory that was free before they were made; past it
a layer keeps the other kernels."""
_tables: dict[tuple, dict[int, str]] = {}
"""(weight shape, dtype, threads) -> {rows: the kernel chosen}, for this process."""
_trials: dict[tuple, dict[str, list[float]]] = {}
"""((weight shape, dtype, threads), rows) still being measured -> the seconds of their calls so far per kernel."""
_made: dict[tuple, float] = {}
"""((weight shape, dtype, threads), rows) chosen -> when (``time.perf_counter()``): measured again once
:data:`hf_spec.kernel_trials.RECHECK_SECONDS` old."""
_evidence: dict[tuple, KernelEvidence] = {}
"""((weight shape, dtype, threads), rows) -> what its trials so far found (each recheck adds a trial to it)."""
_packed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Layer -> (what its weight was when packed, the packed copy, its bytes): reused across blocks while the weight is
unchanged and some choice of its shape is ``packed`` or still on trial."""
_unpackable: set[torch.dtype] = set()
"""Dtypes this torch build could not pack (no MKL or oneDNN packing): their layers keep the other two kernels."""
_packings = 0
"""Weights packed so far in this process (:func:`weights_packed`)."""
_warmups: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""Layer -> {(weight shape, dtype, threads): {rows: its calls so far while no choice existed}}, for this process (a
layer's first-time work is done once, not in every block)."""
_forced = ForcedKernel(KERNELS)
"""Tests set this (through :func:`forced_kernel`) to run one kernel everywhere."""


def kernel_choices() -> dict[str, str]:
    """What this process chose so far: ``{"NxK dtype threads rows": kernel}`` (one of :data:`KERNELS`)."""
    return {f"{shape[0]}x{shape[1]} {str(dtype).removeprefix('torch.')} {threads} threads {rows} rows": kernel
            for (shape, dtype, threads), table in _tables.items() for rows, kernel in sorted(table.items())}  # fmt: skip


def chosen_kernel(layer: nn.Module, rows: int) -> str | None:
    """The kernel this process runs for ``layer``'s weight shape and dtype with ``rows`` rows at the current thread
    count (one of :data:`KERNELS`), None while none is chosen (its calls still warming up or on trial) and for a
    module that is not an ``nn.Linear`` (:func:`few_row_linears` leaves those alone)."""
    if type(layer) is not nn.Linear:
        return None
    return _tables.get(_shape_key(layer.weight, torch.get_num_threads()), {}).get(rows)


def _shape_key(weight: torch.Tensor, threads: int) -> tuple:
    """What a choice is kept per, besides the row count: (weight shape, dtype, threads)."""
    return tuple(weight.shape), weight.dtype, threads


def forced_kernel(kernel: str):
    """Run every few-row call with one kernel of :data:`KERNELS` (for tests: each must give plain ``generate()``'s
    greedy text; ``packed`` falls back to ``F.linear`` where a weight cannot be packed); a context manager."""
    return _forced(kernel)


def _transposed(x2: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, pad_to: int = 2) -> torch.Tensor:
    """``F.linear`` of the (rows, K) input as ``W @ x.T`` over the rows padded with zero rows to at least ``pad_to``
    (a single row to two, so the BLAS takes its matrix-matrix kernel), returned as a contiguous (rows, N)."""
    rows = x2.shape[0]
    if rows < pad_to:
        x2 = torch.cat([x2, x2.new_zeros(pad_to - rows, x2.shape[1])])
    else:
        x2 = x2.contiguous()
    out = torch.mm(weight, x2.t())[:, :rows].t().contiguous()
    return out if bias is None else out.add_(bias)


def _padded_rows(rows: int) -> int:
    """The rows of the ``padded`` kernel's product: the next power of two (at least 2)."""
    return max(2, 1 << (rows - 1).bit_length())


def _kernels(rows: int) -> tuple[str, ...]:
    """The kernels a call of ``rows`` rows may run: ``padded`` only where it pads more than ``transposed`` does (not
    at 1, 2, 4, 8 or 16 rows, where the two are one product)."""
    return KERNELS if _padded_rows(rows) > max(rows, 2) else tuple(k for k in KERNELS if k != "padded")


def _free_memory() -> int | None:
    """Bytes of memory available to this process now (Linux ``MemAvailable``, else free pages; None: unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def weights_packed() -> int:
    """Weights packed so far in this process. A call that packs one copies the weight first (SmolLM2-135M's head in
    float32 on a 2-core EPYC: a verification of 5 tokens took 530 ms, not 130), which a trial does once per weight
    and recheck, not per step: decoding's cost measurements (:mod:`hf_spec.verify_cost`, the speed controller, the
    cost gate) leave out the forwards during which this count grew."""
    return _packings


def _packed_weight(layer: nn.Linear) -> torch.Tensor | None:
    """``layer``'s packed weight, made on first use (None: its dtype cannot be packed, or the memory share was spent
    when it was asked for); remade when the weight changed since (in place, or replaced)."""
    weight = layer.weight
    state = (weight.data_ptr(), compat.tensor_version(weight), weight.dtype, tuple(weight.shape))
    entry = _packed.get(layer)
    if entry is not None and entry[0] == state:
        return entry[1]
    if weight.dtype in _unpackable:
        return None
    _packed.pop(layer, None)
    size = weight.numel() * weight.element_size()
    held = sum(e[2] for e in _packed.values())
    free = _free_memory()
    packed = None
    if free is None or held + size <= PACK_MEMORY_SHARE * (free + held):
        global _packings
        _packings += 1
        try:
            packed = compat.pack_linear_weight(weight)
        except RuntimeError:
            _unpackable.add(weight.dtype)
            return None
    _packed[layer] = (state, packed, size if packed is not None else 0)
    return packed


def _run(kernel: str, layer: nn.Linear, x2: torch.Tensor) -> torch.Tensor:
    """``F.linear`` of the (rows, K) input through ``kernel`` (``packed`` without a packed weight: ``F.linear``)."""
    if kernel == "transposed":
        return _transposed(x2, layer.weight, layer.bias)
    if kernel == "padded":
        return _transposed(x2, layer.weight, layer.bias, _padded_rows(x2.shape[0]))
    if kernel == "packed":
        packed = _packed_weight(layer)
        if packed is not None:
            return compat.packed_linear(x2.contiguous(), packed, layer.weight, layer.bias)
    return torch.nn.functional.linear(x2, layer.weight, layer.bias)


def _trial(base: tuple, rows: int, table: dict, layer: nn.Linear, x2: torch.Tensor) -> torch.Tensor:
    """One measured call of a row count still on trial (:func:`hf_spec.kernel_trials.timed_turn`), timed on the real
    input with the weight where decoding leaves it (running several on one call would find the weight warm in a
    cache for the later ones: a 576x576 weight then measured the other way round); once each kernel has its share
    of :data:`TRIAL_CALLS`, ``table`` keeps the choice. A layer whose weight cannot be packed leaves ``packed`` out;
    the call that packs a weight is not timed (packing reads the weight into a cache: on a Zen 4 in float32 the
    kernel timed right after it measured faster than it runs, and the trial chose the packed weight where the
    transposed product was 1.4x faster)."""
    key = (base, rows)
    samples = trial_samples(_trials, _evidence, key, _kernels(rows), "F.linear")
    if samples is None:  # the others are far behind and sit this trial out
        table[rows], _made[key] = "F.linear", time.perf_counter()
        return torch.nn.functional.linear(x2, layer.weight, layer.bias)
    kernels = tuple(samples)
    if "packed" in kernels:
        before = _packed.get(layer)
        packed = _packed_weight(layer)
        if packed is not None and (before is None or before[1] is not packed):
            # packed on this call: packing read the weight into a cache, so no kernel's time would be its real cost
            return torch.nn.functional.linear(x2, layer.weight, layer.bias)
        if packed is None:
            kernels = tuple(kernel for kernel in kernels if kernel != "packed")
    out = timed_turn(samples, kernels, lambda kernel: _run(kernel, layer, x2))
    choice = decision(samples, kernels, TRIAL_CALLS // len(KERNELS), "F.linear", MIN_GAIN, _evidence[key])
    if choice is not None:
        table[rows], _made[key] = choice, time.perf_counter()
        del _trials[key]
    return out


def _layer_forward(layer: nn.Linear, threads: int):
    """The ``forward`` that :func:`few_row_linears` gives ``layer``: few-row calls by the chosen kernel (or on trial);
    the common path is one dict lookup on top of ``F.linear`` (the 30 layers of a model share a table)."""
    weight, bias = layer.weight, layer.bias
    base = _shape_key(weight, threads)
    table = _tables.setdefault(base, {})
    linear = torch.nn.functional.linear

    seen = _warmups.setdefault(layer, {}).setdefault(base, {})  # row count -> calls so far while no choice existed

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if not 0 < rows <= MAX_ROWS or torch.is_grad_enabled() or torch.is_autocast_enabled("cpu"):
            return linear(x, weight, bias)  # (under autocast F.linear casts; the other kernels would not)
        kernel = table.get(rows) if _forced.kernel is None else _forced.kernel
        if kernel is None:  # no choice yet for this row count
            calls = seen[rows] = seen.get(rows, 0) + 1
            if calls <= WARMUP_CALLS:
                kernel = table[min(table, key=lambda r: (abs(r - rows), r))] if table else "F.linear"
            else:
                out = _trial(base, rows, table, layer, x.reshape(rows, x.shape[-1]))
                return out.view(*x.shape[:-1], weight.shape[0])
        if kernel == "F.linear":
            return linear(x, weight, bias)
        return _run(kernel, layer, x.reshape(rows, x.shape[-1])).view(*x.shape[:-1], weight.shape[0])

    return forward


def _release_unused_packs(layers: list[nn.Linear], threads: int) -> None:
    """Drop the packed copies of ``layers`` whose shape chose no ``packed`` kernel and has no trial under way."""
    for layer in layers:
        if layer not in _packed:
            continue
        base = _shape_key(layer.weight, threads)
        if "packed" not in _tables.get(base, {}).values() and not any(key[0] == base for key in _trials):
            del _packed[layer]


@contextlib.contextmanager
def few_row_linears(*modules: nn.Module):
    """Within the block, every ``nn.Linear`` of ``modules`` whose weight lives on a CPU runs calls of up to
    :data:`MAX_ROWS` rows (without autograd or autocast) through the kernel measured fastest on this machine (module
    docstring). Modules whose ``forward`` something else already replaced (an accelerate hook, a nested block)
    are left alone; everything is restored when the block ends, and packed weight copies are kept only for the
    layers whose choice is ``packed``."""
    patched, threads = [], torch.get_num_threads()
    for base, rows in expired(_made):  # measured again from this block's calls on
        _tables.get(base, {}).pop(rows, None)
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
        _release_unused_packs(patched, threads)
