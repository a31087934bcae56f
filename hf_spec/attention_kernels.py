"""Few-query attention on a CPU: of equal computations, the one this machine runs fastest, measured.

A decoding step attends one query per head to the whole cache, a tree verification a few. transformers' SDPA
attention hands torch grouped-query heads as they are (``enable_gqa``, which :func:`hf_spec.compat.tree_attention`
asks for on a CPU), and torch's CPU flash kernel then works per query head in blocks built for long queries: in bf16
on a 2-core AMD EPYC (Zen 4, torch 2.13) one query over 700 cached positions took 0.39 ms per layer, 12 ms of a
SmolLM2-135M step. Two kernels compute the same attention:

- ``sdpa``: transformers' SDPA attention as it is;
- ``grouped``: the query heads that share a key/value head stacked as rows of one query (``(b, kv, groups x q,
  d)``, the mask repeated per group), then the same SDPA call without ``enable_gqa``: one kernel call per key/value
  head over more rows (what transformers itself does for one query with a mask). On that EPYC in bf16 one query
  over 700 positions took 79 us instead of 388, with the same bits; from 8 queries on the two are close.

So nothing is assumed: within :func:`few_query_attention`, the calls of each query count (up to :data:`MAX_QUERIES`) and
cache-length bucket (:func:`length_bucket`), after :data:`WARMUP_CALLS`, take turns with the kernels, timed in place,
and from then on this process runs the fastest (another kernel than ``sdpa`` only when it was at least :data:`MIN_GAIN`
faster) until the choice is measured again, each trial adding to the evidence of the ones before
(:mod:`hf_spec.kernel_trials`). The kernels differ at most in summation
order, as a tree verification already does against a one-token step: greedy output stays that of plain ``generate()``
(the tests run every kernel), and sampling is unaffected (in bf16 on that EPYC the two gave the same bits). Calls the
other kernels do not cover (autograd, dropout, soft-capping, sinks, a causal call without a mask, another device) run
``sdpa``.
"""

from __future__ import annotations

import contextlib
import time

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .kernel_trials import ForcedKernel, KernelEvidence, decision, expired, timed_turn, trial_samples

__all__ = ["KERNELS", "MAX_QUERIES", "MIN_GAIN", "TRIAL_CALLS", "WARMUP_CALLS", "attention_choices",
           "few_query_attention", "forced_attention", "length_bucket"]  # fmt: skip

KERNELS = ("sdpa", "grouped")
"""The kernels a few-query call may run (module docstring); ``sdpa`` is the default."""
MAX_QUERIES = 64
"""Query counts above this always run ``sdpa`` (a prefill)."""
MIN_GAIN = 0.10
"""Another kernel replaces ``sdpa`` only when the trials so far measured it at least this much faster."""
WARMUP_CALLS = 2
"""Calls of each (query count, length bucket) that run ``sdpa`` untimed before its trial (first-time work)."""
TRIAL_CALLS = 24
"""Calls of one (query count, length bucket) on trial, as many with each kernel, before the choice: a model's
layers settle it within a forward."""
_tables: dict[tuple, str] = {}
"""(dtype, threads, heads, key/value heads, head dim, queries, length bucket) -> the kernel chosen, for this process."""
_trials: dict[tuple, dict[str, list[float]]] = {}
"""The same keys still being measured -> the seconds of their calls so far per kernel."""
_made: dict[tuple, float] = {}
"""The same keys chosen -> when (``time.perf_counter()``): measured again once
:data:`hf_spec.kernel_trials.RECHECK_SECONDS` old."""
_evidence: dict[tuple, KernelEvidence] = {}
"""The same keys -> what their trials so far found (each recheck adds a trial to it)."""
_warmups: dict[tuple, int] = {}
"""The same keys -> their calls so far while no choice exists (the first :data:`WARMUP_CALLS` are not timed)."""
_forced = ForcedKernel(KERNELS)
"""Tests set this (through :func:`forced_attention`) to run one kernel everywhere."""


def length_bucket(length: int) -> int:
    """The cache-length class a choice is made for: the next power of two from 128 (costs grow with the length,
    and which kernel wins may change with it)."""
    return max(128, 1 << (int(length) - 1).bit_length())


def attention_choices() -> dict[str, str]:
    """What this process chose so far: ``{"dtype threads heads/kv heads x dim, q queries, <= n keys": kernel}``."""
    return {f"{str(k[0]).removeprefix('torch.')} {k[1]} threads {k[2]}/{k[3]} heads x {k[4]}, {k[5]} queries, "
            f"<= {k[6]} keys": kernel for k, kernel in sorted(_tables.items(), key=str)}  # fmt: skip


def forced_attention(kernel: str):
    """Run every covered call with one kernel of :data:`KERNELS` (for tests); a context manager."""
    return _forced(kernel)


def _run(kernel: str, module, query, key, value, mask, scaling, kwargs) -> torch.Tensor:
    """The ``(b, q, h, d)`` attention output of one call through ``kernel``."""
    if kernel == "sdpa":
        return sdpa_attention_forward(module, query, key, value, mask, scaling=scaling, **kwargs)[0]
    b, heads, q, d = query.shape
    groups = heads // key.shape[1]
    stacked = query.reshape(b, key.shape[1], groups * q, d)
    if mask is not None:
        mask = mask.expand(mask.shape[0], groups, q, mask.shape[-1]).reshape(mask.shape[0], 1, groups * q, -1)
    out = torch.nn.functional.scaled_dot_product_attention(stacked, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(b, heads, q, value.shape[-1]).transpose(1, 2).contiguous()


def _covered(module, query, key, attention_mask, dropout, kwargs) -> bool:
    """Whether the call is one the other kernels compute exactly as ``sdpa`` would (else ``sdpa`` runs)."""
    q = query.shape[2]
    return (query.device.type == "cpu" and not torch.is_grad_enabled() and not dropout and 0 < q <= MAX_QUERIES
            and query.shape[1] % key.shape[1] == 0 and query.shape[-1] == key.shape[-1]
            and (attention_mask is not None or q == 1)
            and (attention_mask is None or (attention_mask.dim() == 4 and attention_mask.shape[1] == 1
                                            and attention_mask.is_floating_point()))
            and not any(kwargs.get(name) is not None
                        for name in ("softcap", "sinks", "s_aux", "position_bias", "cache"))
            and not kwargs.get("output_attentions", False))  # fmt: skip


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' attention-interface signature: ``(b, q, h, d)`` output and no weights."""
    if not _covered(module, query, key, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)  # fmt: skip
    if attention_mask is not None:
        attention_mask = attention_mask[..., : key.shape[2]]
    if _forced.kernel is not None:
        return _run(_forced.kernel, module, query, key, value, attention_mask, scaling, kwargs), None
    choice_key = (query.dtype, torch.get_num_threads(), query.shape[1], key.shape[1], query.shape[-1], query.shape[2],
                  length_bucket(key.shape[2]))  # fmt: skip
    kernel = _tables.get(choice_key)
    if kernel is not None:
        return _run(kernel, module, query, key, value, attention_mask, scaling, kwargs), None
    seen = _warmups[choice_key] = _warmups.get(choice_key, 0) + 1
    if seen <= WARMUP_CALLS:
        return _run("sdpa", module, query, key, value, attention_mask, scaling, kwargs), None
    samples = trial_samples(_trials, _evidence, choice_key, KERNELS, "sdpa")
    if samples is None:  # the other is far behind and sits this trial out
        _tables[choice_key], _made[choice_key] = "sdpa", time.perf_counter()
        return _run("sdpa", module, query, key, value, attention_mask, scaling, kwargs), None
    out = timed_turn(samples, tuple(samples), lambda k: _run(k, module, query, key, value, attention_mask, scaling,
                                                              kwargs))  # fmt: skip
    choice = decision(samples, tuple(samples), TRIAL_CALLS // len(KERNELS), "sdpa", MIN_GAIN, _evidence[choice_key])
    if choice is not None:
        _tables[choice_key], _made[choice_key] = choice, time.perf_counter()
        del _trials[choice_key]
    return out, None


@contextlib.contextmanager
def few_query_attention(device: torch.device | str = "cpu"):
    """Within the block, transformers' ``sdpa`` attention runs, on a CPU, few-query calls through the kernel
    measured fastest (module docstring); process-wide for the block's duration, restored after. Nothing on other
    devices."""
    if torch.device(device).type != "cpu":
        yield
        return
    for key in expired(_made):  # measured again from this block's calls on
        _tables.pop(key, None)
    previous = ALL_ATTENTION_FUNCTIONS.get("sdpa", sdpa_attention_forward)
    AttentionInterface.register("sdpa", _attention)
    try:
        yield
    finally:
        AttentionInterface.register("sdpa", previous)
