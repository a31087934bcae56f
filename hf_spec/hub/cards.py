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

A drafter compared with its papers' drafters (``training_scripts/compare_papers.py --cards``) carries its row of
that comparison in ``training_info["paper_comparison"]`` (:data:`PAPER_COMPARISON_FIELDS`): the card renders it as
its own section, the comparison's rows beside it and the claims of the drafter's paper with their verdicts.

A written card keeps its inputs beside it (``training_info.json``; ``card_results.json`` when it has
results), so :func:`refresh_model_card` re-renders it after the config changes (``hf-spec tune --write``,
:func:`hf_spec.tune.write_shape_candidates`).
"""

from __future__ import annotations

import json
import os
import warnings
from importlib import resources
from pathlib import Path

from ..drafters.registry import drafter_classes
from ..version import __version__

TEMPLATE_SUFFIX = ".md.j2"
CARD = "README.md"
TRAINING_INFO = "training_info.json"
"""The card's training facts, written beside it (``json``, indent 1, sorted keys)."""
CARD_RESULTS = "card_results.json"
"""The card's benchmark results as :func:`load_bench_results` returns them, written beside it when it has any."""
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

PAPER_COMPARISON = "paper_comparison"
"""The ``training_info`` key of a drafter's row of a paper comparison (:func:`load_paper_comparison`)."""
PAPER_COMPARISON_FIELDS = ("table", "command", "date", "machine", "dtype", "drafter", "rows", "claims")
"""What a paper comparison holds: ``table`` (where the whole comparison lives), the run's ``command``, ``date``,
``machine`` and ``dtype``; ``drafter`` (this drafter's name among the rows, the folder the comparison read); ``rows``,
one per drafter compared: ``drafter``, ``method``, ``tf_top1`` (teacher-forced top-1 per step), ``tau_tree`` /
``tau_chain`` (mean τ at the paper's tree and at a depth-5 chain) and ``draft_ms`` (drafting ms per cycle at the tree;
None where not measured); ``claims``: ``method``, ``claim``, ``verdict``."""
_PAPER_ROW_FIELDS = ("drafter", "method", "tf_top1", "tau_tree", "tau_chain", "draft_ms")

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


def load_paper_comparison(comparison: dict | None) -> dict | None:
    """Validate a drafter's paper comparison (:data:`PAPER_COMPARISON_FIELDS`); None passes through."""
    if comparison is None:
        return None

    def fail(message: str):
        raise ValueError(f"training_info[{PAPER_COMPARISON!r}]: {message}. Fix: write it with "
                         "training_scripts/compare_papers.py --cards.")  # fmt: skip

    if not isinstance(comparison, dict):
        fail("expected an object")
    missing = [key for key in PAPER_COMPARISON_FIELDS if key not in comparison]
    if missing:
        fail(f"missing {', '.join(missing)}")
    rows = comparison["rows"]
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        fail("'rows' must be a non-empty list of objects")
    for i, row in enumerate(rows):
        absent = [key for key in _PAPER_ROW_FIELDS if key not in row]
        if absent:
            fail(f"rows[{i}] has no {', '.join(absent)}")
        for key in ("tau_tree", "tau_chain", "draft_ms"):
            if row[key] is not None and (isinstance(row[key], bool) or not isinstance(row[key], (int, float))):
                fail(f"rows[{i}].{key} must be a number or None, got {row[key]!r}")
        top1 = row["tf_top1"]
        if not isinstance(top1, list) or not all(isinstance(v, (int, float)) and 0 <= v <= 1 for v in top1):
            fail(f"rows[{i}].tf_top1 must be a list of accuracies in [0, 1], got {top1!r}")
    if comparison["drafter"] not in {row["drafter"] for row in rows}:
        fail(f"drafter {comparison['drafter']!r} is not among its rows")
    claims = comparison["claims"]
    if not isinstance(claims, list) or not all(isinstance(c, dict) and {"method", "claim", "verdict"} <= set(c)
                                               for c in claims):  # fmt: skip
        fail("'claims' must be a list of objects with method, claim and verdict")
    return comparison


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
    comparison = load_paper_comparison(training_info.pop(PAPER_COMPARISON, None))
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
        "paper_comparison": comparison,
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
    return _render(card_context(config, bench_results=bench_results, training_info=training_info, model_name=model_name))


def _render(context: dict) -> str:
    text = _environment().get_template(context["method"] + TEMPLATE_SUFFIX).render(**context)
    for marker in ("{{", "}}", "{%", "%}"):
        if marker in text:
            raise ValueError(f"Rendered card still contains {marker!r}; a template is broken.")
    return text


def write_model_card(config, save_directory: str | os.PathLike, *, bench_results=None, training_info=None,
                     model_name: str | None = None) -> Path:  # fmt: skip
    """Write README.md into ``save_directory`` with its inputs beside it: :data:`TRAINING_INFO` and, when the card
    has results, :data:`CARD_RESULTS` (a stale one is removed); the model name defaults to the directory name."""
    save_directory = Path(save_directory)
    context = card_context(config, bench_results=bench_results, training_info=training_info,
                           model_name=model_name or save_directory.resolve().name)  # fmt: skip
    text = _render(context)
    info = json.dumps(training_info or {}, indent=1, sort_keys=True)
    (save_directory / TRAINING_INFO).write_text(info, encoding="utf-8")
    if context["results"]:
        bench = {"results": context["results"]}
        (save_directory / CARD_RESULTS).write_text(json.dumps(bench, indent=1, sort_keys=True), encoding="utf-8")
    else:
        (save_directory / CARD_RESULTS).unlink(missing_ok=True)
    path = save_directory / CARD
    path.write_text(text, encoding="utf-8")
    return path


def _front_matter(text: str) -> dict:
    """The YAML front matter of a card (``---`` ... ``---`` at its top); {} when it has none or it does not parse."""
    import yaml

    if not text.startswith("---\n"):
        return {}
    end = text.find("\n---\n", 3)
    if end < 0:
        return {}
    try:
        meta = yaml.safe_load(text[4:end])
    except yaml.YAMLError:
        return {}
    return meta if isinstance(meta, dict) else {}


def refresh_model_card(folder: str | os.PathLike, training_updates: dict | None = None) -> Path | None:
    """Re-render the hf-spec card of the drafter saved in ``folder`` from its config.json and the inputs stored
    beside the card (:data:`TRAINING_INFO`, :data:`CARD_RESULTS`); returns its path. ``training_updates``: training
    facts to set over the stored ones (e.g. :data:`PAPER_COMPARISON`), stored with them.

    Returns None and touches nothing when ``folder`` has no README.md or hf-spec did not generate it (no
    ``library_name: hf-spec`` in its front matter), and warns when the card was written before its inputs were
    stored beside it (re-rendering would drop its training facts or results)."""
    folder = Path(folder)
    card = folder / CARD
    if not card.is_file():
        return None
    meta = _front_matter(card.read_text(encoding="utf-8"))
    if meta.get("library_name") != "hf-spec":
        return None
    info_path, results_path = folder / TRAINING_INFO, folder / CARD_RESULTS
    needed = [info_path] + ([results_path] if "model-index" in meta else [])
    missing = [path.name for path in needed if not path.is_file()]
    if missing:
        warnings.warn(f"{card} was not re-rendered: it was written without {' and '.join(missing)} beside it, and "
                      "re-rendering would drop what they hold. Fix: save the drafter again with its training_info and "
                      "bench_results (training_scripts/publish_drafter.py --bench for a shipped folder).")  # fmt: skip
        return None
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: the card in {folder} describes a drafter saved there. "
                                "Fix: refresh a folder written by save_pretrained.")  # fmt: skip
    model_type = json.loads(config_path.read_text(encoding="utf-8")).get("model_type")
    config = drafter_classes(model_type)[0].from_pretrained(folder)
    info = {**json.loads(info_path.read_text(encoding="utf-8")), **(training_updates or {})}
    return write_model_card(config, folder, bench_results=results_path if results_path.is_file() else None,
                            training_info=info)
