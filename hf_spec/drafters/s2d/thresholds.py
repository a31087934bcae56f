"""Choosing an S2D drafter's exit thresholds for a target (§4.4.1): :func:`search_thresholds` over
:func:`threshold_grid`."""

from __future__ import annotations

import itertools
import warnings

import torch
from transformers import PreTrainedModel

from ... import timing
from .model import SortedDrafter


def _param_count(module) -> int:
    return sum(p.numel() for p in module.parameters())


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
    metric: str = "proxy",
    max_new_tokens: int = 32,
    record: bool = True,
    **generate_kwargs,
):
    """Pick ``target``'s thresholds on held-out ``prompts`` (greedy), as in §4.4.1.

    Each candidate (one threshold per exit) is scored over all prompts by:

    - ``"tokens_per_second"``: measured new tokens / wall seconds of ``generate()`` (use on a
      quiet machine, in the dtype you deploy);
    - ``"proxy"`` (default, deterministic): new tokens per target-forward-equivalent, i.e.
      τ / cost, with cost = target forwards + drafter work counted in weights read: each layer
      call costs one drafter layer's parameters and each exit tried one LM head, relative to
      the target's non-embedding parameters.

    ``candidates`` default: every combination of (0.0, 0.6, 0.8, 0.95, 1.01) over the non-final
    exits, without duplicates (after a 0.0 the later thresholds are never reached). Returns ``(best_thresholds, results)``, results a list of dicts sorted best first.
    ``record``: store the best in ``drafter.config.targets`` and make them active.
    """
    if metric not in ("proxy", "tokens_per_second"):
        raise ValueError(f"metric must be 'proxy' or 'tokens_per_second', got {metric!r}.")
    num_exits = len(drafter.config.exits)
    if candidates is None:
        grid = (0.0, 0.6, 0.8, 0.95, 1.01)
        candidates = threshold_grid(grid, num_exits)
    if not drafter.is_bound_to(target):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            drafter.bind(target)
    layer_cost = _param_count(drafter.layers[0])
    head_cost = drafter.draft_head().weight.numel() if drafter.has_draft_vocab else drafter.lm_head.weight.numel()
    if drafter.exit_maps is not None:  # an exit tried also runs its adapter (the last has none: a small overcount)
        head_cost += drafter.exit_maps[0].weight.numel()
    target_cost = _param_count(target) - target.get_input_embeddings().weight.numel()
    if getattr(target.config.get_text_config(), "tie_word_embeddings", False):
        target_cost += target.get_input_embeddings().weight.numel()  # the tied head is still read
    results = []
    saved = list(drafter.thresholds)
    try:
        for thresholds in candidates:
            drafter.set_thresholds(thresholds)
            tokens = cycles = 0
            drafter_cost = 0.0
            seconds = 0.0
            counts = [0] * num_exits
            for prompt in prompts:
                start = timing.clock(drafter.device)
                target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=max_new_tokens,
                                speed_controller=False, **generate_kwargs)  # these thresholds, every cycle
                seconds += timing.clock(drafter.device) - start
                stats = drafter.last_generation_stats
                exits = stats.early_exits
                tokens += stats.new_tokens
                cycles += stats.cycles + 1  # + the prefill
                drafter_cost += exits.layer_calls * layer_cost + exits.head_calls * head_cost
                counts = [a + b for a, b in zip(counts, exits.exit_counts)]
            proxy = tokens / (cycles + drafter_cost / target_cost)
            results.append(dict(thresholds=list(thresholds), proxy=proxy, tokens_per_second=tokens / max(seconds, 1e-9),
                                new_tokens=tokens, cycles=cycles, exit_counts=counts))  # fmt: skip
    finally:
        drafter.thresholds = saved
    results.sort(key=lambda r: -r[metric])
    best = results[0]["thresholds"]
    if record:
        drafter.config.set_target_thresholds(target.config, best)
        drafter.set_thresholds(best)
    return best, results

