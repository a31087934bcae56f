"""``hf-spec demo``: plain greedy vs the best shipped drafter on the default packaged target."""

from __future__ import annotations

import time
from pathlib import Path

import torch

DEFAULT_TARGET = "smollm2-135m-instruct"
DEMO_PROMPTS = (
    "Explain in a few sentences why the sky is blue, then give one everyday example.",
    "Write a Python function `is_palindrome(text)` that ignores case and punctuation, and show two example calls.",
    "A train travels at 60 miles per hour for 2.5 hours and then at 40 miles per hour for 1.5 hours. "
    "How far does it travel in total? Show your steps.",
)
"""One explanation, one coding and one arithmetic request (the three kinds of the benchmark sets, none taken
from them), fixed before the demo's speed was ever measured."""
SHIPPED_DRAFTERS = Path(__file__).resolve().parents[1] / "drafters"
"""Drafters trained by this project's training scripts, committed with their reproduction command."""


DEMO_DRAFTER_ORDER = ("eagle", "coral", "hass")
"""Shipped drafter families, best first: by the geometric mean of their speedup over plain greedy on the project's
benchmark prompts (EAGLE, CORAL and HASS within a few percent of each other; see benchmarks/README.md); the demo's
own prompts were never used to choose."""


def shipped_drafter_path(target_name: str) -> Path | None:
    """The best shipped drafter for ``target_name`` (first of :data:`DEMO_DRAFTER_ORDER` that ships), or None."""
    for method in DEMO_DRAFTER_ORDER:
        path = SHIPPED_DRAFTERS / f"{target_name}-{method}"
        if (path / "config.json").is_file():
            return path
    return None


def _best_of(fn, repeats: int):
    """(output, best wall seconds) of ``repeats`` calls."""
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return out, best


def run_demo(prompts=DEMO_PROMPTS, max_new_tokens: int = 128, dtype: str = "auto", repeats: int = 2) -> dict:
    """Answer each prompt with plain greedy and with speculative decoding; print and return the comparison.

    Methods alternate per prompt and each keeps its best of ``repeats`` runs, so machine drift hits both
    alike; the speedup is total tokens per second over all prompts, speculative over plain. ``dtype``
    "auto" is bfloat16 on a CPU that computes it natively, else float32 (:mod:`hf_spec.hardware`).
    """
    from .drafters.eagle.model import EagleDrafter
    from .hardware import dtype_name, resolve_dtype
    from .resources import load_packaged_model

    dtype = dtype_name(resolve_dtype(dtype))
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    model, tokenizer = load_packaged_model(DEFAULT_TARGET, dtype=getattr(torch, dtype))
    drafter_path = shipped_drafter_path(DEFAULT_TARGET)
    if drafter_path is not None:
        drafter = EagleDrafter.from_pretrained(drafter_path)
        method = f"hf-spec drafter {drafter_path.name}"
        spec_kwargs = dict(assistant_model=drafter)
    else:
        drafter = None
        method = "transformers' prompt lookup decoding (no trained drafter ships yet)"
        spec_kwargs = dict(prompt_lookup_num_tokens=10)
    common = dict(max_new_tokens=max_new_tokens, do_sample=False)

    print(f"Target: {DEFAULT_TARGET} ({dtype}, CPU threads: {torch.get_num_threads()}); speculative: {method}\n")
    rows, tokens, seconds = [], {"plain": 0, "spec": 0}, {"plain": 0.0, "spec": 0.0}
    for index, prompt in enumerate(prompts):
        input_ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                  return_tensors="pt", return_dict=True)["input_ids"]  # fmt: skip
        if index == 0:  # warm-up of both paths, untimed
            model.generate(input_ids, max_new_tokens=8, do_sample=False)
            model.generate(input_ids, max_new_tokens=8, do_sample=False, **spec_kwargs)
        plain, plain_s = _best_of(lambda: model.generate(input_ids, **common), repeats)
        spec, spec_s = _best_of(lambda: model.generate(input_ids, **common, **spec_kwargs), repeats)
        n_plain, n_spec = plain.shape[1] - input_ids.shape[1], spec.shape[1] - input_ids.shape[1]
        tokens["plain"] += n_plain
        tokens["spec"] += n_spec
        seconds["plain"] += plain_s
        seconds["spec"] += spec_s
        tau = drafter.last_generation_stats.tau if drafter is not None else None
        row = {"prompt": prompt, "identical": bool(torch.equal(plain, spec)), "tau": tau,
               "plain_tokens_per_s": n_plain / plain_s, "speculative_tokens_per_s": n_spec / spec_s}  # fmt: skip
        row["speedup"] = row["speculative_tokens_per_s"] / row["plain_tokens_per_s"]
        rows.append(row)
        print(f"[{index + 1}/{len(prompts)}] {prompt}\n")
        print(tokenizer.decode(spec[0, input_ids.shape[1]:], skip_special_tokens=True).strip() + "\n")
        print(f"  identical to plain greedy: {row['identical']}" + (f", tau {tau:.2f}" if tau is not None else "")
              + f", plain {row['plain_tokens_per_s']:.1f} tok/s, speculative {row['speculative_tokens_per_s']:.1f}"
              f" tok/s -> {row['speedup']:.2f}x\n")  # fmt: skip

    if drafter is not None and drafter.last_generation_stats.controller is not None:
        report = drafter.last_generation_stats.controller
        print(f"Speed controller: using {report['current']!r} after {report['cycles']} timed cycles on this "
              f"machine ({len(report['arms'])} choices: plain steps and the drafter's tree shapes)\n")  # fmt: skip
    plain_rate, spec_rate = tokens["plain"] / seconds["plain"], tokens["spec"] / seconds["spec"]
    result = {"target": DEFAULT_TARGET, "method": method, "dtype": dtype, "prompts": rows,
              "identical": all(r["identical"] for r in rows), "plain_tokens_per_s": plain_rate,
              "speculative_tokens_per_s": spec_rate, "speedup": spec_rate / plain_rate}  # fmt: skip
    if not result["identical"] and dtype != "float32":
        print(
            "(in bf16 a multi-token verification forward rounds differently from one-token decoding, so near-ties "
            "can flip; `hf-spec demo --dtype float32` shows the exact match the tests guarantee)"
        )
    print(
        f"Speed over {len(prompts)} prompts: plain {plain_rate:.1f} tok/s, speculative {spec_rate:.1f} tok/s -> "
        f"speedup {result['speedup']:.2f}x (best of {repeats} runs per prompt and method, "
        f"{tokens['plain']} new tokens)"
    )
    return result
