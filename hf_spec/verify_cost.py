"""What verification costs on this machine: one target forward of ``n`` tree tokens, by ``n``.

:func:`measure_verify_cost` times it: one target forward of ``n`` tree tokens (tree mask, tree positions) on a
cached prefix, followed by the target's LM head over all ``n`` rows (verification computes every node's logits in
one matmul), median of repeats, for each ``n`` asked for.

:func:`verify_cost_curve` is that curve for a target at :data:`VERIFY_CURVE_SIZES`, measured once (on a CPU tens
of seconds, more for larger targets: on a 2-core AMD EPYC in float32 19 s for SmolLM2-135M, 134 s for a 1B-parameter
Llama) and cached in this process and in ``$HF_SPEC_CACHE/verify_costs/``. It depends on the machine, threads,
device, dtype and the target's shape, not on any drafter. ``hf-spec tune`` predicts shapes with it.

Decoding uses it only as a prior: :func:`verify_costs` is the process's :class:`VerifyCosts` for a target, the curve
corrected by the decoding loop's own measured verifications (each one-row cycle reports its tree size and wall
time, but a forward that packed a weight: :func:`hf_spec.linear_kernels.weights_packed`). Drafters that size their
trees per cycle (:class:`~hf_spec.NGramDrafter`, the n-gram branches and cost gate of the trained drafters) weigh
a node's acceptance against its :meth:`VerifyCosts.curve` when a call starts. Why: one timing of a
drifting machine, once per process, gave curves whose node costs differed enough that one process grafted no n-gram
nodes into EAGLE's two-token trees and another up to ten; and a forward timed apart from decoding is not what
decoding pays (on a 2-core EPYC in float32, 6 tree tokens cost 1.6x a plain step inside ``generate()``).

The bottom of the house: this module imports only compat, cache, tree, timing, resources, hardware and the pure
curve helpers of :mod:`hf_spec.shape_select` — never a drafter, the decoding loop or the bench.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import statistics
import weakref
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from . import compat
from .attention_kernels import few_query_attention
from .cache import crop_to
from .hardware import cpu_flags, machine_info
from .linear_kernels import MAX_ROWS, TRIAL_CALLS, WARMUP_CALLS, chosen_kernel, few_row_linears
from .resources import cache_dir
from .shape_select import interpolate_cost, non_decreasing
from .timing import timed
from .tree.tree import DraftTree

logger = logging.getLogger(__name__)

__all__ = ["CACHE_FORMAT", "LARGE_SIZE_REPEATS", "VERIFY_CURVE_SIZES", "VerifyCosts", "live_verify_costs",
           "measure_verify_cost", "verify_cost_curve", "verify_costs"]

CACHE_FORMAT = 6
"""Version of a cached curve's JSON (2: 7 timed rounds on a 256-token prefix, made non-decreasing; 3: verification
timed as decoding now runs it on a CPU, masked GQA attention without repeated key/value heads; 4: every size from 1
to 6 timed; 5: linear layers through :func:`~hf_spec.linear_kernels.few_row_linears`, as decoding runs them; 6: one
token timed as decoding's plain step, without a tree mask). A cached curve of another format is measured again."""
VERIFY_CURVE_SIZES = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)
"""Tree sizes whose verification cost :func:`verify_cost_curve` measures: every small size, because the cost of a
few-token forward is a step function, not a line (a CPU's float32 GEMM changes kernels at a few rows: on a 2-core
Xeon, SmolLM2-135M, 3 tokens cost 1.11x one and 4 tokens 1.49x; interpolating 3 between 2 and 4 priced a
two-node tree 1.23x). The n-gram tries and the cost gate are sized by it, so it is where they decide most."""
LARGE_SIZE_REPEATS = 3
"""Timed rounds of the curve's sizes above :data:`~hf_spec.linear_kernels.MAX_ROWS` (the small sizes get 7). They
are most of a round's time (on a 2-core Zen 1 in float32, 55% for SmolLM2-135M and 64% for a 1B target), a forward
of many rows takes long against the machine's jitter, and decoding verifies such trees rarely (copy tries, the top
rung of a ladder) and measures each size it verifies (:class:`VerifyCosts`). Their median of 3 rounds read within
0-1.2% (SmolLM2-135M) and 0.6-4.6% (1B) of the median of 7, where the small sizes' read within up to 3.3% and
6.0%."""
_curves: dict = {}
"""Verification cost curves measured or read in this process, by key."""


@torch.inference_mode()
def measure_verify_cost(model, sizes: Sequence[int], prefix_length: int = 256, repeats: int = 7, seed: int = 0,
                        large_repeats: int | None = None):  # fmt: skip
    """``{n: ms of one target forward of n tree tokens on a cached prefix + the LM head over the n rows}``: the
    sizes are timed in turns, ``repeats`` rounds (the sizes above :data:`~hf_spec.linear_kernels.MAX_ROWS` only in
    the first ``large_repeats``, if given); when 1 is among ``sizes``, each size is the median of its ratio to one
    token in the same round times one token's median, else its own median."""
    large_repeats = repeats if large_repeats is None else min(large_repeats, repeats)
    with compat.tree_attention(model.device), few_row_linears(model), few_query_attention(model.device):  # as decoding
        return _measure_verify_cost(model, sizes, prefix_length, repeats, large_repeats, seed)


def _measure_verify_cost(model, sizes: Sequence[int], prefix_length: int, repeats: int, large_repeats: int,
                         seed: int):  # fmt: skip
    device = model.device
    vocab = model.config.get_text_config().vocab_size
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, vocab, (1, prefix_length), generator=g).to(device)
    cache = compat.full_dynamic_cache()
    base = model.base_model
    base(input_ids=prefix, past_key_values=cache, use_cache=True)
    window = compat.target_sliding_window(model.config)
    trees = {n: DraftTree.chain(1, torch.randint(0, vocab, (n - 1,), generator=g).to(device)) for n in sizes}
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    head = model.get_output_embeddings()
    # Round 0 warms up. On a CPU the few-row sizes first run each layer's untimed calls (WARMUP_CALLS rounds before
    # it), and round 0 then settles their kernel choices as decoding would: one forward settles the 30 layers of a
    # shape; the LM head, one call per forward, gets up to TRIAL_CALLS calls on the round's own hidden state, until
    # its choice is made.
    few_row = device.type == "cpu"
    for r in range(-WARMUP_CALLS if few_row else 0, repeats + 1):
        for n in sizes:
            if (r < 0 or r > large_repeats) and n > MAX_ROWS:
                continue
            tree = trees[n]

            def verify():
                if len(tree) == 1:  # as decoding runs a lone root: the plain step, no tree mask
                    out = base(input_ids=tree.tokens.view(1, -1), past_key_values=cache, use_cache=True)
                else:
                    out = base(input_ids=tree.tokens.view(1, -1), past_key_values=cache, use_cache=True,
                               attention_mask=tree.attention_mask(prefix_length, model.dtype, window),
                               position_ids=tree.position_ids(prefix_length))  # fmt: skip
                hidden = out.last_hidden_state[0]
                return hidden, head(hidden).float()

            (hidden, _), ms = timed(verify, device)
            crop_to(cache, prefix_length)
            if r > 0:
                samples[n].append(ms)
            elif r == 0 and few_row and n <= MAX_ROWS:
                for _ in range(TRIAL_CALLS):
                    if chosen_kernel(head, n) is not None:
                        break
                    head(hidden)
    if 1 not in samples:
        return {n: statistics.median(v) for n, v in samples.items()}
    # Each size against one token in the same round, then the median: a slow spell of the machine slows a round's
    # sizes alike, and a spell over some rounds would otherwise bend the curve (one process read 3 tokens at the
    # price of 1 and another at 1.35x, on the same machine).
    step = statistics.median(samples[1])
    return {n: step * statistics.median(t / one for t, one in zip(v, samples[1])) for n, v in samples.items()}


def verify_cost_curve(model) -> dict[int, float]:
    """This machine's verification cost curve for ``model``: ``{n: ms of one target forward of n tree tokens
    + the LM head over them}`` at :data:`VERIFY_CURVE_SIZES` (median of 7 rounds, of :data:`LARGE_SIZE_REPEATS` above
    16 tokens, made non-decreasing), from this process's memory, else ``$HF_SPEC_CACHE/verify_costs/``, else measured
    (tens of seconds on a CPU) and cached."""
    key = json.dumps(_machine_and_target(model), sort_keys=True, default=str)
    if key in _curves:
        return _curves[key]
    path = cache_dir() / "verify_costs" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.json"
    curve = _read_cached(path, key)
    if not curve:
        logger.warning("hf-spec: timing this machine's verification of 1-%d tokens once for this target, dtype and "
                       "thread count (on a CPU tens of seconds, longer for larger targets; cached in %s)",
                       VERIFY_CURVE_SIZES[-1], path.parent)  # fmt: skip
        with torch.inference_mode():
            curve = non_decreasing(measure_verify_cost(model, VERIFY_CURVE_SIZES, prefix_length=256, repeats=7,
                                                       large_repeats=LARGE_SIZE_REPEATS))  # fmt: skip
        _write_cached(path, {"format": CACHE_FORMAT, "key": key, "verify_ms": {str(n): ms for n, ms in curve.items()}})
    _curves[key] = curve
    return curve


class VerifyCosts:
    """One target's verification costs in this process: a ``prior`` curve ``{n: ms}`` (:func:`verify_cost_curve`)
    corrected by measured verifications (:meth:`observe`, from the decoding loop).

    Each tree size's measurements are a discounted mean (half-life :attr:`HALF_LIFE` observations of any size, so
    an old one fades whether or not its size comes again: the machine drifts). :meth:`curve` is the measured mean
    where a size has :attr:`MIN_WEIGHT` of them; elsewhere the prior, scaled by the measured-over-prior ratio of
    the nearest measured sizes (interpolated in log size): the prior's shape, at the level decoding pays."""

    HALF_LIFE = 256.0
    MIN_WEIGHT = 3.0
    OUTLIER = 3.0
    """A measurement counts at most this many times its size's mean (one stall must not price a size)."""

    def __init__(self, prior: dict[int, float]):
        if not prior:
            raise ValueError("VerifyCosts needs a prior curve with at least one size.")
        self.prior = {int(n): float(ms) for n, ms in prior.items()}
        self._sums: dict[int, list[float]] = {}  # n -> [discounted ms, discounted count]
        self._decay = 0.5 ** (1.0 / self.HALF_LIFE)
        self.observations = 0

    def observe(self, n: int, ms: float) -> None:
        """One verification of ``n`` tree tokens took ``ms`` milliseconds (wall, as decoding ran it)."""
        for sums in self._sums.values():
            sums[0] *= self._decay
            sums[1] *= self._decay
        sums = self._sums.setdefault(int(n), [0.0, 0.0])
        if sums[1] >= 1.0:
            ms = min(ms, self.OUTLIER * sums[0] / sums[1])
        sums[0] += ms
        sums[1] += 1.0
        self.observations += 1

    def measured(self) -> dict[int, float]:
        """``{n: mean ms}`` of the sizes with :attr:`MIN_WEIGHT` of recent measurements."""
        return {n: total / count for n, (total, count) in sorted(self._sums.items()) if count >= self.MIN_WEIGHT}

    def curve(self) -> dict[int, float]:
        """The current curve ``{n: ms}`` (the prior's sizes and the measured ones), made non-decreasing."""
        measured = self.measured()
        if not measured:
            return non_decreasing(self.prior)
        sizes = list(measured)  # sorted
        ratios = [measured[n] / interpolate_cost(self.prior, n) for n in sizes]
        # measured/prior ratio, linear in log size between measured sizes, flat beyond them
        scale = np.interp(np.log(list(self.prior)), np.log(sizes), ratios)
        curve = {n: ms * float(r) for (n, ms), r in zip(self.prior.items(), scale)}
        curve.update(measured)
        return non_decreasing(curve)


_live: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""model -> {(dtype, device, threads): VerifyCosts}."""


def _live_key(model) -> tuple:
    return (model.dtype, str(model.device), torch.get_num_threads())


def verify_costs(model) -> VerifyCosts:
    """The process's :class:`VerifyCosts` for ``model`` (per dtype, device and threads), created on first use with
    :func:`verify_cost_curve` as its prior (a new one when that prior changed)."""
    prior = verify_cost_curve(model)
    mine = _live.setdefault(model, {})
    costs = mine.get(_live_key(model))
    if costs is None or costs.prior != prior:
        costs = mine[_live_key(model)] = VerifyCosts(prior)
    return costs


def live_verify_costs(model) -> VerifyCosts | None:
    """The :class:`VerifyCosts` of ``model`` if a drafter has asked for them in this process (else None: nothing
    to correct, and no curve is measured for it)."""
    mine = _live.get(model)
    return None if mine is None else mine.get(_live_key(model))


def _machine_and_target(model) -> dict:
    """What a timing of ``model`` depends on: machine, software, threads, device, dtype and the target's
    architecture (never the load average or the date)."""
    device = model.device
    info = machine_info(model.dtype)
    stable = {k: info.get(k) for k in ("cpu", "cores", "platform", "python", "torch", "transformers", "dtype")}
    stable["cpu_flags"] = _cpu_flags_digest()  # two CPUs can share a model name ("Intel(R) Xeon(R) Processor"), not AMX
    stable["mkl_cbwr"] = os.environ.get("MKL_CBWR")  # MKL's code path changes float32 costs (hf_spec.hardware)
    if device.type == "cuda":
        stable["gpu"] = torch.cuda.get_device_name(device)
    target = model.config.get_text_config().to_dict()
    target = {k: target.get(k) for k in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                                         "num_attention_heads", "num_key_value_heads", "vocab_size")}  # fmt: skip
    return {"machine": stable, "threads": torch.get_num_threads(), "device": str(device), "target": target}


def _cpu_flags_digest() -> str | None:
    """A digest of the CPU's feature flags (/proc/cpuinfo), None where they cannot be read."""
    flags = cpu_flags()
    return hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:16] if flags else None


def _read_cached(path: Path, key: str) -> dict[int, float] | None:
    """The curve cached at ``path`` if it is of :data:`CACHE_FORMAT` and for ``key`` and readable, else None."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if not (isinstance(data, dict) and data.get("format") == CACHE_FORMAT and data.get("key") == key):
            return None
        return {int(n): float(ms) for n, ms in data["verify_ms"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write_cached(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1) + "\n")
    except OSError as error:  # a read-only cache only costs a re-measurement in the next process
        logger.warning("hf-spec: could not cache a cost measurement in %s (%s)", path, error)
