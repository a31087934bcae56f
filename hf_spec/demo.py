"""``hf-spec demo``: plain greedy vs the best shipped drafter on the default packaged target."""

from __future__ import annotations

import time
from pathlib import Path

import torch

DEFAULT_TARGET = "smollm2-135m-instruct"
DEFAULT_PROMPT = "Explain in a few sentences why the sky is blue, then give one everyday example."
SHIPPED_DRAFTERS = Path(__file__).resolve().parents[1] / "drafters"
"""Drafters trained by this project's training scripts, committed with their reproduction command."""


def shipped_drafter_path(target_name: str) -> Path | None:
    """The best shipped drafter for ``target_name`` (HASS before EAGLE), or None."""
    for method in ("hass", "eagle"):
        path = SHIPPED_DRAFTERS / f"{target_name}-{method}"
        if (path / "config.json").is_file():
            return path
    return None


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def run_demo(prompt: str = DEFAULT_PROMPT, max_new_tokens: int = 128, dtype: str = "bfloat16", repeats: int = 2) -> dict:
    """Answer ``prompt`` with plain greedy and with speculative decoding; print and return the comparison."""
    import hf_spec
    from hf_spec.resources import load_packaged_model

    model, tokenizer = load_packaged_model(DEFAULT_TARGET, dtype=getattr(torch, dtype))
    messages = [{"role": "user", "content": prompt}]
    input_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    if not isinstance(input_ids, torch.Tensor):  # some tokenizers return a BatchEncoding
        input_ids = input_ids["input_ids"]
    common = dict(max_new_tokens=max_new_tokens, do_sample=False)

    drafter_path = shipped_drafter_path(DEFAULT_TARGET)
    if drafter_path is not None:
        drafter = hf_spec.EagleDrafter.from_pretrained(drafter_path)
        method = f"hf-spec drafter {drafter_path.name}"
        spec_kwargs = dict(assistant_model=drafter)
    else:
        drafter = None
        method = "transformers' prompt lookup decoding (no trained drafter ships yet)"
        spec_kwargs = dict(prompt_lookup_num_tokens=10)

    model.generate(input_ids, max_new_tokens=8, do_sample=False)  # warm-up
    plain_times, spec_times = [], []
    for _ in range(repeats):  # interleaved, so machine drift hits both alike
        plain, seconds = _timed(lambda: model.generate(input_ids, **common))
        plain_times.append(seconds)
        spec, seconds = _timed(lambda: model.generate(input_ids, **common, **spec_kwargs))
        spec_times.append(seconds)
    plain_s, spec_s = min(plain_times), min(spec_times)
    new_tokens = plain.shape[1] - input_ids.shape[1]
    tau = drafter.last_generation_stats.tau if drafter is not None else None
    result = {
        "target": DEFAULT_TARGET,
        "method": method,
        "dtype": dtype,
        "new_tokens": int(new_tokens),
        "identical": bool(torch.equal(plain, spec)),
        "plain_tokens_per_s": new_tokens / plain_s,
        "speculative_tokens_per_s": (spec.shape[1] - input_ids.shape[1]) / spec_s,
        "speedup": plain_s / spec_s,
        "tau": tau,
    }
    text = lambda ids: tokenizer.decode(ids[0, input_ids.shape[1]:], skip_special_tokens=True)  # noqa: E731
    print(f"Target: {DEFAULT_TARGET} ({dtype}, CPU threads: {torch.get_num_threads()})")
    print(f"Prompt: {prompt}\n")
    print(f"--- plain greedy generate() ---\n{text(plain)}\n")
    print(f"--- {method} ---\n{text(spec)}\n")
    print(f"Identical outputs: {result['identical']}")
    if not result["identical"] and dtype != "float32":
        print(
            "  (in bf16 a multi-token verification forward rounds differently from one-token decoding, so near-ties "
            "can flip; `hf-spec demo --dtype float32` shows the exact match the tests guarantee)"
        )
    if tau is not None:
        print(f"Mean accepted length tau: {tau:.2f} tokens per target forward")
    print(
        f"Speed: plain {result['plain_tokens_per_s']:.1f} tok/s, speculative "
        f"{result['speculative_tokens_per_s']:.1f} tok/s -> speedup {result['speedup']:.2f}x "
        f"(best of {repeats} interleaved runs, {new_tokens} new tokens)"
    )
    return result
