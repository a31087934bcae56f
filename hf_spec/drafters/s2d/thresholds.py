"""Choosing an S2D drafter's exit thresholds for a target (§4.4.1): :func:`search_thresholds` over
:func:`threshold_grid`."""

from __future__ import annotations

import itertools
import warnings

import torch
from transformers import PreTrainedModel

from ... import timing
from ...stats import GenerationStats
from .model import SortedDrafter


def threshold_grid(values, num_exits: int) -> list[list[float]]:
    """Every combination of ``values`` over the non-final exits (the last gets 0.0), without
    equivalent duplicates: exits after one with threshold <= 0 are never reached, so theirs are set to 0.0."""
    out = []
    for combo in itertools.product([float(v) for v in values], repeat=num_exits - 1):
        combo = list(combo) + [0.0]
        first = next(i for i, t in enumerate(combo) if t <= 0.0)
        combo = combo[: first + 1] + [0.0] * (num_exits - first - 1)
        if combo not in out:
            out.append(combo)
    return out


@torch.no_grad()
def search_thresholds(
    drafter: SortedDrafter,
    target: PreTrainedModel,
    prompts: list[torch.Tensor],
    candidates: list | None = None,
    max_new_tokens: int = 32,
    repeats: int = 2,
    record: bool = True,
    **generate_kwargs,
):
    """Pick ``target``'s thresholds on held-out ``prompts`` (greedy), as in §4.4.1, by measured speed.

    Each candidate (one threshold per exit) first runs one untimed warm-up ``generate()``. Then, in
    ``repeats`` rounds, every prompt runs every candidate, interleaved in a rotating order (round r, prompt
    p starts at candidate (r + p) mod n), so a drift of the machine's speed spreads over all candidates; each
    (candidate, prompt) keeps its best wall time of the rounds. A candidate's score, ``tokens_per_second``, is
    its new tokens over all prompts / the sum of those best times. Run it on a quiet machine, in the dtype you
    deploy.

    ``candidates`` default: every combination of (0.0, 0.6, 0.8, 0.95, 1.01) over the non-final
    exits, without duplicates (after a 0.0 the later thresholds are never reached). Returns
    ``(best_thresholds, results)``: results a list of dicts (``thresholds``, ``tokens_per_second``,
    ``new_tokens``, ``cycles``: verification cycles, ``tau``: accepted drafts per cycle + 1 over all
    prompts' cycles as :attr:`GenerationStats.tau <hf_spec.stats.GenerationStats.tau>`, ``exit_counts``),
    fastest first. ``record``: store the best in ``drafter.config.targets`` and make them active.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}.")
    if not prompts:
        raise ValueError("search_thresholds needs at least one prompt.")
    num_exits = len(drafter.config.exits)
    if candidates is None:
        grid = (0.0, 0.6, 0.8, 0.95, 1.01)
        candidates = threshold_grid(grid, num_exits)
    candidates = [list(c) for c in candidates]
    if not candidates:
        raise ValueError("search_thresholds needs at least one candidate.")
    if not drafter.is_bound_to(target):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            drafter.bind(target)

    def run(prompt, new_tokens):  # the drafter's current thresholds, every cycle (no speed controller)
        target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=new_tokens,
                        speed_controller=False, **generate_kwargs)  # fmt: skip

    n = len(candidates)
    best_seconds = [[float("inf")] * len(prompts) for _ in range(n)]
    best_stats = [[None] * len(prompts) for _ in range(n)]
    saved = list(drafter.thresholds)
    try:
        for thresholds in candidates:  # untimed: first-call allocations and kernel choices
            drafter.set_thresholds(thresholds)
            run(prompts[0], min(8, max_new_tokens))
        for r in range(repeats):
            for p, prompt in enumerate(prompts):
                for i in range(n):
                    c = (r + p + i) % n
                    drafter.set_thresholds(candidates[c])
                    start = timing.clock(drafter.device)
                    run(prompt, max_new_tokens)
                    seconds = timing.clock(drafter.device) - start
                    if seconds < best_seconds[c][p]:
                        best_seconds[c][p], best_stats[c][p] = seconds, drafter.last_generation_stats
    finally:
        drafter.thresholds = saved
    results = []
    for thresholds, seconds, stats in zip(candidates, best_seconds, best_stats):
        total = GenerationStats()  # the best calls' counters over all prompts
        for row in stats:
            total.add_row(row)
        results.append(dict(thresholds=thresholds, tokens_per_second=total.new_tokens / max(sum(seconds), 1e-9),
                            new_tokens=total.new_tokens, cycles=total.cycles, tau=total.tau,
                            exit_counts=list(total.early_exits.exit_counts)))  # fmt: skip
    results.sort(key=lambda res: -res["tokens_per_second"])
    best = results[0]["thresholds"]
    if record:
        drafter.config.set_target_thresholds(target.config, best)
        drafter.set_thresholds(best)
    return best, results
