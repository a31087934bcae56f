"""Few-row linear products on this CPU: F.linear against W @ x.T and against the weight packed once (torch's own
operators, as its compiler freezes linear layers: MKL's packed sgemm for float32 where torch has MKL, else oneDNN's
layout); a plain decoding step, and target forwards over the few tokens of a draft tree, with and without
hf_spec.few_row_linears (public API only). Writes results.json beside this script, or to --out.

    python benchmarks/few_row_kernels/run.py [--out DIR] [--dtypes float32,bfloat16]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

import hf_spec

SHAPES = ((1536, 576), (576, 1536), (576, 576), (192, 576), (49152, 576))  # SmolLM2-135M's weights (out, in)
ROWS = (1, 2, 3, 4, 8, 16)


def median_us(fn, repeats: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def products(dtype) -> list[dict]:
    """Per shape and row count, µs of F.linear, of W @ x.T (one row padded to two) and of the packed weight (None
    where this torch has no oneDNN reorder), over 8 distinct weights (4 for the head) so that no weight stays in a
    cache."""
    rows_out = []
    for shape in SHAPES:
        weights = [torch.randn(*shape, dtype=dtype) for _ in range(8 if shape[0] < 10000 else 4)]
        mkl = dtype == torch.float32 and torch._C.has_mkl
        try:
            packed_weights = [torch.ops.mkl._mkl_reorder_linear_weight(w, 4) if mkl
                              else torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]  # fmt: skip
        except (AttributeError, RuntimeError):
            packed_weights = None
        for rows in ROWS:
            x = torch.randn(rows, shape[1], dtype=dtype)
            x2 = x if rows > 1 else torch.cat([x, torch.zeros_like(x)])
            linear = median_us(lambda: [torch.nn.functional.linear(x, w) for w in weights]) / len(weights)
            transposed = median_us(lambda: [torch.mm(w, x2.t()) for w in weights]) / len(weights)
            packed = None
            if packed_weights is not None:
                packed = round(median_us(lambda: [torch.ops.mkl._mkl_linear(x, p, w, None, rows) if mkl
                                                  else torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
                                                  for p, w in zip(packed_weights, weights)]) / len(weights), 1)  # fmt: skip
            rows_out.append({"shape": list(shape), "rows": rows, "f_linear_us": round(linear, 1),
                             "transposed_us": round(transposed, 1), "packed_us": packed})  # fmt: skip
    return rows_out


def plain_steps(dtype, rounds: int = 8) -> dict:
    """ms of one plain greedy token of SmolLM2-135M-Instruct (generate() of 64 tokens on a fixed prompt, best of the
    rounds, alternating), without and inside hf_spec.few_row_linears; and whether the tokens are the same."""
    model, tokenizer = hf_spec.load_packaged_model("smollm2-135m-instruct", dtype=dtype)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "Write a long story about a dragon."}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    times, outputs = {"F.linear": [], "few_row_linears": []}, {}
    for _ in range(rounds):
        for name in times:
            block = hf_spec.few_row_linears(model) if name == "few_row_linears" else contextlib.nullcontext()
            with torch.inference_mode(), block:
                start = time.perf_counter()
                outputs[name] = model.generate(ids, max_new_tokens=64, min_new_tokens=64, do_sample=False)
                times[name].append((time.perf_counter() - start) / 64 * 1000)
    return {"ms_per_token_best": {k: round(min(v), 2) for k, v in times.items()},
            "ms_per_token_median": {k: round(statistics.median(v), 2) for k, v in times.items()},
            "same_tokens": bool(torch.equal(outputs["F.linear"], outputs["few_row_linears"]))}  # fmt: skip


def tree_forwards(dtype, sizes=(1, 2, 3, 4, 6, 8, 12, 16), cache_length: int = 150, settle: int = 40,
                  rounds: int = 25) -> dict:
    """ms of one target forward over n new tokens on a ``cache_length``-token cache (what a verification of an
    n-node tree costs, causal mask; the head over every row), transformers as it is against inside
    hf_spec.few_row_linears once its choices settled (``settle`` untimed rounds); sizes and variants in turns,
    medians over ``rounds``."""
    model, _ = hf_spec.load_packaged_model("smollm2-135m-instruct", dtype=dtype)
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    times = {name: {n: [] for n in sizes} for name in ("F.linear", "few_row_linears")}
    with torch.inference_mode():
        out = model(input_ids=torch.randint(0, vocab, (1, cache_length), generator=g), use_cache=True)
        cache = out.past_key_values

        def forward(n):
            ids = torch.randint(0, vocab, (1, n), generator=g)
            model(input_ids=ids, past_key_values=cache, use_cache=True,
                  position_ids=torch.arange(cache_length, cache_length + n).view(1, -1))  # fmt: skip
            cache.crop(-n)

        with hf_spec.few_row_linears(model):
            for _ in range(settle):
                for n in sizes:
                    forward(n)
        for _ in range(rounds):
            for n in sizes:
                for name in times:
                    block = hf_spec.few_row_linears(model) if name == "few_row_linears" else contextlib.nullcontext()
                    with block:
                        start = time.perf_counter()
                        forward(n)
                        times[name][n].append((time.perf_counter() - start) * 1000)
    return {name: {n: round(statistics.median(v), 2) for n, v in by_size.items()} for name, by_size in times.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(Path(__file__).parent))
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated dtypes to measure")
    args = parser.parse_args()
    result = {"command": " ".join(["python", *sys.argv]), "date": datetime.now(timezone.utc).isoformat(),
              "threads": torch.get_num_threads()}  # fmt: skip
    for name in args.dtypes.split(","):
        dtype = getattr(torch, name)
        result[name] = {"machine": {"cpu": hf_spec.cpu_name(), "torch": torch.__version__, "dtype": name},
                        "products": products(dtype), "plain_step": plain_steps(dtype),
                        "tree_forward_ms": tree_forwards(dtype)}  # fmt: skip
        print(name, json.dumps(result[name]["plain_step"]), json.dumps(result[name]["tree_forward_ms"]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
