"""Few-row linear products on this CPU: F.linear against W @ x.T and against the weight packed once for oneDNN
(torch's own operators, as its compiler freezes linear layers), and a plain decoding step with and without
hf_spec.few_row_linears (public API only). Writes results.json beside this script, or to --out.

    python benchmarks/few_row_kernels/run.py [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
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
        try:
            packed_weights = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
        except (AttributeError, RuntimeError):
            packed_weights = None
        for rows in ROWS:
            x = torch.randn(rows, shape[1], dtype=dtype)
            x2 = x if rows > 1 else torch.cat([x, torch.zeros_like(x)])
            linear = median_us(lambda: [torch.nn.functional.linear(x, w) for w in weights]) / len(weights)
            transposed = median_us(lambda: [torch.mm(w, x2.t()) for w in weights]) / len(weights)
            packed = None
            if packed_weights is not None:
                packed = round(median_us(lambda: [torch.ops.mkldnn._linear_pointwise(x, p, None, "none", [], "")
                                                  for p in packed_weights]) / len(weights), 1)  # fmt: skip
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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(Path(__file__).parent))
    args = parser.parse_args()
    result = {"command": "python benchmarks/few_row_kernels/run.py", "date": datetime.now(timezone.utc).isoformat(),
              "threads": torch.get_num_threads()}  # fmt: skip
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        result[name] = {"machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                                    "dtype": name}, "products": products(dtype), "plain_step": plain_steps(dtype)}
        print(name, json.dumps(result[name]["plain_step"]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
