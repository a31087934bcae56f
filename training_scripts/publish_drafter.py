"""Publish a trained drafter into a shipped folder: bf16 weights, config, generated model card.

Reads the run's ``training_summary.json`` (written by every training script) for the card's
training facts, and optionally a benchmark JSON (``hf-spec bench`` ``results.json``) for its
results. Tree-shape fields already written into the destination's config by ``hf-spec tune
--write`` are kept when the drafter is re-published (``--tree-from DIR`` takes them from another
tuned folder instead). A published folder can be its own source (new shape or benchmark, same weights):
its ``training_info.json`` keeps the card's training facts.

    python training_scripts/publish_drafter.py runs/train/hass drafters/smollm2-135m-instruct-hass \\
        --command "bash runs/train_all.sh (see drafters/README.md)" --bench benchmarks/<run>/results.json
"""

from __future__ import annotations

import argparse
import json
import os

import torch
from transformers import AutoModel

from hf_spec.hub.cards import TRAINING_INFO  # the card's training facts, which save_pretrained writes beside it

TUNED_FIELDS = ("tree_depth", "tree_top_k", "tree_total_tokens", "tree_widths", "ngram_nodes", "ngram_depth",
                "ngram_copy_nodes", "ngram_cost_gate", "tree_shape_candidates", "auto_tree_shape",
                "tree_shape_candidates_measured", "tree_tuned_for", "use_router")


def machine_line(machine) -> str:
    """A results file's machine as the card's one line: the run's identity (CPU, threads, versions, dtype), not its
    load average. ``hf-spec bench`` and ``benchmarks/fresh_machine.py`` name the thread count differently."""
    if isinstance(machine, str):
        return machine
    labels = (("cpu", "{}"), ("cores", "{} cores"), ("torch_threads", "{} threads"), ("threads", "{} threads"),
              ("torch", "torch {}"), ("transformers", "transformers {}"), ("dtype", "{}"))  # fmt: skip
    return ", ".join(label.format(machine[key]) for key, label in labels if machine.get(key) is not None)


def card_results(path: str, method: str) -> dict:
    """The card's benchmark entries (``hf_spec.hub.cards`` schema) for ``method`` from an ``hf-spec bench``
    results.json: τ, speedup over plain greedy and tokens/s per data set, with the run's provenance."""
    run = json.load(open(path))
    if method not in run["summary"]["all"]:
        raise SystemExit(f"{path} has no method {method!r}; it has {sorted(run['summary']['all'])}")
    entries = [{"dataset": name, "tau": rows[method]["tau"], "speedup": rows[method]["speedup"],
                "tokens_per_s": rows[method]["tokens_per_s"]}
               for name, rows in run["summary"].items() if name != "all" and method in rows]  # fmt: skip
    return {"machine": machine_line(run["machine"]), "date": run["date"][:10], "command": run["command"],
            "baseline": "plain greedy generate(), same run", "results": entries}  # fmt: skip


def fresh_machine_card_results(path: str, method: str) -> dict:
    """The card's benchmark entries for ``method`` from a ``benchmarks/fresh_machine.py`` results.json: per kind of
    prompt, the geometric-mean speedup over plain greedy, mean τ and mean tokens/s of that run."""
    run = json.load(open(path))
    if method not in run["summary"]:
        raise SystemExit(f"{path} has no method {method!r}; it has {sorted(run['summary'])}")
    entries = []
    for kind, speedup in run["summary"][method]["x_plain_by_kind"].items():
        rows = [p[method] for p in run["prompts"] if p["kind"] == kind]
        entries.append({"dataset": f"{kind} (fresh-machine prompts)", "speedup": speedup,
                        "tau": sum(r["tau"] for r in rows) / len(rows),
                        "tokens_per_s": sum(r["tok_s"] for r in rows) / len(rows)})  # fmt: skip
    return {"machine": machine_line(run["machine"]), "date": run["date"][:10], "command": run["command"],
            "baseline": f"plain greedy generate(), {run['machine']['dtype']}, same run", "results": entries}  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", help="training output directory (drafter + training_summary.json)")
    parser.add_argument("destination", help="folder to write (e.g. drafters/<target>-<method>)")
    parser.add_argument("--command", default=None, help="the exact training command, for the card")
    parser.add_argument("--bench", default=None, help="`hf-spec bench` results.json whose rows for this drafter go into "
                        "the card")
    parser.add_argument("--bench-method", default=None, help="the drafter's method name in that run (default: "
                        "hf_spec:<destination>)")
    parser.add_argument("--fresh-machine", default=None, help="a benchmarks/fresh_machine.py results.json whose rows "
                        "for --bench-method (e.g. hass) go into the card, one per kind of prompt (instead of --bench)")
    parser.add_argument("--datasets", default="ShareGPT first turns, self-distilled by the target (hf_spec.training.distill)",
                        help="the card's training-data line")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tree-widths", type=int, nargs="+", default=None, help="static tree widths per depth "
                        "(ParallelSpec), recorded as the chosen shape")
    parser.add_argument("--ngram-nodes", type=int, default=None, help="default n-gram nodes grafted onto the "
                        "drafter's trees (set where the benchmark measured it faster)")
    parser.add_argument("--ngram-depth", type=int, default=None, help="deepest grafted n-gram node (default: the "
                        "drafter tree's depth)")
    parser.add_argument("--tree-from", default=None, help="copy the tuned tree shape of this drafter folder (e.g. to "
                        "compare drafters of one architecture at the same shape)")
    parser.add_argument("--ngram-datastore", nargs="+", default=None, help="training feature caches (their answer "
                        "tokens: the target's own answers after self-distillation) or saved ngram_datastore.safetensors "
                        "files, merged into one datastore shipped beside the weights for the n-gram branches")
    args = parser.parse_args(argv)

    import hf_spec  # noqa: F401  (registers the drafter classes with AutoModel)

    drafter = AutoModel.from_pretrained(args.source, dtype=getattr(torch, args.dtype))
    tuned_config = os.path.join(args.tree_from or args.destination, "config.json")
    if os.path.exists(tuned_config):
        previous = json.load(open(tuned_config))
        if "tree_tuned_for" in previous:  # keep the shape `hf-spec tune --write` chose for this folder
            for key in TUNED_FIELDS:
                if key in previous:
                    setattr(drafter.config, key, previous[key])
                    if key not in ("tree_tuned_for", "use_router"):  # decoding defaults of generate()
                        setattr(drafter.generation_config, key, previous[key])
    if args.tree_widths:  # a static-tree drafter (ParallelSpec): depth, top-k and size follow from the widths
        from hf_spec.tree.static import static_tree_size

        widths = list(args.tree_widths)
        shape = {"tree_widths": widths, "tree_depth": len(widths), "tree_top_k": widths[0],
                 "tree_total_tokens": static_tree_size(widths)[0]}  # fmt: skip
        for key, value in shape.items():
            setattr(drafter.config, key, value)
            setattr(drafter.generation_config, key, value)
        drafter.config.tree_tuned_for = {"chosen_by": "publish_drafter.py --tree-widths (see drafters/README.md)"}
    if args.ngram_nodes is not None:
        drafter.config.ngram_nodes = args.ngram_nodes
    if args.ngram_depth is not None:
        drafter.config.ngram_depth = args.ngram_depth
    if args.ngram_datastore:
        from hf_spec.drafters.datastore import NGramDatastore
        from hf_spec.training.data import datastore_from_feature_cache

        drafter.ngram_datastore = NGramDatastore.merge(
            NGramDatastore.load(source) if source.endswith(".safetensors") else datastore_from_feature_cache(source)
            for source in args.ngram_datastore)  # fmt: skip
    info = {}
    recorded = os.path.join(args.source, TRAINING_INFO)  # a published folder, re-published (new shape, new bench)
    if os.path.exists(recorded):
        info.update(json.load(open(recorded)))
    for name in ("drafter/training_summary.json", "training_summary.json", "router_training_summary.json"):
        path = os.path.join(args.source, name)  # CORAL: stage 1 in drafter/, the router beside it
        if os.path.exists(path):
            summary = json.load(open(path))
            info.update({k: summary[k] for k in ("method", "global_step", "train_runtime_s", "train_runtime_note",
                                                 "final_train_loss", "examples", "held_out_examples", "num_train_epochs",
                                                 "draft_vocab_size", "draft_vocab_coverage")
                         if k in summary})  # fmt: skip
            info.update(summary.get("recipe", {}))  # the run's loss weights, steps and optimiser (recipe_settings)
    info["datasets"] = [args.datasets]
    if args.command:
        info["command"] = args.command
    if args.bench and args.fresh_machine:
        parser.error("--bench and --fresh-machine both give the card's results; pick one.")
    bench = card_results(args.bench, args.bench_method or f"hf_spec:{args.destination.rstrip('/')}") if args.bench else None
    if args.fresh_machine:
        if not args.bench_method:
            parser.error("--fresh-machine needs --bench-method, the drafter's name in that run (e.g. hass).")
        bench = fresh_machine_card_results(args.fresh_machine, args.bench_method)
    drafter.save_pretrained(args.destination, bench_results=bench, training_info=info)  # writes TRAINING_INFO too
    print(f"published {args.source} -> {args.destination}: {sorted(os.listdir(args.destination))}")


if __name__ == "__main__":
    main()
