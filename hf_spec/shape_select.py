"""Shape candidates: the draft trees a drafter's config offers for the run-time choice.

The best tree depends on the machine as much as on the drafter: what one verification of ``n``
tree tokens costs relative to one decoding step (flat to ``n`` = 32 on a GPU or a CPU with AMX,
close to ``n`` steps in float32 on a CPU) and what each drafting level costs. So a drafter's config
may carry **shape candidates** (``tree_shape_candidates``): the ``generate()`` options of a few trees
(``tree_depth``, ``tree_top_k``, ``tree_total_tokens``, ``tree_min_prob``, ``ngram_nodes``; None keeps
the configured value), each with what it achieved on held-aside prompts: ``tau`` (tokens per target
forward) and ``verified_nodes`` (tree nodes verified per cycle, root included).

The candidates are the rungs the online speed controller (:mod:`hf_spec.controller`) chooses among at
run time, from this process's own measured cycles; their ``tau`` and ``verified_nodes`` are priors only,
never a decision. ``hf_spec.tune.measure_candidates`` measures them offline
(``training_scripts/measure_shape_candidates.py``) and ``hf_spec.tune.write_shape_candidates`` stores them in a config.

This module is pure (no models, nothing else of hf_spec), so a drafter config can validate its
candidates, and the controller read them, without importing any measurement code. It also holds the
two helpers every cost curve ``{tree tokens: cost}`` is read with (:func:`non_decreasing`,
:func:`interpolate_cost`).
"""

from __future__ import annotations

import warnings

__all__ = [
    "CANDIDATE_OPTIONS",
    "CANDIDATE_RESULTS",
    "RENAMED_OPTIONS",
    "candidate_options",
    "check_candidates",
    "interpolate_cost",
    "non_decreasing",
    "renamed_options",
]

CANDIDATE_OPTIONS = ("tree_depth", "tree_top_k", "tree_total_tokens", "tree_min_prob", "ngram_nodes")
"""The ``generate()`` options a candidate sets."""
CANDIDATE_RESULTS = ("tau", "verified_nodes")
"""What a candidate achieved on held-aside prompts (machine-independent; a prior for the controller)."""
RENAMED_OPTIONS = {"ngram_branches": "ngram_nodes"}
"""Old option name -> its name now. ``ngram_branches`` counted the n-gram trie *nodes* grafted into each tree, not
branches. Shipped configs and earlier calls use the old name: it is still read (:func:`renamed_options`), with a
FutureWarning."""


def renamed_options(options: dict, where: str) -> dict:
    """``options`` with each old name of :data:`RENAMED_OPTIONS` that it sets (not None) under its new name, and a
    FutureWarning naming ``where``; a ValueError when both names are set to different values."""
    out = dict(options)
    for old, new in RENAMED_OPTIONS.items():
        value = out.pop(old, None)
        if value is None:
            continue
        if out.get(new) is not None and out[new] != value:
            raise ValueError(f"{where}: {old}={value!r} and {new}={out[new]!r} name one option. Fix: pass {new} only.")
        warnings.warn(f"{where}: `{old}` is now `{new}` (it counts the n-gram trie nodes grafted into each tree); "
                      f"the old name will stop working in a future release. Fix: write `{new}`.", FutureWarning, stacklevel=3)
        out[new] = value
    return out


def check_candidates(candidates) -> list[dict]:
    """Validate ``tree_shape_candidates``: a list of dicts with the options and results above.
    Raises ValueError naming the problem and the fix."""
    if candidates is None:
        return []
    if not isinstance(candidates, (list, tuple)):
        raise ValueError(f"tree_shape_candidates must be a list of dicts, got {type(candidates).__name__}.")
    allowed = set(CANDIDATE_OPTIONS) | set(CANDIDATE_RESULTS)
    candidates = list(candidates)
    for i, candidate in enumerate(candidates):
        if not isinstance(candidate, dict):
            raise ValueError(f"tree_shape_candidates[{i}] must be a dict, got {type(candidate).__name__}.")
        candidate = candidates[i] = renamed_options(candidate, f"tree_shape_candidates[{i}]")
        unknown = set(candidate) - allowed
        missing = [k for k in CANDIDATE_RESULTS if not isinstance(candidate.get(k), (int, float))]
        if unknown or missing:
            raise ValueError(
                f"tree_shape_candidates[{i}] = {candidate}: "
                + (f"unknown keys {sorted(unknown)}; " if unknown else "")
                + (f"missing numbers {missing}; " if missing else "")
                + f"a candidate sets {CANDIDATE_OPTIONS} (None: the configured value) and records {CANDIDATE_RESULTS}. "
                "Fix: measure them with training_scripts/measure_shape_candidates.py (hf_spec.tune.measure_candidates)."
            )
        if candidate["tau"] < 1 or candidate["verified_nodes"] < 1:
            raise ValueError(f"tree_shape_candidates[{i}]: tau and verified_nodes are >= 1 (root included), got {candidate}.")
    return [dict(c) for c in candidates]


def candidate_options(candidate: dict) -> dict:
    """The ``generate()`` options of ``candidate`` that it sets (its None values left out)."""
    return {k: candidate[k] for k in CANDIDATE_OPTIONS if candidate.get(k) is not None}


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
