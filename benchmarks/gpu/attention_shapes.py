"""Does a tree-verification attention call cost more the first time its shape is seen? (GPU diagnostic)

The engine benchmark's hf-spec rows ran 2-5x slower in their first timed repeat than in their second, which replays
the same shapes (same prompt, same oracle draws). One suspect is an attention backend that builds a plan per new
shape (cuDNN's SDPA). This times ``torch.nn.functional.scaled_dot_product_attention`` at a Llama-3.1-8B layer's
shape (32 query heads, 8 key/value heads expanded, head dim 128, bf16) with q = 7 tree tokens, an additive tree
mask and a key/value length that is new on every call (``fresh``: 300, 301, ...) or the same on every call
(``repeat``), per backend. Prints a table and writes ``$OUT/attention_shapes.json``.

    python benchmarks/gpu/attention_shapes.py            # on a CUDA machine
"""

import contextlib
import json
import os
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(fn, calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - start) / calls


def main() -> None:
    device, dtype = "cuda", torch.bfloat16
    heads, head_dim, q_len, calls = 32, 128, 7, 60
    backends = {"default": None, "cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "math": SDPBackend.MATH}  # fmt: skip
    q = torch.randn(1, heads, q_len, head_dim, device=device, dtype=dtype)
    kv_max = 300 + 4 * calls * len(backends) + 8
    k = torch.randn(1, heads, kv_max, head_dim, device=device, dtype=dtype)
    v = torch.randn_like(k)
    mask = torch.zeros(1, 1, q_len, kv_max, device=device, dtype=dtype)
    mask[..., -q_len:] = torch.triu(torch.full((q_len, q_len), float("-inf"), device=device, dtype=dtype), 1)
    results = {"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
               "cudnn_sdp_enabled": torch.backends.cuda.cudnn_sdp_enabled()}  # fmt: skip
    offset = 300
    for name, backend in backends.items():
        context = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()

        def call(length):
            return F.scaled_dot_product_attention(q, k[..., :length, :], v[..., :length, :],
                                                  attn_mask=mask[..., kv_max - length:].contiguous())  # fmt: skip

        try:
            with context:
                call(256)  # backend selection / module load
                base = offset
                fresh = timed(lambda i: call(base + i), calls)
                offset += calls + 8
                repeat = timed(lambda i: call(256), calls)
            results[name] = {"fresh_ms": round(fresh, 3), "repeat_ms": round(repeat, 3)}
        except Exception as error:  # a backend that refuses this shape or mask
            results[name] = {"error": f"{type(error).__name__}: {error}"[:200]}
        print(name, results[name], flush=True)
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "attention_shapes.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
