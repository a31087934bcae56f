"""Run-time choice of the draft-tree shape for the machine a drafter runs on.

The best tree depends on the hardware as much as on the drafter: what one verification of
``n`` tree tokens costs relative to one decoding step (flat to ``n`` = 32 on a GPU or a CPU with
AMX, ~4% more per token on AVX512-bf16 CPUs without AMX) and what each drafting level costs.
A shape tuned on one machine can lose on the next (``benchmarks/cross_machine_shape/``).

So a drafter's config may carry **shape candidates** (``tree_shape_candidates``): the
``generate()`` options of a few trees (``tree_depth``, ``tree_top_k``, ``tree_total_tokens``,
``tree_min_prob``, ``ngram_branches``; None keeps the configured value) together with what they achieved on
held-aside prompts, which does not depend on the machine: ``tau`` (tokens per target forward)
and ``verified_nodes`` (tree nodes verified per cycle, root included).
(``hf_spec.tune.measure_candidates`` measures them; ``benchmarks/shape_candidates/``.)

This module is the pure part (candidates, costs, the choice; no models), so a drafter config can
validate its candidates without importing the measurement code. :func:`hf_spec.tune.select_shape`
does the rest: on the first call on a new machine (target, device, dtype, threads) it
times the target's verification forward of ``n`` tokens and, for every candidate, a short real
generation that gives its drafting and loop time per cycle; that takes a few seconds and is
cached in memory and in ``$HF_SPEC_CACHE/shape_costs/``; :func:`choose_candidate` then picks the
candidate with the highest predicted tokens/s,

    tau / (t_verify(verified_nodes) + drafting_ms + loop_overhead_ms).

It is used when the config's ``auto_tree_shape`` is true (the default when candidates exist) and
the call passes none of the candidate options; any of them, or ``hf-spec tune --write``, fixes the
shape instead. The choice never affects the output: every shape is lossless.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

__all__ = [
    "CANDIDATE_OPTIONS",
    "CostProfile",
    "check_candidates",
    "choose_candidate",
    "measure_costs",
    "non_decreasing",
    "predict_ms_per_token",
    "ShapeChoice",
    "select_shape",
]

CANDIDATE_OPTIONS = ("tree_depth", "tree_top_k", "tree_total_tokens", "tree_min_prob", "ngram_branches")
"""The ``generate()`` options a candidate sets."""
CANDIDATE_RESULTS = ("tau", "verified_nodes")
"""What a candidate achieved on held-aside prompts (machine-independent)."""
CACHE_FORMAT = 3
"""Version of a cached :class:`CostProfile`'s JSON (2: verification curves of 7 timed rounds on a 256-token
prefix, made non-decreasing; profiles of format 1, 3 rounds on 128 tokens, are measured again; 3: verification
timed as decoding now runs it on a CPU, masked GQA attention without repeated key/value heads)."""


def check_candidates(candidates) -> list[dict]:
    """Validate ``tree_shape_candidates``: a list of dicts with the options and results above.
    Raises ValueError naming the problem and the fix."""
    if candidates is None:
        return []
    if not isinstance(candidates, (list, tuple)):
        raise ValueError(f"tree_shape_candidates must be a list of dicts, got {type(candidates).__name__}.")
    allowed = set(CANDIDATE_OPTIONS) | set(CANDIDATE_RESULTS)
    for i, candidate in enumerate(candidates):
        if not isinstance(candidate, dict):
            raise ValueError(f"tree_shape_candidates[{i}] must be a dict, got {type(candidate).__name__}.")
        unknown = set(candidate) - allowed
        missing = [k for k in CANDIDATE_RESULTS if not isinstance(candidate.get(k), (int, float))]
        if unknown or missing:
            raise ValueError(
                f"tree_shape_candidates[{i}] = {candidate}: "
                + (f"unknown keys {sorted(unknown)}; " if unknown else "")
                + (f"missing numbers {missing}; " if missing else "")
                + f"a candidate sets {CANDIDATE_OPTIONS} (None: the configured value) and records {CANDIDATE_RESULTS}. "
                "Fix: measure them with hf_spec.tune.measure_candidates (benchmarks/shape_candidates/)."
            )
        if candidate["tau"] < 1 or candidate["verified_nodes"] < 1:
            raise ValueError(f"tree_shape_candidates[{i}]: tau and verified_nodes are >= 1 (root included), got {candidate}.")
    return [dict(c) for c in candidates]


def candidate_options(candidate: dict) -> dict:
    """The ``generate()`` options of ``candidate`` that it sets (its None values left out)."""
    return {k: candidate[k] for k in CANDIDATE_OPTIONS if candidate.get(k) is not None}


@dataclass
class CostProfile:
    """This machine's costs for one (target, drafter, device, dtype, threads).

    ``verify_ms``: one target forward of ``n`` tree tokens + the LM head over them, by ``n``;
    ``cycle_ms``: per candidate (by index), drafting + loop time of one cycle outside the
    verification forward; ``key``: what the profile was measured for."""

    verify_ms: dict[int, float]
    cycle_ms: list[float]
    key: str

    def to_json(self) -> dict:
        return {"format": CACHE_FORMAT, **asdict(self), "verify_ms": {str(k): v for k, v in self.verify_ms.items()}}

    @classmethod
    def from_json(cls, data: dict) -> CostProfile:
        return cls(verify_ms={int(k): float(v) for k, v in data["verify_ms"].items()},
                   cycle_ms=[float(x) for x in data["cycle_ms"]], key=data["key"])  # fmt: skip


def non_decreasing(curve: dict[int, float]) -> dict[int, float]:
    """``curve`` with each cost raised to the highest cost of any smaller size: verifying more tree tokens never
    costs less, so a dip is timing noise, and left in it would make the larger tree look cheaper than it is."""
    out, highest = {}, float("-inf")
    for n, cost in sorted(curve.items()):
        highest = max(highest, float(cost))
        out[n] = highest
    return out


def interpolate_cost(curve: dict[int, float], n: float) -> float:
    """Cost at ``n`` from measured points ``{n_i: cost_i}``: piecewise linear, extended
    linearly past the last two points (never below the last measured cost) and flat before the first."""
    points = sorted(curve.items())
    if not points:
        raise ValueError("empty cost curve")
    if n <= points[0][0] or len(points) == 1:
        return float(points[0][1])
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if n <= x1:
            return float(y0 + (y1 - y0) * (n - x0) / (x1 - x0))
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return float(max(y1, y1 + (y1 - y0) * (n - x1) / (x1 - x0)))


def predict_ms_per_token(candidate: dict, verify_ms: dict[int, float], cycle_ms: float) -> float:
    """Predicted milliseconds per emitted token of ``candidate`` on a machine with these costs."""
    return (interpolate_cost(verify_ms, candidate["verified_nodes"]) + cycle_ms) / candidate["tau"]


def choose_candidate(candidates: list[dict], profile: CostProfile) -> int:
    """Index of the candidate with the lowest predicted time per token (the first on ties)."""
    if len(profile.cycle_ms) != len(candidates):
        raise ValueError(f"The cost profile has {len(profile.cycle_ms)} candidates' costs, the config {len(candidates)}.")
    costs = [predict_ms_per_token(c, profile.verify_ms, ms) for c, ms in zip(candidates, profile.cycle_ms)]
    return min(range(len(costs)), key=costs.__getitem__)


@dataclass
class ShapeChoice:
    """The candidate :func:`hf_spec.tune.select_shape` chose: its ``generate()`` ``options`` and the whole
    ``candidate`` (options, τ, verified nodes) with the ``predicted_ms_per_token`` on this machine;
    ``plain_ms_per_token``: this machine's one-token target step (verification of the root alone)."""

    options: dict
    candidate: dict
    predicted_ms_per_token: float
    plain_ms_per_token: float | None = None

    @property
    def plain_is_faster(self) -> bool:
        """Whether even the best candidate is predicted slower than plain decoding (e.g. bf16 emulated on a
        CPU, where verifying k tokens costs ~k steps): the loop then drafts nothing."""
        return self.plain_ms_per_token is not None and self.predicted_ms_per_token > self.plain_ms_per_token
