"""Model cards (README.md) for saved and pushed drafters.

One Jinja2 template per training method lives in ``hf_spec/hub/model_cards/<method>.md.j2``
(``model_cards/`` at the repository root points there); each extends ``_base.md.j2`` and sets
the method's name, tag, description, training script and citation. The method comes from the
config's ``training_method`` (None: the family default, e.g. ``eagle`` for ``hf_spec_eagle``).
A new family adds one template; nothing here names families.

Rendering uses ``StrictUndefined``: a missing value is an error, never an empty hole.

Results never come from hand-typed numbers: they are read from a benchmark JSON file (or the
same data as a dict) in the schema below, written by ``hf-spec bench``. Without results the
card has no ``model-index`` and says that results are not measured yet.

Benchmark JSON schema (``hf-spec-bench/1``)::

    {
      "schema": "hf-spec-bench/1",              # optional; checked when present
      "machine": "...", "date": "YYYY-MM-DD",   # provenance defaults for every entry ...
      "command": "hf-spec bench ...", "baseline": "plain greedy generate(), bf16",
      "results": [                              # ... one entry per data set
        {"dataset": "mt_bench", "tau": 3.2, "speedup": 1.9,
         "tokens_per_s": 85.0,                  # optional
         "machine": ..., "date": ..., "command": ..., "baseline": ...}   # optional overrides
      ]
    }

``tau``: mean tokens emitted per target forward (accepted drafts + 1); ``speedup``: wall-clock
ratio over ``baseline``. Every entry must end up with ``machine``, ``date``, ``command`` and
``baseline`` (its own or the top-level ones). :data:`BENCH_RESULTS_SCHEMA` is the same as a
JSON Schema document.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path

from ..drafters.registry import drafter_classes
from ..version import __version__

TEMPLATE_SUFFIX = ".md.j2"
BENCH_SCHEMA_ID = "hf-spec-bench/1"
PROVENANCE_FIELDS = ("machine", "date", "command", "baseline")

BENCH_RESULTS_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": BENCH_SCHEMA_ID,
    "type": "object",
    "required": ["results"],
    "properties": {
        "schema": {"const": BENCH_SCHEMA_ID},
        **{field: {"type": "string"} for field in PROVENANCE_FIELDS},
        "results": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["dataset", "tau", "speedup"],
                "properties": {
                    "dataset": {"type": "string"},
                    "tau": {"type": "number", "minimum": 1},
                    "speedup": {"type": "number", "exclusiveMinimum": 0},
                    "tokens_per_s": {"type": "number", "exclusiveMinimum": 0},
                    **{field: {"type": "string"} for field in PROVENANCE_FIELDS},
                },
            },
        },
    },
}
"""The benchmark JSON format as a JSON Schema (documentation and interop; validated by hand)."""

DATASET_NAMES = {"mt_bench": "MT-bench", "mtbench": "MT-bench", "humaneval": "HumanEval", "gsm8k": "GSM8K"}


def templates_dir() -> Path:
    """Directory holding the card templates (package data, so installed wheels have it too)."""
    return Path(str(resources.files("hf_spec.hub") / "model_cards"))


def available_methods() -> list[str]:
    return sorted(p.name[: -len(TEMPLATE_SUFFIX)] for p in templates_dir().glob(f"[!_]*{TEMPLATE_SUFFIX}"))


def load_bench_results(bench_results: str | os.PathLike | dict | None) -> dict | None:
    """Read and validate benchmark results (path to a JSON file, or its dict); None passes through.

    Returns ``{"results": [entry, ...]}`` with every entry's provenance filled in.
    """
    if bench_results is None:
        return None
    source = "bench_results"
    if isinstance(bench_results, (str, os.PathLike)):
        source = str(bench_results)
        bench_results = json.loads(Path(bench_results).read_text(encoding="utf-8"))
    if not isinstance(bench_results, dict):
        raise ValueError(f"{source}: expected a JSON object with a 'results' list (schema {BENCH_SCHEMA_ID}).")

    def fail(message: str):
        raise ValueError(f"{source}: {message} (see hf_spec.hub.cards for the {BENCH_SCHEMA_ID} schema).")

    if "schema" in bench_results and bench_results["schema"] != BENCH_SCHEMA_ID:
        fail(f"unknown schema {bench_results['schema']!r}, expected {BENCH_SCHEMA_ID!r}")
    entries = bench_results.get("results")
    if not isinstance(entries, list) or not entries:
        fail("'results' must be a non-empty list of per-data-set entries")
    normalized = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            fail(f"results[{i}] is not an object")
        out = {}
        if not isinstance(entry.get("dataset"), str) or not entry["dataset"]:
            fail(f"results[{i}] needs a 'dataset' name")
        out["dataset"] = entry["dataset"]
        for key, minimum, required in (("tau", 1.0, True), ("speedup", 0.0, True), ("tokens_per_s", 0.0, False)):
            value = entry.get(key)
            if value is None and not required:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum or (
                    minimum == 0.0 and value == 0):  # fmt: skip
                fail(f"results[{i}].{key} must be a number {'>= 1' if minimum else '> 0'}, got {value!r}")
            out[key] = float(value)
        for key in PROVENANCE_FIELDS:
            value = entry.get(key, bench_results.get(key))
            if not isinstance(value, str) or not value:
                fail(f"results[{i}] has no {key!r} (give it per entry or at the top level)")
            out[key] = value
        normalized.append(out)
    return {"results": normalized}


def _model_index(model_name: str, results: list[dict]) -> list[dict]:
    index_results = []
    for entry in results:
        metrics = [
            {"type": "acceptance_length", "name": "τ (tokens per target forward)", "value": round(entry["tau"], 3)},
            {"type": "speedup", "name": f"speedup over {entry['baseline']}", "value": round(entry["speedup"], 3)},
        ]
        if "tokens_per_s" in entry:
            metrics.append({"type": "tokens_per_second", "name": "tokens/s", "value": round(entry["tokens_per_s"], 2)})
        index_results.append({
            "task": {"type": "text-generation", "name": "Speculative decoding"},
            "dataset": {"type": entry["dataset"], "name": DATASET_NAMES.get(entry["dataset"].lower(), entry["dataset"])},
            "metrics": metrics,
        })  # fmt: skip
    return [{"name": model_name, "results": index_results}]


def _to_yaml(value) -> str:
    import yaml

    return yaml.safe_dump(value, sort_keys=False, allow_unicode=True, default_flow_style=False).rstrip("\n")


def card_context(config, *, bench_results=None, training_info: dict | None = None, model_name: str | None = None) -> dict:
    """Every value a card template reads, from the drafter config + results + training metadata."""
    method = getattr(config, "resolved_training_method", None) or getattr(config, "training_method", None)
    if method is None:
        raise ValueError(f"{type(config).__name__} has no training_method and no family default; set config.training_method.")
    methods = available_methods()
    if method not in methods:
        raise ValueError(f"No model card template for training_method={method!r}; available: {methods}. "
                         f"Fix: set training_method to one of them or add {method}{TEMPLATE_SUFFIX} to {templates_dir()}.")  # fmt: skip
    training_info = dict(training_info or {})
    bench = load_bench_results(bench_results)
    model_name = model_name or "hf-spec-drafter"
    model_class = drafter_classes(config.model_type)[1].__name__
    datasets = training_info.pop("datasets", None)
    if isinstance(datasets, str):
        datasets = [datasets]
    known = {"command", "license"}
    return {
        "model_name": model_name,
        "method": method,
        "drafter_class": model_class,
        "config_class": type(config).__name__,
        "model_type": config.model_type,
        "base_model": config.target_model_name_or_path,
        "served_targets": [  # a sorted (S2D) drafter serves several targets, each with its exit thresholds
            {"name": t.get("name_or_path") or t.get("model_type"), "thresholds": list(t.get("thresholds") or [])}
            for t in (getattr(config, "targets", None) or [])
        ],
        "target_model_type": config.target_model_type,
        "target_architectures": list(config.target_architectures or []),
        "num_layers": getattr(config, "num_layers", None),
        "sorted_exits": list(getattr(config, "exits", None) or []),  # S2D only
        "exit_adapters": bool(getattr(config, "exit_adapters", False)),
        "source_model": getattr(config, "source_model_name_or_path", None),
        "tree_depth": config.tree_depth,
        "tree_top_k": config.tree_top_k,
        "tree_total_tokens": config.tree_total_tokens,
        "tree_widths": list(getattr(config, "tree_widths", None) or []),
        "ngram_cost_gate": bool(getattr(config, "ngram_cost_gate", False)),
        "shape_candidates": [dict(c) for c in (getattr(config, "tree_shape_candidates", None) or [])]
        if getattr(config, "auto_tree_shape", None) is not False else [],
        "license": training_info.get("license", "apache-2.0"),
        "datasets": list(datasets or []),
        "training_command": training_info.get("command"),
        "training_extra": {k: v for k, v in training_info.items() if k not in known},
        "results": bench["results"] if bench else [],
        "model_index": _model_index(model_name, bench["results"]) if bench else None,
        "dataset_names": DATASET_NAMES,
        "hf_spec_version": __version__,
    }


def _environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["to_yaml"] = _to_yaml
    env.filters["tojson"] = lambda v: json.dumps(v, ensure_ascii=False)
    return env


def render_model_card(config, *, bench_results=None, training_info: dict | None = None, model_name: str | None = None) -> str:
    """The README.md text for a drafter with ``config``."""
    context = card_context(config, bench_results=bench_results, training_info=training_info, model_name=model_name)
    text = _environment().get_template(context["method"] + TEMPLATE_SUFFIX).render(**context)
    for marker in ("{{", "}}", "{%", "%}"):
        if marker in text:
            raise ValueError(f"Rendered card still contains {marker!r}; a template is broken.")
    return text


def write_model_card(config, save_directory: str | os.PathLike, *, bench_results=None, training_info=None,
                     model_name: str | None = None) -> Path:  # fmt: skip
    """Write README.md into ``save_directory``; the model name defaults to the directory name."""
    save_directory = Path(save_directory)
    text = render_model_card(config, bench_results=bench_results, training_info=training_info,
                             model_name=model_name or save_directory.resolve().name)  # fmt: skip
    path = save_directory / "README.md"
    path.write_text(text, encoding="utf-8")
    return path
