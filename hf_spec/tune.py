"""``hf-spec tune``: pick the draft-tree shape (depth, top_k, total_tokens) that maximises
tokens/s of a dynamic-tree drafter (EAGLE / HASS / CORAL) on *this* machine, by measurement.

Held-aside prompts: tuning uses the bench prompts (MT-bench, HumanEval, GSM8K) after skipping
the first ``skip`` of each set (default 3, the prompts the official benchmark runs), so the
shape is never tuned on the benchmark's own prompts.

What is measured:

1. Verification cost ``t(n)``: one target forward of ``n`` tree tokens (tree mask, tree
   positions) on a cached ~256-token prefix followed by the target LM head over all ``n`` rows
   (verification computes every node's logits in one matmul), median of repeats, for a grid of ``n``
   (:func:`hf_spec.verify_cost.measure_verify_cost`).
2. Acceptance, exactly, for every candidate shape at once. Greedy decoding is lossless, so the
   target's tokens do not depend on the shape: one plain greedy generation per prompt gives them,
   and one target forward their features. A drafting session of the largest depth per ``top_k``
   then proposes, at every position, the tree a cycle rooted there would draft. A tree of depth
   ``d`` keeping ``T`` tokens is the best-``T`` re-ranking of the first ``d`` levels of that tree
   (growth is level by level and does not look ahead), so the accepted length of every
   ``(d, top_k, T)`` at every position follows; replaying the cycles (root, accept ``a``, next
   root ``a + 1`` later) gives each shape's accepted lengths and τ.
3. Drafting cost per cycle, linear in depth: the timed ``propose`` of a depth-1 session and of the
   largest-depth session for each ``top_k``.
4. Loop overhead per cycle, from one real generation with the drafter's configured shape.

Predicted ms per cycle = t(T + 1) + draft(d, top_k) + overhead; predicted tokens/s
= τ / that. The best few predicted shapes (and the configured one) are then run for real,
interleaved, and the best *measured* tokens/s wins. Only the timings are machine-specific; the
dtype matters too (bf16 verification is nearly flat in ``n`` on AVX512-bf16 CPUs, fp32 is not).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from .hub.cards import refresh_model_card
from .shape_select import CANDIDATE_OPTIONS, check_candidates, interpolate_cost
from .timing import timed
from .tree.dynamic import TreeShape
from .verify_cost import measure_verify_cost


__all__ = [
    "TuneGrid",
    "QUICK_GRID",
    "candidate_shapes",
    "draft_cost_ms",
    "path_ranks",
    "AcceptanceData",
    "replay_cycles",
    "predict",
    "measure_acceptance",
    "measure_generation",
    "tune",
    "format_table",
    "write_tree_shape",
    "measure_candidates",
    "write_shape_candidates",
]

MAX_VERIFY_TOKENS = 64
"""Largest ``total_tokens`` considered by default (a verify forward of 65 tokens)."""


@dataclass
class TuneGrid:
    """Candidate values; shapes are their pruned product (see :func:`candidate_shapes`)."""

    depths: Sequence[int] = (2, 3, 4, 5, 6, 7)
    top_ks: Sequence[int] = (1, 2, 3, 4, 6, 8)
    totals: Sequence[int] = (2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64)
    verify_sizes: Sequence[int] = (1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64)
    verify_repeats: int = 7
    confirm: int = 3
    """How many best-predicted shapes are confirmed by a real, timed generation."""
    confirm_repeats: int = 2


QUICK_GRID = TuneGrid(depths=(2, 3, 4), top_ks=(1, 2, 4), totals=(2, 3, 4, 6, 8, 16), verify_sizes=(1, 4, 8, 16),
                      verify_repeats=3, confirm=2, confirm_repeats=1)  # fmt: skip
"""A small grid for smoke tests (``hf-spec tune --quick``)."""


# -- pure logic (tested with injected numbers) ---------------------------------------------------
def candidate_shapes(depths, top_ks, totals, max_total: int = MAX_VERIFY_TOKENS) -> list[TreeShape]:
    """The sensible shapes of the grid: ``depth <= total_tokens <= min(max_total, nodes the
    growth creates)``. A chain (``top_k=1``) has exactly ``depth`` nodes, so it gets ``total = depth``
    whether or not that value is in ``totals``."""
    shapes = []
    for k in sorted(set(top_ks)):
        for d in sorted(set(depths)):
            grown = TreeShape(d, k, 1).max_nodes - 1
            values = {d} if k == 1 else {t for t in totals if d <= t <= min(max_total, grown)}
            shapes.extend(TreeShape(d, k, t) for t in sorted(values) if t <= max_total)
    return shapes


def draft_cost_ms(depth: int, depth1_ms: float, deepest_ms: float, deepest: int) -> float:
    """Drafting time of one cycle at ``depth``: linear between the measured depth-1 cost and the
    cost at the deepest measured depth (each extra level is one drafter forward of top_k rows)."""
    if deepest <= 1:
        return depth1_ms
    return depth1_ms + (depth - 1) * (deepest_ms - depth1_ms) / (deepest - 1)


def path_ranks(tokens, parents, depths, scores, truth, max_depth: int) -> list[list[int]]:
    """Where the correct path of a grown tree falls in each smaller tree.

    ``tokens/parents/depths/scores``: the grown tree (root = node 0); ``truth``: the tokens that
    follow the root. Returns ``ranks`` with ``ranks[d - 1]`` = for the correct nodes at depths
    1..d, their rank (0-based) in the re-ranking of all nodes of depth <= d (score descending,
    ties by node index, as :mod:`hf_spec.tree.dynamic` keeps them). Kept sets are closed under
    ancestors, so a tree keeping ``T`` tokens accepts ``sum(r < T for r in ranks[d - 1])`` drafts.
    """
    tokens, parents = [int(x) for x in tokens], [int(x) for x in parents]
    path, node = [], 0
    for want in truth[:max_depth]:
        child = next((i for i in range(1, len(tokens)) if parents[i] == node and tokens[i] == int(want)), None)
        if child is None:
            break
        path.append(child)
        node = child
    depths_t = torch.as_tensor(depths, dtype=torch.long)
    scores_t = torch.as_tensor(scores, dtype=torch.float64)
    finite = torch.isfinite(scores_t)
    finite[0] = False  # the root is always kept and not counted
    nodes = finite.nonzero().view(-1)
    order = nodes[torch.sort(-scores_t[nodes], stable=True).indices]  # ties: lower index first
    ranks = []
    for d in range(1, max_depth + 1):
        inside = depths_t[order] <= d
        rank_of = torch.full((len(tokens),), math.inf, dtype=torch.float64)
        rank_of[order[inside]] = torch.arange(int(inside.sum()), dtype=torch.float64)
        ranks.append([int(rank_of[j]) if math.isfinite(rank_of[j]) else 10**9 for j in path if depths[j] <= d])
    return ranks


def replay_cycles(accepted_at: Callable[[int], int], start: int, end: int) -> list[int]:
    """Accepted drafts per cycle when cycles root at ``start`` and each accepts ``accepted_at(root)``
    drafts (emitting that + 1 tokens), until the root reaches ``end`` (the last position whose
    successor is still to be generated)."""
    lengths, root = [], start
    while root < end:
        a = accepted_at(root)
        lengths.append(a)
        root += a + 1
    return lengths


def predict(shape: TreeShape, tau: float, verify_ms: dict[int, float], draft_ms: float, overhead_ms: float) -> dict:
    """Predicted cost of one cycle of ``shape`` and the tokens/s it gives."""
    verify = interpolate_cost(verify_ms, shape.total_tokens + 1)
    ms = verify + draft_ms + overhead_ms
    return {"verify_ms": verify, "draft_ms": draft_ms, "overhead_ms": overhead_ms,
            "ms_per_cycle": ms, "tokens_per_s": 1000.0 * tau / ms if ms > 0 else float("inf")}  # fmt: skip


def shape_key(shape: TreeShape) -> str:
    return f"d{shape.depth}/k{shape.top_k}/t{shape.total_tokens}"


# -- measurements (need models) ------------------------------------------------------------------
@dataclass
class AcceptanceData:
    """Per top_k and prompt: the correct path's ranks at every root position (see :func:`path_ranks`)."""

    max_depth: int
    ranks: dict[int, list[dict[int, list[list[int]]]]] = field(default_factory=dict)
    spans: list[tuple[int, int]] = field(default_factory=list)
    depth1_ms: list[float] = field(default_factory=list)
    deepest_ms: dict[int, list[float]] = field(default_factory=dict)

    def accepted_lengths(self, shape: TreeShape) -> list[int]:
        """Accepted drafts per cycle of ``shape`` over every prompt, replayed."""
        lengths = []
        for prompt, (start, end) in enumerate(self.spans):
            table = self.ranks[shape.top_k][prompt]

            def accepted_at(root: int) -> int:
                return sum(r < shape.total_tokens for r in table[root][shape.depth - 1])

            lengths += replay_cycles(accepted_at, start, end)
        return lengths


def _dynamic_session(drafter, model, shape: TreeShape, prompt_ids):
    from .drafters.eagle.session import EagleDraftingSession
    from .decoding import new_session

    session = new_session(drafter, model, shape, False, 1.0, prompt_ids, None, ngram_nodes=0)  # the drafter's own trees
    if type(session) is not EagleDraftingSession:
        raise ValueError(
            f"hf-spec tune tunes dynamic draft trees (EAGLE / HASS / CORAL drafters); {type(drafter).__name__} drafts "
            "a fixed tree or chain. Fix: compare its shapes with `hf-spec bench --tree-depth/--tree-top-k/--tree-total-tokens`."
        )
    return session


@torch.inference_mode()
def measure_acceptance(model, drafter, prompts: Sequence[torch.Tensor], max_new_tokens: int, depths, top_ks,
                       progress: Callable[[str], None] | None = None) -> AcceptanceData:  # fmt: skip
    """Grow the deepest tree of each ``top_k`` at every position of each prompt's greedy output
    and record where the correct path ranks (module docstring, step 2); time the drafting."""
    device = model.device
    deepest = max(depths)
    data = AcceptanceData(max_depth=deepest, ranks={k: [] for k in top_ks}, deepest_ms={k: [] for k in top_ks})
    if not drafter.is_bound_to(model):
        drafter.bind(model)
    for i, prompt in enumerate(prompts):
        prompt = prompt.to(device)
        length = prompt.shape[1]
        # Plain greedy (no assistant: transformers' own loop): the tokens every shape reproduces.
        sequence = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                  max_new_tokens=max_new_tokens + deepest)  # fmt: skip
        generated = min(max_new_tokens, sequence.shape[1] - length)
        data.spans.append((length, length + generated - 1))
        features = model.base_model(input_ids=sequence).last_hidden_state[0]
        ids = sequence[0]
        tokens = ids.tolist()
        roots = range(length, length + generated - 1)

        def commits(root):  # the pairs a cycle ending at ``root`` commits (one per new position)
            if root == length:
                return features[:length], ids[1 : length + 1]
            return features[root - 1 : root], ids[root : root + 1]

        shallow = _dynamic_session(drafter, model, TreeShape(1, max(top_ks), max(top_ks)), prompt)
        for root in roots:
            tree, ms = timed(lambda: shallow.propose(*commits(root)), device)
            if root > length:
                data.depth1_ms.append(ms)
        for k in top_ks:
            full = TreeShape(deepest, k, 1)
            full.total_tokens = full.max_nodes - 1
            session = _dynamic_session(drafter, model, full, prompt)
            table = {}
            for root in roots:
                tree, ms = timed(lambda: session.propose(*commits(root)), device)
                if root > length:
                    data.deepest_ms[k].append(ms)
                table[root] = path_ranks(tree.tokens.tolist(), tree.parents.tolist(), tree.depths.tolist(),
                                         tree.scores.tolist(), tokens[root + 1 :], deepest)  # fmt: skip
            data.ranks[k].append(table)
        if progress:
            progress(f"acceptance: prompt {i + 1}/{len(prompts)} ({generated} tokens)")
    return data


@torch.inference_mode()
def measure_generation(model, drafter, prompts: Sequence[torch.Tensor], shape: TreeShape, max_new_tokens: int) -> dict:
    """Real greedy speculative generation of every prompt with ``shape``: wall time, tokens, cycles."""
    device = model.device
    seconds, tokens, lengths = 0.0, 0, []
    for prompt in prompts:
        prompt = prompt.to(device)
        out, ms = timed(lambda: model.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=drafter,
                                                max_new_tokens=max_new_tokens, do_sample=False, tree_depth=shape.depth,
                                                tree_top_k=shape.top_k, tree_total_tokens=shape.total_tokens), device)  # fmt: skip
        seconds += ms / 1000.0
        tokens += out.shape[1] - prompt.shape[1]
        lengths += list(drafter.last_generation_stats.accepted_lengths)
    cycles = len(lengths)
    return {"seconds": seconds, "new_tokens": tokens, "cycles": cycles, "accepted_lengths": lengths,
            "tau": sum(lengths) / cycles + 1 if cycles else float("nan"),
            "ms_per_cycle": 1000.0 * seconds / cycles if cycles else float("nan"),
            "tokens_per_s": tokens / seconds if seconds else float("nan")}  # fmt: skip


def tune(model, drafter, prompts: Sequence[torch.Tensor], max_new_tokens: int = 64, grid: TuneGrid = TuneGrid(),
         progress: Callable[[str], None] | None = print) -> dict:  # fmt: skip
    """Measure, predict, confirm; returns the report (``best`` = the winning shape's row)."""
    say = progress or (lambda _msg: None)
    shapes = candidate_shapes(grid.depths, grid.top_ks, grid.totals)
    if not shapes:
        raise ValueError("The tuning grid has no shape with depth <= total_tokens <= 64. Fix: widen --depths/--totals.")
    current = drafter.tree_shape()
    if shape_key(current) not in {shape_key(s) for s in shapes}:
        shapes.append(current)  # the configured shape is always a candidate and the reference
    say(f"verification cost: {len(grid.verify_sizes)} sizes x {grid.verify_repeats} repeats")
    verify_ms = measure_verify_cost(model, grid.verify_sizes, repeats=grid.verify_repeats)
    top_ks = sorted({s.top_k for s in shapes})
    acceptance = measure_acceptance(model, drafter, prompts, max_new_tokens, [s.depth for s in shapes], top_ks, say)
    depth1_ms = statistics.median(acceptance.depth1_ms) if acceptance.depth1_ms else 0.0
    deepest_ms = {k: statistics.median(v) if v else depth1_ms for k, v in acceptance.deepest_ms.items()}

    def draft_ms(shape: TreeShape) -> float:
        k = shape.top_k if shape.top_k in deepest_ms else max(deepest_ms)
        return draft_cost_ms(shape.depth, depth1_ms, deepest_ms[k], acceptance.max_depth)

    say(f"calibrating loop overhead with the configured shape {shape_key(current)}")
    measure_generation(model, drafter, prompts[:1], current, 16)  # warm-up
    calibration = measure_generation(model, drafter, prompts, current, max_new_tokens)
    base = predict(current, calibration["tau"], verify_ms, draft_ms(current), 0.0)
    overhead_ms = max(0.0, calibration["ms_per_cycle"] - base["ms_per_cycle"])

    rows = []
    for shape in shapes:
        lengths = acceptance.accepted_lengths(shape)
        tau = sum(lengths) / len(lengths) + 1 if lengths else 1.0
        rows.append({"shape": asdict(shape), "key": shape_key(shape), "tau": tau, "cycles": len(lengths),
                     "predicted": predict(shape, tau, verify_ms, draft_ms(shape), overhead_ms)})  # fmt: skip
    rows.sort(key=lambda r: -r["predicted"]["tokens_per_s"])
    to_confirm = [TreeShape(**r["shape"]) for r in rows[: grid.confirm]]
    if shape_key(current) not in {shape_key(s) for s in to_confirm}:
        to_confirm.append(current)
    say(f"confirming {', '.join(shape_key(s) for s in to_confirm)} ({grid.confirm_repeats} interleaved rounds)")
    runs: dict[str, list[dict]] = {shape_key(s): [] for s in to_confirm}
    for r in range(grid.confirm_repeats):
        order = to_confirm[r % len(to_confirm) :] + to_confirm[: r % len(to_confirm)]
        for shape in order:
            runs[shape_key(shape)].append(measure_generation(model, drafter, prompts, shape, max_new_tokens))
    measured = {}
    for key, results in runs.items():
        seconds = sum(x["seconds"] for x in results)
        cycles = sum(x["cycles"] for x in results)
        tokens = sum(x["new_tokens"] for x in results)
        accepted = sum(sum(x["accepted_lengths"]) for x in results)
        measured[key] = {"tokens_per_s": tokens / seconds, "ms_per_cycle": 1000.0 * seconds / cycles,
                         "tau": accepted / cycles + 1, "rounds_tokens_per_s": [x["tokens_per_s"] for x in results]}  # fmt: skip
    by_key = {r["key"]: r for r in rows}
    for key, m in measured.items():
        by_key[key]["measured"] = m
    best_key = max(measured, key=lambda k: measured[k]["tokens_per_s"])
    return {
        "verify_ms": {str(n): v for n, v in verify_ms.items()},
        "draft_ms": {"depth1": depth1_ms, "deepest": {str(k): v for k, v in deepest_ms.items()},
                     "deepest_depth": acceptance.max_depth},  # fmt: skip
        "overhead_ms_per_cycle": overhead_ms,
        "calibration": {"shape": asdict(current), **{k: v for k, v in calibration.items() if k != "accepted_lengths"}},
        "configured": asdict(current),
        "grid": asdict(grid),
        "rows": rows,
        "best": by_key[best_key],
    }


def format_table(report: dict, limit: int = 15) -> str:
    """Markdown table: measured shapes first, then the best predicted."""
    rows = sorted(report["rows"], key=lambda r: (r.get("measured") is None,
                                                 -(r.get("measured") or r["predicted"])["tokens_per_s"]))  # fmt: skip
    lines = ["| shape (depth/top_k/total) | τ predicted | τ measured | ms/cycle predicted | ms/cycle measured "
             "| tokens/s predicted | tokens/s measured |", "|---|---|---|---|---|---|---|"]  # fmt: skip

    def f(x, spec=".2f"):
        return "" if x is None else format(x, spec)

    for r in rows[:limit]:
        p, m = r.get("predicted") or {}, r.get("measured") or {}
        mark = " **best**" if r["key"] == report["best"]["key"] else ""
        mark += " (configured)" if r["shape"] == report["configured"] else ""
        lines.append(f"| {r['key']}{mark} | {f(r['tau'])} | {f(m.get('tau'))} | {f(p.get('ms_per_cycle'), '.1f')} "
                     f"| {f(m.get('ms_per_cycle'), '.1f')} | {f(p.get('tokens_per_s'), '.1f')} | {f(m.get('tokens_per_s'), '.1f')} |")  # fmt: skip
    return "\n".join(lines)


def write_tree_shape(drafter_dir, shape: TreeShape, tuned_for: dict) -> Path:
    """Store ``shape`` as the default tree of the drafter saved in ``drafter_dir`` (config.json, and
    generation_config.json when there is one) with ``tree_tuned_for`` provenance; an hf-spec card there is
    re-rendered (:func:`hf_spec.hub.cards.refresh_model_card`)."""
    directory = Path(drafter_dir)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found. Fix: pass --drafter a local directory saved with save_pretrained.")
    # a tuned shape is this machine's choice: the online controller's choice among shape candidates is switched off
    values = {"tree_depth": shape.depth, "tree_top_k": shape.top_k, "tree_total_tokens": shape.total_tokens,
              "auto_tree_shape": False}
    for path, extra in ((config_path, {"tree_tuned_for": tuned_for}), (directory / "generation_config.json", {})):
        if path.is_file():
            data = json.loads(path.read_text())
            data.update(values, **extra)
            path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    refresh_model_card(directory)
    return config_path


def now_utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def default_output(drafter_path: str) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return os.path.join("results", f"tune-{Path(drafter_path).name}-{stamp}.json")


# -- shape candidates (hf_spec.shape_select): the rungs the online controller chooses among ------
@torch.inference_mode()
def measure_candidates(model, drafter, prompts: Sequence[torch.Tensor], candidates: Sequence[dict],
                       max_new_tokens: int = 128, progress: Callable[[str], None] | None = None) -> list[dict]:  # fmt: skip
    """τ and mean verified nodes per cycle of each candidate (a dict of :data:`CANDIDATE_OPTIONS`),
    from real greedy generations of ``prompts``, candidates interleaved per prompt.

    Greedy decoding emits the target's tokens whatever the tree (in bf16 near-ties can round differently, a ±0.05
    noise on τ), but with ``ngram_cost_gate`` the drafter runs only on the cycles where this process's measured
    drafting time says it pays, so measure on a quiet machine. They are the priors the online controller
    (:mod:`hf_spec.controller`) starts from before it measures each candidate on this machine."""
    if not drafter.is_bound_to(model):
        drafter.bind(model)
    for candidate in candidates:
        unknown = set(candidate) - set(CANDIDATE_OPTIONS)
        if unknown:
            raise ValueError(f"Unknown shape candidate keys {sorted(unknown)}; a candidate sets {CANDIDATE_OPTIONS}.")
    totals = [{"accepted": 0, "cycles": 0, "nodes": 0} for _ in candidates]
    for i, prompt in enumerate(prompts):
        prompt = prompt.to(model.device)
        for candidate, total in zip(candidates, totals):
            kwargs = {k: v for k, v in candidate.items() if v is not None}
            model.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=drafter, do_sample=False,
                           max_new_tokens=max_new_tokens, **kwargs)  # fmt: skip
            stats = drafter.last_generation_stats
            total["accepted"] += sum(stats.accepted_lengths)
            total["cycles"] += stats.cycles
            total["nodes"] += sum(stats.tree_sizes)
        if progress:
            progress(f"candidates: prompt {i + 1}/{len(prompts)}")
    rows = []
    for candidate, total in zip(candidates, totals):
        cycles = max(total["cycles"], 1)
        rows.append({**{k: candidate.get(k) for k in CANDIDATE_OPTIONS},
                     "tau": round(1.0 + total["accepted"] / cycles, 4),
                     "verified_nodes": round(total["nodes"] / cycles, 3)})  # fmt: skip
    return rows


def write_shape_candidates(drafter_dir, candidates: Sequence[dict], provenance: dict) -> Path:
    """Store ``candidates`` (rows of :func:`measure_candidates`) as the ``tree_shape_candidates`` of
    the drafter saved in ``drafter_dir`` and switch the run-time choice among them on (``auto_tree_shape``
    None); ``provenance`` (prompts, command, date) goes to ``tree_shape_candidates_measured``. An hf-spec card
    there is re-rendered (:func:`hf_spec.hub.cards.refresh_model_card`)."""
    config_path = Path(drafter_dir) / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found. Fix: pass a local directory saved with save_pretrained.")
    rows = check_candidates(list(candidates))
    data = json.loads(config_path.read_text())
    data.update(tree_shape_candidates=rows, auto_tree_shape=None, tree_shape_candidates_measured=provenance)
    config_path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    refresh_model_card(drafter_dir)
    return config_path
