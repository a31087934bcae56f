"""Speed / τ harness: the same prompts, greedy, through several decoding methods.

Methods (strings, as on the command line):

- ``plain``: plain greedy ``generate()``; the baseline every other method is compared to.
- ``prompt_lookup`` or ``prompt_lookup:N``: transformers' prompt-lookup decoding
  (``prompt_lookup_num_tokens=N``, default 10).
- ``assisted:<packaged name or path>``: transformers' assisted decoding with a
  same-tokenizer assistant model.
- ``hf_spec:<path>``: an hf_spec drafter, ``target.generate(ids, assistant_model=drafter)``;
  ``hf_spec:<path>:no_router`` runs a CORAL drafter with its LM-head router off
  (``use_router=False``); ``hf_spec:<path>:exit=N`` runs a sorted (S2D) drafter as the fixed
  sub-model of its first N layers (N one of its exits) instead of adaptive early exit;
  ``hf_spec:<path>:ngram=N`` grafts up to N context n-gram nodes into each of a feature
  drafter's trees (``ngram_nodes=N``; the stats then count ``accepted_from_ngram``);
  ``:no_datastore`` drops the drafter's n-gram datastore (corpus continuations) for the run;
  ``:fixed_shape`` drafts the configured tree every cycle (``speed_controller=False``) instead of
  letting the online controller choose among plain steps and the shape candidates
  (:mod:`hf_spec.controller`; the stats record what the controller did);
  ``:depth=N`` / ``:min_prob=F`` set ``tree_depth`` / ``tree_min_prob`` for that method only
  (e.g. an S2D chain's length and confidence stop).
- ``hf_spec:ngram`` or ``hf_spec:ngram:key=value:...``: the weightless context n-gram
  tree drafter (:class:`hf_spec.NGramDrafter`); keys: ``depth`` (max_depth), ``tokens``
  (num_draft_tokens), ``branches`` (max_branches), ``max_match``, ``min_match``,
  ``occurrences`` (max_occurrences), ``node_cost`` (a decimal, 0: fixed-size trees), e.g.
  ``hf_spec:ngram:depth=8:tokens=16``; ``datastore=<folder or file>``
  adds an n-gram datastore (e.g. a drafter folder's ``ngram_datastore.safetensors``).

τ (mean tokens per target forward) is measured the same way for every method, by counting
the target's forward calls with a forward pre-hook: a first forward that sees only the
prompt (a pure prefill, which yields one token) is left out together with its token; a
first forward that also verifies draft tokens (transformers' assisted decoding) is a
verification cycle and counts. Plain greedy gives τ = 1 by construction.
"""

from __future__ import annotations

import datetime
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from tqdm.auto import tqdm

from ..hardware import DTYPE_NAMES, machine_info
from ..timing import clock

__all__ = [
    "BenchSettings",
    "Method",
    "ForwardCounter",
    "parse_method",
    "load_model",
    "build_prompts",
    "run_benchmark",
    "summarize",
    "machine_info",
]

DTYPES = DTYPE_NAMES  # the names the --dtype options take


@dataclass
class BenchSettings:
    """Generation settings shared by every method (greedy, same budget)."""

    max_new_tokens: int = 128
    warmup_tokens: int = 16
    repeats: int = 1
    """Timed runs of each method on each prompt, interleaved (round r runs the methods in the reverse order of
    round r - 1); a row keeps the fastest (``seconds``) and all of them (``seconds_runs``). Greedy outputs and
    statistics come from the first run; more runs only cut the timing noise of a shared machine."""


class ForwardCounter:
    """Counts a model's transformer passes and the input length of the first.

    The pre-hook sits on the base model (``model.base_model``), which every method runs once
    per target pass: transformers' own decoding through ``model.forward`` and hf-spec's tree
    loop, which calls the base model directly and applies the LM head itself.
    """

    def __init__(self, model: torch.nn.Module):
        self.calls = 0
        self.first_input_len: int | None = None
        self._handle = getattr(model, "base_model", model).register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        if self.calls == 0:
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is None and kwargs.get("inputs_embeds") is not None:
                ids = kwargs["inputs_embeds"][..., 0]
            self.first_input_len = None if ids is None else int(ids.shape[-1])
        self.calls += 1

    def reset(self) -> None:
        self.calls = 0
        self.first_input_len = None

    def remove(self) -> None:
        self._handle.remove()

    def counted(self, prompt_len: int, new_tokens: int) -> tuple[int, int]:
        """``(tokens, forwards)`` that count for τ: a pure-prefill first forward and its
        token are left out."""
        if self.first_input_len is not None and self.first_input_len <= prompt_len:
            return new_tokens - 1, self.calls - 1
        return new_tokens, self.calls


@dataclass
class Method:
    """A named decoding method: ``generate_kwargs`` go to ``target.generate``.

    ``stats`` (optional) returns the method's own statistics after a call, e.g. an
    hf_spec drafter's acceptance by draft position.
    """

    name: str
    generate_kwargs: dict[str, Any] = field(default_factory=dict)
    stats: Callable[[], dict[str, Any]] | None = None
    info: dict[str, Any] = field(default_factory=dict)


def load_model(name_or_path: str, dtype: torch.dtype = torch.bfloat16):
    """``(model, tokenizer_or_None)`` from a packaged model name or a local HF directory
    (:func:`hf_spec.resources.load_model`; a directory without a tokenizer gives None)."""
    from ..resources import load_model as load

    return load(name_or_path, dtype=dtype, tokenizer_required=False)


NGRAM_OPTIONS = {"depth": "max_depth", "tokens": "num_draft_tokens", "branches": "max_branches",
                 "max_match": "max_match", "min_match": "min_match", "occurrences": "max_occurrences",
                 "copy": "copy_nodes", "copy_depth": "copy_depth", "node_cost": "node_cost"}  # fmt: skip
"""``hf_spec:ngram:key=value`` option keys -> :class:`hf_spec.NGramDrafterConfig` arguments."""


def _ngram_drafter(spec: str, name: str):
    """An :class:`hf_spec.NGramDrafter` from ``ngram[:key=value]...``."""
    from ..drafters.datastore import DATASTORE_FILE, NGramDatastore
    from ..drafters.ngram.model import NGramDrafter

    options, datastore = {}, None
    for option in spec.split(":")[1:]:
        key, eq, value = option.partition("=")
        if key == "datastore":
            file = os.path.join(value, DATASTORE_FILE) if os.path.isdir(value) else value
            if not os.path.isfile(file):
                raise ValueError(f"{name}: no n-gram datastore at {value!r} (a drafter folder with {DATASTORE_FILE}, "
                                 "or the file itself)")  # fmt: skip
            datastore = NGramDatastore.load(file)
            continue
        number = value.isdigit() or (key == "node_cost" and value.replace(".", "", 1).isdigit())
        if key not in NGRAM_OPTIONS or not eq or not number:
            raise ValueError(f"{name}: unknown n-gram option {option!r}; use key=N with key in {sorted(NGRAM_OPTIONS)} "
                             "(node_cost takes a decimal, e.g. node_cost=0.02)")  # fmt: skip
        options[NGRAM_OPTIONS[key]] = float(value) if key == "node_cost" else int(value)
    return NGramDrafter(datastore=datastore, **options), options


def drafter_stats(drafter) -> Callable[[], dict[str, Any]]:
    """The per-call statistics of an hf-spec drafter's last ``generate()`` (a :class:`Method`'s ``stats``)."""

    def stats() -> dict[str, Any]:
        s = drafter.last_generation_stats
        return {
            "drafter_tau": float(s.tau),
            "cycles": s.cycles,
            "drafter_forward_seconds": s.drafter_forward_seconds,
            "target_forward_seconds": s.target_forward_seconds,
            "accepted_lengths": list(s.accepted_lengths),
            "accepted_from_ngram": s.accepted_from_ngram,
            "drafter_skipped_cycles": s.drafter_skipped_cycles,
            "verified_tokens": sum(s.tree_sizes),
            "acceptance_by_position": [float(x) for x in s.acceptance_by_position()],
            **({"exit_counts": list(s.early_exits.exit_counts)} if s.early_exits is not None else {}),
            **({"controller": dict(s.controller)} if s.controller is not None else {}),
        }

    return stats


def _hf_spec_method(path: str, dtype: torch.dtype, name: str, tree: dict | None = None, device=None) -> Method:
    from transformers import AutoModel  # the drafter classes are registered with it (hf_spec.drafters)

    options_text = []
    while ":" in path and re.fullmatch(r"no_router|no_datastore|fixed_shape|exit=\d+|ngram=\d+|depth=\d+|min_prob=[0-9.]+",
                                       path.rsplit(":", 1)[1]):
        path, option = path.rsplit(":", 1)
        options_text.append(option)
    no_router = "no_router" in options_text
    ngram_options = None
    if path.split(":")[0] == "ngram" and not os.path.isdir(path):
        drafter, ngram_options = _ngram_drafter(path, name)
    else:
        drafter = AutoModel.from_pretrained(path, dtype=dtype).eval()
    if device is not None:
        drafter = drafter.to(device)
    if "no_datastore" in options_text:
        drafter.ngram_datastore = None
    fixed_exit = next((int(o.split("=")[1]) for o in options_text if o.startswith("exit=")), None)
    if fixed_exit is not None:
        if not hasattr(drafter, "use_fixed_exit"):
            raise ValueError(f"{name}: ':exit=N' needs a sorted (S2D) drafter, {path} holds a {type(drafter).__name__}")
        drafter.use_fixed_exit(fixed_exit)

    stats = drafter_stats(drafter)

    tree = {k: v for k, v in (tree or {}).items() if v is not None}
    options = {"use_router": False} if no_router else {}
    if "fixed_shape" in options_text:  # the configured tree every cycle: no speed controller
        options["speed_controller"] = False
    for option in options_text:  # per-method generate options; tree ones override the command line's
        key, _, value = option.partition("=")
        if key == "depth":
            tree["tree_depth"] = int(value)
        elif key == "min_prob":
            tree["tree_min_prob"] = float(value)
        elif key == "ngram":
            options["ngram_nodes"] = int(value)
    info = {"drafter": path, **tree, **options, "ngram_datastore": drafter.ngram_datastore is not None,
            "auto_tree_shape": bool(getattr(drafter.config, "tree_shape_candidates", None))
            and getattr(drafter.config, "auto_tree_shape", None) is not False and not tree and "ngram_nodes" not in options}  # fmt: skip
    if ngram_options is not None:
        info.update(drafter="ngram", **{k: getattr(drafter.config, k) for k in (
            "max_match", "min_match", "num_draft_tokens", "max_depth", "max_branches", "max_occurrences", "node_cost")})  # fmt: skip
    if fixed_exit is not None:
        info["fixed_exit"] = fixed_exit
    return Method(name, {"assistant_model": drafter, **tree, **options}, stats, info)


def parse_method(spec: str, dtype: torch.dtype = torch.bfloat16, tokenizer=None, tree: dict | None = None,
                 device=None) -> Method:
    """Build a :class:`Method` from its command-line spelling (see the module docstring).

    ``tree``: ``tree_depth`` / ``tree_top_k`` / ``tree_total_tokens`` for hf_spec drafters
    (None values keep the drafter's own defaults); ``device``: where drafters and assistants
    go (the target's device; None leaves them on the CPU).
    """
    kind, _, arg = spec.partition(":")
    if kind == "plain" and not arg:
        return Method("plain")
    if kind == "prompt_lookup":
        n = int(arg) if arg else 10
        return Method(spec, {"prompt_lookup_num_tokens": n}, info={"prompt_lookup_num_tokens": n})
    if kind == "assisted" and arg:
        assistant, assistant_tokenizer = load_model(arg, dtype)
        if device is not None:
            assistant = assistant.to(device)
        if tokenizer is not None and assistant_tokenizer is not None:
            if tokenizer.get_vocab() != assistant_tokenizer.get_vocab():
                raise ValueError(f"assistant {arg!r} does not share the target's tokenizer")
        gen = assistant.generation_config
        info = {
            "assistant": arg,
            "num_assistant_tokens": gen.num_assistant_tokens,
            "num_assistant_tokens_schedule": gen.num_assistant_tokens_schedule,
            "assistant_confidence_threshold": gen.assistant_confidence_threshold,
        }
        return Method(spec, {"assistant_model": assistant}, info=info)
    if kind == "hf_spec" and arg:
        return _hf_spec_method(arg, dtype, spec, tree, device)
    raise ValueError(
        f"Unknown method {spec!r}; use plain, prompt_lookup[:N], assisted:<model>, hf_spec:<drafter path> or hf_spec:ngram[:key=N]"
    )


def build_prompts(tokenizer, datasets: Sequence[str], limit: int | None = None, skip: int = 0) -> dict[str, list[dict]]:
    """Render each data set's first turns with the tokenizer's chat template: ``limit`` prompts of
    each set after its first ``skip`` (``skip`` > 0 measures on prompts that tuning never saw).

    Returns ``{dataset: [{"id", "input_ids"}, ...]}``, the harness's input format
    (pre-tokenized prompts can be passed to :func:`run_benchmark` directly).
    """
    from .datasets import ALL_DATASETS, render_prompt

    prompts = {}
    for name in datasets:
        if name not in ALL_DATASETS:
            raise ValueError(f"Unknown data set {name!r}; known: {sorted(ALL_DATASETS)}")
        records = ALL_DATASETS[name]()[skip:][:limit]
        prompts[name] = [{"id": r["id"], "input_ids": render_prompt(tokenizer, r)} for r in records]
    return prompts


def _generate(model, input_ids: torch.Tensor, method: Method, max_new_tokens: int) -> torch.Tensor:
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        **method.generate_kwargs,
    )
    return out[0, input_ids.shape[1] :]


@torch.inference_mode()
def run_benchmark(
    model,
    prompts: dict[str, list[dict]],
    methods: Sequence[Method],
    settings: BenchSettings = BenchSettings(),
    tokenizer=None,
) -> list[dict]:
    """Run every method on every prompt, interleaved per prompt; return one row per method and prompt.

    ``prompts`` maps a data-set name to ``[{"id": str, "input_ids": list[int]}, ...]``.
    ``methods`` must include ``plain`` (the reference for speedup and token identity).
    Each method first gets one warm-up generation (``settings.warmup_tokens`` tokens) on
    the first prompt. Within a prompt the method order rotates, so slow drift of the
    machine hits every method alike. Prompts go to the target's device; on a GPU each timing
    waits for the device's queue (:func:`hf_spec.timing.clock`).
    """
    if not any(m.name == "plain" for m in methods):
        raise ValueError("methods must include 'plain', the reference for speedup and identity")
    if settings.repeats < 1:
        raise ValueError(f"repeats must be >= 1 (timed runs per method and prompt), got {settings.repeats}")
    methods = list(methods)
    counter = ForwardCounter(model)
    rows: list[dict] = []
    try:
        first = next(p for ps in prompts.values() for p in ps)
        device = next(model.parameters()).device
        warm = torch.tensor([first["input_ids"]], device=device)
        for method in methods:
            _generate(model, warm, method, settings.warmup_tokens)

        jobs = [(ds, p) for ds, ps in prompts.items() for p in ps]
        bar = tqdm(total=len(jobs) * len(methods) * settings.repeats, desc="bench", unit="gen")
        for i, (dataset, prompt) in enumerate(jobs):
            input_ids = torch.tensor([prompt["input_ids"]], device=device)
            order = methods[i % len(methods) :] + methods[: i % len(methods)]
            outputs, timed = {}, {}
            runs = [(r, method) for r in range(settings.repeats) for method in (order if r % 2 == 0 else order[::-1])]
            for round_, method in runs:
                counter.reset()
                start = clock(device)
                out = _generate(model, input_ids, method, settings.max_new_tokens)
                seconds = clock(device) - start
                bar.update()
                if round_:  # a timing repeat of the same greedy generation
                    row = timed[method.name]
                    row["seconds_runs"].append(seconds)
                    row["seconds"] = min(row["seconds_runs"])
                    continue
                n = int(out.shape[0])
                tau_tokens, tau_forwards = counter.counted(int(input_ids.shape[1]), n)
                row = {
                    "dataset": dataset,
                    "id": prompt["id"],
                    "method": method.name,
                    "prompt_tokens": int(input_ids.shape[1]),
                    "new_tokens": n,
                    "seconds": seconds,
                    "seconds_runs": [seconds],
                    "target_forwards": counter.calls,
                    "tau_tokens": tau_tokens,
                    "tau_forwards": tau_forwards,
                    "tau": tau_tokens / tau_forwards if tau_forwards > 0 else None,
                }
                if method.stats is not None:
                    row.update(method.stats())
                if tokenizer is not None:
                    row["text"] = tokenizer.decode(out, skip_special_tokens=False)
                outputs[method.name] = out.tolist()
                rows.append(row)
                timed[method.name] = row
                bar.set_postfix_str(f"{dataset} {method.name} {n / seconds:.1f} tok/s")
            for row in rows[-len(methods) :]:
                row["identical_to_plain"] = outputs[row["method"]] == outputs["plain"]
        bar.close()
    finally:
        counter.remove()
    return rows


def _mean_by_position(lists: list[list[float]]) -> list[float] | None:
    if not lists:
        return None
    depth = max(len(x) for x in lists)
    return [
        sum(x[i] for x in lists if len(x) > i) / max(1, sum(1 for x in lists if len(x) > i)) for i in range(depth)
    ]


def summarize(rows: list[dict], methods: Sequence[str]) -> dict[str, dict[str, dict]]:
    """Aggregate per data set (and ``all``) and method.

    ``tokens_per_s`` = total new tokens / total seconds; ``speedup`` = that over plain's;
    ``wall_speedup`` = plain's total seconds / the method's (equal to ``speedup`` when the
    outputs are identical); ``median_speedup`` = median over prompts of the method's
    tokens/s over plain's on the same prompt (robust to bursts of load); ``tau`` = total tokens / total target forwards (pure prefills
    excluded); ``identical`` = outputs token-identical to plain, out of ``prompts``;
    ``draft_ms_per_cycle`` / ``verify_ms_per_cycle`` (hf_spec drafters) = the drafter's / the
    target's forward time per drafting-verification cycle; ``verified_per_cycle`` = tree tokens
    (root included) per verification forward, what sets its cost.
    """
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    summary: dict[str, dict[str, dict]] = {}
    for ds in [*datasets, "all"]:
        summary[ds] = {}
        for m in methods:
            sel = [r for r in rows if r["method"] == m and (ds == "all" or r["dataset"] == ds)]
            tokens = sum(r["new_tokens"] for r in sel)
            seconds = sum(r["seconds"] for r in sel)
            tau_tokens = sum(r["tau_tokens"] for r in sel)
            tau_calls = sum(r["tau_forwards"] for r in sel)
            summary[ds][m] = {
                "prompts": len(sel),
                "new_tokens": tokens,
                "seconds": seconds,
                "tokens_per_s": tokens / seconds if seconds else None,
                "tau": tau_tokens / tau_calls if tau_calls else None,
                "identical": sum(bool(r.get("identical_to_plain")) for r in sel),
                "acceptance_by_position": _mean_by_position(
                    [r["acceptance_by_position"] for r in sel if r.get("acceptance_by_position")]
                ),
            }
            cycles = sum(r.get("cycles") or 0 for r in sel)
            for key, field_name in (("draft_ms_per_cycle", "drafter_forward_seconds"),
                                    ("verify_ms_per_cycle", "target_forward_seconds")):  # fmt: skip
                timed = sum(r.get(field_name) or 0.0 for r in sel)
                summary[ds][m][key] = 1000 * timed / cycles if cycles else None
            verified = sum(r.get("verified_tokens") or 0 for r in sel)
            summary[ds][m]["verified_per_cycle"] = verified / cycles if cycles and verified else None
        base = summary[ds].get("plain")
        for m, s in summary[ds].items():
            s["speedup"] = s["tokens_per_s"] / base["tokens_per_s"] if base and s["tokens_per_s"] else None
            s["wall_speedup"] = base["seconds"] / s["seconds"] if base and s["seconds"] else None
            s["median_speedup"] = _median_paired_speedup(rows, ds, m)
    return summary


def _median_paired_speedup(rows: list[dict], dataset: str, method: str) -> float | None:
    rate = {(r["dataset"], r["id"], r["method"]): r["new_tokens"] / r["seconds"] for r in rows if r["seconds"] > 0}
    ratios = sorted(
        rate[(d, i, method)] / rate[(d, i, "plain")]
        for (d, i, m) in rate
        if m == method and (dataset == "all" or d == dataset) and (d, i, "plain") in rate
    )
    if not ratios:
        return None
    mid = len(ratios) // 2
    return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2


def run_metadata(settings: BenchSettings, dtype: torch.dtype, command: str | None = None, device=None,
                 **extra) -> dict[str, Any]:
    """Command line, date (when this is called: the end of a run), machine and settings."""
    return {
        "command": command or shlex.join([os.path.basename(sys.argv[0]), *sys.argv[1:]]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(dtype, device),
        "settings": {"max_new_tokens": settings.max_new_tokens, "warmup_tokens": settings.warmup_tokens,
                     "repeats": settings.repeats, "do_sample": False, **extra},
    }
