"""Compare trained drafters the way their papers do (issue 43, item 7): one results.json and one markdown table.

For each drafter folder (EAGLE, HASS, CORAL, EAGLE-3, ParallelSpec, ideally trained on the same data and budget):

- **teacher-forced top-1 at steps 1..4** on a held-out self-distilled feature cache (``--tf-cache``; make one with
  ``python -m hf_spec.training.distill ... --skip_conversations K`` so it holds conversations no drafter trained
  on). EAGLE-family drafters run as HASS's alignment does (:func:`hf_spec.training.losses.hass_loss`): step 1 on
  the target's features, step s on the drafter's own step s-1 features. EAGLE-3 reads the inputs of its fused
  target layers: the cache must hold them, or its extended copy must lie beside it
  (:func:`hf_spec.training.data.layer_cache_dir`, what ``train_eagle3.py`` writes), else its row says why it has
  no numbers. ParallelSpec reports its per-depth top-1 instead (depth s-1: the s-th token, one forward,
  :func:`hf_spec.training.parallelspec.parallel_depth_accuracy`).
- **τ** (tokens per target forward) with greedy decoding at each paper's own tree (EAGLE family: EAGLE-2's dynamic
  tree, depth 6, top-k 10, 60 nodes; ParallelSpec: the paper's static widths (4, 2, 2, 1, 1), 60 nodes) and at a
  depth-5 chain, per prompt set (MT-bench, HumanEval, GSM8K; prompts ``--skip``.. of each set, by default 40..,
  which neither the benchmarks (0..~25), the shape-candidate measurement (33..37) nor the fresh-machine prompts
  use). Context n-gram nodes, the confidence floor and the speed controller are off; a CORAL drafter with an
  LM-head router gets two rows, ``coral`` through its full head (CSRA only: the drafter CORAL's Table 1 compares
  with HASS, and the paper's setting for small vocabularies) and ``coral+router`` through its router; every output
  is checked against plain greedy ``generate()``. τ does not depend on the
  machine: this is the paper comparison.
- **drafting ms and verified nodes per cycle** (``drafter.last_generation_stats``); the ms depend on the machine.

Each paper's claim is then marked holds / does not hold with the numbers behind it (:data:`CLAIMS`).

    python training_scripts/compare_papers.py \\
        --drafters runs/eagle runs/hass runs/coral runs/eagle3 runs/parallelspec --target smollm2-135m-instruct \\
        --prompts-per-set 10 --max-new-tokens 128 \\
        --tf-cache runs/features/smollm2-sharegpt-heldout --dtype float32 --output-dir benchmarks/papers

``--cards`` then writes each compared folder's row, the comparison's other rows and the claims its method takes
part in into its model card (``training_info["paper_comparison"]``, :mod:`hf_spec.hub.cards`); ``--cards-from
RESULTS.json`` does only that, from an earlier run:

    python training_scripts/compare_papers.py --cards-from benchmarks/papers/ten_epochs/results.json \
        --table benchmarks/papers/README.md

S2D is not compared here: it drafts with a standalone model cut from another source; its adaptive and fixed
exits are compared by ``training_scripts/search_s2d_thresholds.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shlex
import sys
import time
from pathlib import Path

import torch

import hf_spec
from hf_spec.bench.datasets import BENCH_DATASETS, render_prompt
from hf_spec.drafters.parallelspec.config import DEFAULT_TREE_WIDTHS
from hf_spec.hardware import dtype_name, machine_info, resolve_dtype
from hf_spec.hub.cards import PAPER_COMPARISON, refresh_model_card
from hf_spec.training.collators import FeatureCollator
from hf_spec.training.data import AUX_COLUMN, layer_cache_dir, load_feature_cache, load_target
from hf_spec.training.losses import hass_loss, shift_for_drafter
from hf_spec.training.parallelspec import build_parallel_layout, group_anchors, parallel_depth_accuracy
from hf_spec.tree.static import static_tree_size

TF_STEPS = 4
EAGLE2_TREE = dict(tree_depth=6, tree_top_k=10, tree_total_tokens=60)
"""EAGLE-2's dynamic tree, the tree HASS, CORAL and EAGLE-3 report τ at."""
CHAIN_DEPTH = 5
CORAL_ROUTER = "coral+router"
"""The row of a CORAL drafter drafting through its LM-head router; its ``coral`` row drafts through the full head
(CSRA only), the setting CORAL's Table 1 compares with HASS and the one the paper uses for small vocabularies."""
SHAPES = ("tree", "chain")
"""``tree``: the paper's own tree; ``chain``: a depth-5 chain (one candidate per depth)."""


# ---------------------------------------------------------------------------------------------
# teacher-forced top-1
# ---------------------------------------------------------------------------------------------
def _batches(dataset, collate: FeatureCollator, batch_size: int):
    rows = dataset.with_format("numpy")
    for start in range(0, len(rows), batch_size):
        yield collate([rows[i] for i in range(start, min(start + batch_size, len(rows)))])


def _eagle3_cache(path: str, layer_ids):
    """(dataset, storage, its path) of the cache at ``path`` or of its extended copy beside it, whichever holds the
    inputs of target layers ``layer_ids``; None when neither does."""
    for candidate in (path, layer_cache_dir(path, layer_ids)):
        with contextlib.suppress(ValueError, FileNotFoundError):
            return (*load_feature_cache(candidate, layer_ids), candidate)
    return None


@torch.no_grad()
def hass_step_top1(drafter, batches, steps: int = TF_STEPS, input_key: str = "hidden_states") -> tuple[list, int]:
    """(teacher-forced top-1 at steps 1..``steps``, positions counted): each step's ``top1_<s>`` of
    :func:`hass_loss` pooled over the batches by their loss positions. ``input_key``: the batch's drafter input
    features (EAGLE-3: :data:`AUX_COLUMN`); the targets are always the last hidden state."""
    hits, counted = [0.0] * steps, 0
    for batch in batches:
        ids, feats_in, feats_target, mask = shift_for_drafter(batch["input_ids"], batch["hidden_states"],
                                                              batch["loss_mask"], batch["attention_mask"])  # fmt: skip
        if input_key != "hidden_states":
            feats_in = batch[input_key][:, :-1]
        n = int(mask.sum())
        if not n:
            continue
        out = hass_loss(drafter, ids, feats_in, feats_target, mask, num_steps=steps, w_topk=0.0, w_reg=0.0)
        for s in range(steps):
            hits[s] += float(out[f"top1_{s + 1}"]) * n
        counted += n
    return [h / counted if counted else None for h in hits], counted


@torch.no_grad()
def parallel_depth_top1(drafter, batches, depths: int = TF_STEPS) -> tuple[list, int]:
    """(teacher-forced top-1 of ParallelSpec depths 0..``depths``-1, positions of depth 0): a parallel group after
    every position (the paper's layout), :func:`parallel_depth_accuracy` pooled over the batches."""
    k = drafter.config.num_mask_tokens
    correct, counted = [0] * (k + 1), [0] * (k + 1)
    for batch in batches:
        ids, hidden = batch["input_ids"], batch["hidden_states"]
        loss_mask = batch["loss_mask"] * batch["attention_mask"]
        num_pairs = ids.shape[1] - 1
        anchors = group_anchors(num_pairs, k, loss_mask, batch["attention_mask"].sum(1) - 1, 1.0, ids.shape[0])
        layout = build_parallel_layout(num_pairs, anchors.to(ids.device), k)
        for d, (c, n) in parallel_depth_accuracy(drafter, ids, hidden, layout, loss_mask).items():
            correct[d] += c
            counted[d] += n
    return [c / n if n else None for c, n in zip(correct[:depths], counted[:depths])], counted[0]


def teacher_forced(drafter, tf_cache: str | None, examples: int | None, batch_size: int, max_length: int) -> dict:
    """The drafter's teacher-forced row: ``kind`` (``hass_steps`` or ``parallel_depths``), ``top1`` per step,
    ``positions``, ``cache`` and a ``note`` when there are no numbers."""
    if tf_cache is None:
        return {"kind": None, "top1": [None] * TF_STEPS, "positions": 0, "note": "no --tf-cache given"}
    layer_ids = drafter.target_feature_layers()
    input_key, cache = "hidden_states", tf_cache
    if layer_ids is not None:  # EAGLE-3: the inputs of its fused target layers
        loaded = _eagle3_cache(tf_cache, layer_ids)
        if loaded is None:
            layers = " ".join(map(str, layer_ids))
            note = (f"the cache holds no inputs of target layers {list(layer_ids)}; extend it with `python -m "
                    f"hf_spec.training.data layers --feature_cache {tf_cache} --layers {layers}`")
            return {"kind": "hass_steps", "top1": [None] * TF_STEPS, "positions": 0, "note": note}
        (dataset, storage, cache), input_key = loaded, AUX_COLUMN
    else:
        dataset, storage = load_feature_cache(tf_cache)
    if examples:
        dataset = dataset.select(range(min(examples, len(dataset))))
    dtype = next(drafter.parameters()).dtype
    collate = FeatureCollator(storage=storage, dtype=dtype, max_length=max_length)
    batches = (
        {k: v.to(drafter.device) for k, v in b.items()} for b in _batches(dataset, collate, batch_size)
    )
    if isinstance(drafter, hf_spec.ParallelDrafter):
        top1, positions = parallel_depth_top1(drafter, batches)
        kind = "parallel_depths"
    else:
        top1, positions = hass_step_top1(drafter, batches, input_key=input_key)
        kind = "hass_steps"
    return {"kind": kind, "top1": top1, "positions": positions, "cache": cache, "examples": len(dataset),
            "note": None}


# ---------------------------------------------------------------------------------------------
# τ on held-out prompts
# ---------------------------------------------------------------------------------------------
def held_out_prompts(tokenizer, per_set: int, skip: int) -> dict[str, list[torch.Tensor]]:
    """``per_set`` chat-templated prompts (1, n) of each benchmark set, after its first ``skip``."""
    prompts = {}
    for name, loader in BENCH_DATASETS.items():
        records = loader()
        if skip + per_set > len(records):
            raise ValueError(f"{name} has {len(records)} prompts; --skip {skip} + --prompts-per-set {per_set} asks "
                             f"for more. Fix: --prompts-per-set {max(len(records) - skip, 0)} at most.")  # fmt: skip
        prompts[name] = [torch.tensor([render_prompt(tokenizer, r)]) for r in records[skip : skip + per_set]]
    return prompts


def parallel_paper_widths(drafter) -> list[int]:
    """ParallelSpec's widths per depth (paper A.3), cut to the depths the drafter's [MASK] tokens draft."""
    return list(DEFAULT_TREE_WIDTHS[: drafter.config.num_mask_tokens + 1])


def paper_shapes(drafter) -> dict[str, dict]:
    """``generate()`` options of the paper's tree and of the depth-5 chain for ``drafter`` (ParallelSpec: its widths
    are set by :func:`paper_widths`; a drafter with fewer than 4 [MASK] tokens gets a shorter chain)."""
    if isinstance(drafter, hf_spec.ParallelDrafter):
        widths = parallel_paper_widths(drafter)
        depth = min(CHAIN_DEPTH, len(widths))
        tree = dict(tree_total_tokens=static_tree_size(widths)[0])
    else:
        depth, tree = CHAIN_DEPTH, dict(EAGLE2_TREE)
    return {"tree": tree, "chain": dict(tree_depth=depth, tree_top_k=1, tree_total_tokens=depth)}


@contextlib.contextmanager
def paper_widths(drafter):
    """ParallelSpec's static tree with the paper's widths (A.3) for the duration; other drafters as they are."""
    if not isinstance(drafter, hf_spec.ParallelDrafter):
        yield None
        return
    config = drafter.generation_config
    before = getattr(config, "tree_widths", None)
    config.tree_widths = parallel_paper_widths(drafter)
    try:
        yield config.tree_widths
    finally:
        config.tree_widths = before


def measure_tau(target, drafter, prompts: dict, plain: dict, max_new_tokens: int, pad_token_id,
                use_router: bool | None = None) -> dict:  # fmt: skip
    """Per shape: τ per prompt set (pooled over its cycles), drafting ms and verified nodes per cycle, and the
    prompts whose output differs from plain greedy's. ``use_router``: ``generate()``'s switch for a drafter with an
    LM-head router (None: its config's default)."""
    fixed = dict(do_sample=False, max_new_tokens=max_new_tokens, ngram_nodes=0, tree_min_prob=0.0,
                 speed_controller=False, pad_token_id=pad_token_id, use_router=use_router)  # fmt: skip
    result = {}
    with paper_widths(drafter) as widths:
        for shape, options in paper_shapes(drafter).items():
            per_set, seconds, cycles, nodes, mismatches = {}, 0.0, 0, 0, []
            for name, ids_list in prompts.items():
                accepted, set_cycles = 0, 0
                for i, ids in enumerate(ids_list):
                    ids = ids.to(target.device)
                    out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=drafter,
                                          **fixed, **options)  # fmt: skip
                    if not torch.equal(out.cpu(), plain[name][i]):
                        mismatches.append(f"{name}[{i}]")
                    stats = drafter.last_generation_stats
                    accepted += sum(stats.accepted_lengths)
                    set_cycles += stats.cycles
                    seconds += stats.drafter_forward_seconds
                    nodes += sum(stats.tree_sizes)
                per_set[name] = 1.0 + accepted / set_cycles if set_cycles else None
                cycles += set_cycles
            if widths and shape == "tree":
                options = {**options, "tree_widths": widths}
            per_cycle = (lambda total: total / cycles) if cycles else (lambda total: None)
            result[shape] = {"options": options, "tau": per_set, "draft_ms_per_cycle": per_cycle(1000 * seconds),
                             "verified_nodes_per_cycle": per_cycle(nodes), "cycles": cycles,
                             "mismatches": mismatches}  # fmt: skip
    return result


# ---------------------------------------------------------------------------------------------
# the papers' claims
# ---------------------------------------------------------------------------------------------
def mean_tau(row: dict, shape: str = "tree") -> float | None:
    values = list(row["shapes"][shape]["tau"].values()) if row.get("shapes") else []
    return sum(values) / len(values) if values and None not in values else None


def _tf(row: dict, step: int):
    return row["tf"]["top1"][step - 1]


def _draft_ms(row: dict):
    return row["shapes"]["tree"]["draft_ms_per_cycle"]


def _above(a, b) -> bool | None:
    return None if a is None or b is None else a > b


def _hass_checks(row, base):
    eagle = base["eagle"]
    return [_above(_tf(row, s), _tf(eagle, s)) for s in (2, 3, 4)] + [_above(mean_tau(row), mean_tau(eagle))]


def _coral_checks(row, base):
    return [_above(mean_tau(row), mean_tau(base["hass"]))]


def _eagle3_checks(row, base):
    return [_above(mean_tau(row), mean_tau(base[m])) for m in ("eagle", "hass")]


def _parallelspec_checks(row, base):
    return [_above(_draft_ms(base["eagle"]), _draft_ms(row))]


ROUTER_TAU_LOSS = 0.06
"""The τ loss the LM-head router may cost for CORAL's router claim to hold: its own Llama3-8B row (τ 4.90 -> 4.63,
5.5%, CORAL Table 2); at Llama3-70B (-9.3%) the paper itself calls the router not worth it (App. F)."""


def _router_checks(row, base):
    csra = base["coral"]
    tau, tau_csra = mean_tau(row), mean_tau(csra)
    small_loss = None if tau is None or tau_csra is None else tau >= (1.0 - ROUTER_TAU_LOSS) * tau_csra
    return [_above(_draft_ms(csra), _draft_ms(row)), small_loss]


CLAIMS = [
    ("hass", ["eagle"], "harmonized context alignment raises teacher-forced top-1 at steps 2-4 and τ at EAGLE-2's "
     "tree over EAGLE (HASS, Tables 1-2)", _hass_checks),
    ("coral", ["hass"], "cross-step representation alignment gives a higher τ at EAGLE-2's tree than HASS (CORAL, "
     "Table 1; the CSRA-only drafter, without its LM-head router)", _coral_checks),
    (CORAL_ROUTER, ["coral"], "the LM-head router cuts drafting ms per cycle for a slight loss of τ (at most "
     f"{ROUTER_TAU_LOSS:.0%}: CORAL §3.3, Table 2; the paper applies it to large vocabularies only)", _router_checks),
    ("eagle3", ["eagle", "hass"], "the training-time test over fused target layers gives a higher τ at EAGLE-2's "
     "tree than EAGLE and HASS (EAGLE-3, Table 1)", _eagle3_checks),
    ("parallelspec", ["eagle"], "drafting the tree in one forward costs fewer drafting ms per cycle than EAGLE's "
     "depth-by-depth drafting (ParallelSpec, §4; machine-dependent)", _parallelspec_checks),
]  # fmt: skip
"""(method, baseline methods, claim, checks(row, baseline rows by method) -> list of True/False/None)."""


def claim_numbers(row: dict) -> dict:
    return {"tf_top1": row["tf"]["top1"], "tau_tree": mean_tau(row), "tau_chain": mean_tau(row, "chain"),
            "draft_ms_per_cycle": _draft_ms(row)}


def paper_claims(rows: list[dict]) -> list[dict]:
    """Each claim whose method is among ``rows``: holds (every check true), does not hold (one false), or not
    measured (a baseline or a number missing), with the numbers of the drafter and its baselines."""
    by_method = {}
    for row in rows:
        by_method.setdefault(row["training_method"], row)
    verdicts = []
    for method, baselines, claim, check in CLAIMS:
        if method not in by_method:
            continue
        row, missing = by_method[method], [m for m in baselines if m not in by_method]
        checks = [] if missing else check(row, by_method)
        if missing or None in checks:
            verdict = "not measured"
        else:
            verdict = "holds" if all(checks) else "does not hold"
        numbers = {m: claim_numbers(by_method[m]) for m in [method, *baselines] if m in by_method}
        verdicts.append({"method": method, "claim": claim, "verdict": verdict, "missing_baselines": missing,
                         "numbers": numbers})  # fmt: skip
    return verdicts


# ---------------------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------------------
def machine_name(device) -> str:
    """The machine a run's drafting ms were timed on: CPU model and threads (and the GPU on CUDA)."""
    info = machine_info(torch.float32, device)
    threads = f"{info['torch_threads']} thread{'s' if info['torch_threads'] != 1 else ''}"
    return ", ".join([info["cpu"] or "unknown CPU", threads] + ([info["gpu"]] if "gpu" in info else []))


def _f(value, digits: int = 2) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def markdown_table(results: dict) -> str:
    sets = list(results["prompts"]["sets"])
    head = (["drafter", "method", *[f"TF top-1 s{s}" for s in range(1, TF_STEPS + 1)]]
            + [f"τ {shape} {name}" for shape in SHAPES for name in sets]
            + [f"draft ms/cycle {shape}" for shape in SHAPES] + [f"nodes/cycle {shape}" for shape in SHAPES])  # fmt: skip
    first, last = results["prompts"]["skip"], results["prompts"]["skip"] + results["prompts"]["per_set"] - 1
    lines = [
        f"# Paper comparison: {results['target']}, {results['dtype']}",
        "",
        f"`{results['command']}`  ",
        f"{results['date']}, {results['device']}, {results['threads']} threads; greedy, {results['max_new_tokens']} "
        f"new tokens, prompts {first}..{last} of each set; n-gram nodes, tree_min_prob and the speed controller "
        f"off. Outputs differing from plain greedy: {results['mismatches']}.",
        "",
        "| " + " | ".join(head) + " |",
        "|---|---|" + "---:|" * (len(head) - 2),
    ]  # fmt: skip
    for row in results["drafters"]:
        shapes = row["shapes"]
        cells = [Path(row["path"]).name, f"{row['training_method']} ({row['model_type']})",
                 *[_f(v, 3) for v in row["tf"]["top1"]]]  # fmt: skip
        cells += [_f(shapes[shape]["tau"][name]) for shape in SHAPES for name in sets]
        cells += [_f(shapes[shape]["draft_ms_per_cycle"], 1) for shape in SHAPES]
        cells += [_f(shapes[shape]["verified_nodes_per_cycle"], 1) for shape in SHAPES]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "TF top-1: teacher-forced on the held-out feature cache; step s of HASS's alignment for the EAGLE "
              "family (step s reads the drafter's own step s-1 features), ParallelSpec's depth s-1 (the s-th token, "
              "one forward). τ tree: EAGLE-2's dynamic tree (depth 6, top-k 10, 60 nodes), ParallelSpec's static "
              "widths (4, 2, 2, 1, 1); τ chain: a depth-5 chain. τ and TF do not depend on the machine; ms do."]  # fmt: skip
    notes = [f"- {Path(r['path']).name}: {r['tf']['note']}" for r in results["drafters"] if r["tf"].get("note")]
    if notes:
        lines += ["", "Notes:", *notes]
    lines += ["", "## The papers' claims", ""]
    if not results["claims"]:
        lines.append("None to check: no HASS, CORAL, EAGLE-3 or ParallelSpec drafter among the rows.")
    for c in results["claims"]:
        numbers = "; ".join(
            f"{m}: TF {'/'.join(_f(v, 3) for v in n['tf_top1'])}, τ tree {_f(n['tau_tree'])}, τ chain "
            f"{_f(n['tau_chain'])}, draft {_f(n['draft_ms_per_cycle'], 1)} ms/cycle" for m, n in c["numbers"].items()
        )  # fmt: skip
        missing = f" (no {', '.join(c['missing_baselines'])} drafter)" if c["missing_baselines"] else ""
        lines.append(f"- **{c['method']}: {c['verdict']}**{missing}. Claim: {c['claim']}. {numbers}.")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# the drafters' cards
# ---------------------------------------------------------------------------------------------
def card_comparisons(results: dict, table: str) -> dict[str, dict]:
    """Each compared folder's paper comparison for its card (:data:`hf_spec.hub.cards.PAPER_COMPARISON_FIELDS`):
    every row of the run, the claims in which one of the folder's methods is the claimant or a baseline."""
    rows = [{"drafter": r["path"], "method": r["training_method"],
             "tf_top1": [v for v in (r["tf"]["top1"] or []) if v is not None],
             "tau_tree": mean_tau(r), "tau_chain": mean_tau(r, "chain"), "draft_ms": _draft_ms(r)}
            for r in results["drafters"]]  # fmt: skip
    comparisons = {}
    for path in dict.fromkeys(r["path"] for r in results["drafters"]):
        methods = {r["training_method"] for r in results["drafters"] if r["path"] == path}
        claims = [{k: c[k] for k in ("method", "claim", "verdict")} for c in results["claims"]
                  if c["method"] in methods or methods & set(c["numbers"])]  # fmt: skip
        comparisons[path] = {"table": table, "command": results["command"], "date": results["date"][:10],
                             "machine": results.get("machine", results["device"]), "dtype": results["dtype"],
                             "drafter": path, "rows": rows, "claims": claims}  # fmt: skip
    return comparisons


def write_cards(results: dict, table: str) -> list[Path]:
    """Put each compared folder's paper comparison into its card; a folder whose card hf-spec cannot re-render is
    left as it is (:func:`~hf_spec.hub.cards.refresh_model_card` says why)."""
    cards = (refresh_model_card(path, {PAPER_COMPARISON: comparison})
             for path, comparison in card_comparisons(results, table).items())  # fmt: skip
    return [card for card in cards if card is not None]


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------
def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--drafters", nargs="+", help="drafter folders trained for --target")
    parser.add_argument("--target", default="smollm2-135m-instruct", help="packaged model name or model directory")
    parser.add_argument("--prompts-per-set", type=int, default=10)
    parser.add_argument("--skip", type=int, default=40, help="leave out the first N prompts of each set (see above)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--tf-cache", default=None, help="held-out self-distilled feature cache (TF top-1 columns)")
    parser.add_argument("--tf-examples", type=int, default=None, help="the cache's first N examples (default: all)")
    parser.add_argument("--tf-batch-size", type=int, default=4)
    parser.add_argument("--tf-max-length", type=int, default=1024)
    parser.add_argument("--dtype", default="float32", help="float32 (greedy output exact), bfloat16 or auto")
    parser.add_argument("--output-dir", help="where results.json and table.md go")
    parser.add_argument("--cards", action="store_true", help="write each folder's row into its model card")
    parser.add_argument("--cards-from", default=None, help="only write the cards, from this earlier results.json")
    parser.add_argument("--table", default="benchmarks/papers/README.md", help="where the cards say the whole "
                        "comparison lives")
    args = parser.parse_args(argv)
    if args.cards_from:
        results = json.loads(Path(args.cards_from).read_text())
        for card in write_cards(results, args.table):
            print(f"wrote {card}", flush=True)
        return results
    if not args.drafters or not args.output_dir:
        parser.error("--drafters and --output-dir are required (or --cards-from RESULTS.json alone)")

    dtype = resolve_dtype(args.dtype)
    target, tokenizer = load_target(args.target, dtype)
    prompts = held_out_prompts(tokenizer, args.prompts_per_set, args.skip)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.inference_mode():
        plain = {name: [target.generate(ids.to(target.device), attention_mask=torch.ones_like(ids).to(target.device),
                                        do_sample=False, max_new_tokens=args.max_new_tokens, pad_token_id=pad).cpu()
                        for ids in ids_list] for name, ids_list in prompts.items()}  # fmt: skip
    rows = []
    for folder in args.drafters:
        drafter = hf_spec.AutoDrafter.from_pretrained(folder, target=target).eval()
        if isinstance(drafter, (hf_spec.SortedDrafter, hf_spec.NGramDrafter)):
            raise ValueError(f"{folder} is a {type(drafter).__name__}; this script compares feature drafters. Fix: "
                             "leave it out (S2D: training_scripts/search_s2d_thresholds.py).")  # fmt: skip
        start = time.time()
        tf = teacher_forced(drafter, args.tf_cache, args.tf_examples, args.tf_batch_size, args.tf_max_length)
        # a drafter with an LM-head router (CORAL) is measured through its full head and through its router
        routings = [False, True] if getattr(drafter, "router", None) is not None else [None]
        for routed in routings:
            method = CORAL_ROUTER if routed else drafter.config.resolved_training_method
            row = {"path": folder, "model_type": drafter.config.model_type, "training_method": method, "tf": tf}
            with torch.inference_mode():
                warm = prompts[next(iter(prompts))][0].to(target.device)
                target.generate(warm, attention_mask=torch.ones_like(warm), assistant_model=drafter,
                                max_new_tokens=8, do_sample=False, ngram_nodes=0, pad_token_id=pad,
                                use_router=routed)  # fmt: skip
                row["shapes"] = measure_tau(target, drafter, prompts, plain, args.max_new_tokens, pad, routed)
            row["seconds"] = round(time.time() - start, 1)
            start = time.time()
            print(json.dumps({"drafter": folder, "method": method, "tf_top1": tf["top1"],
                              **{s: row["shapes"][s]["tau"] for s in SHAPES}}), flush=True)  # fmt: skip
            rows.append(row)
    mismatches = sum(len(r["shapes"][s]["mismatches"]) for r in rows for s in SHAPES)
    device = str(target.device) if target.device.type != "cpu" else "cpu"
    command = ["python", "training_scripts/compare_papers.py", *(argv if argv is not None else sys.argv[1:])]
    results = {
        "command": shlex.join(command),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "target": args.target, "dtype": dtype_name(dtype),
        "device": torch.cuda.get_device_name(target.device) if target.device.type == "cuda" else device,
        "machine": machine_name(target.device),
        "threads": torch.get_num_threads(), "max_new_tokens": args.max_new_tokens,
        "prompts": {"sets": list(prompts), "per_set": args.prompts_per_set, "skip": args.skip},
        "tf_cache": args.tf_cache, "tf_steps": TF_STEPS, "mismatches": mismatches, "drafters": rows,
        "claims": paper_claims(rows),
    }  # fmt: skip
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "table.md").write_text(markdown_table(results))
    print(f"wrote {out / 'results.json'} and {out / 'table.md'}", flush=True)
    if args.cards:
        for card in write_cards(results, args.table):
            print(f"wrote {card}", flush=True)
    if mismatches and dtype == torch.float32:
        raise AssertionError(f"{mismatches} outputs differ from plain greedy in float32, where hf-spec is exact "
                             f"(see 'mismatches' in {out / 'results.json'}): a decoding bug to report.")  # fmt: skip
    return results


if __name__ == "__main__":
    main()
