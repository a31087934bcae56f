"""Wall time of one cached decode step of Qwen2.5-Coder-0.5B cut to its first N layers with a 16k-row draft
head (what an S2D exit after layer N costs), beside one step of each Qwen target (full head).

    python benchmarks/s2d-qwen/cost_per_exit.py --dtype bfloat16 > benchmarks/s2d-qwen/cost_per_exit.json
"""

import argparse
import json
import time

import torch
import transformers
from transformers import DynamicCache

from hf_spec import cpu_name, load_packaged_model


def step_ms(model, head_rows=None, repeats=30):
    ids = torch.randint(0, 1000, (1, 64))
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model.model(input_ids=ids, past_key_values=cache, use_cache=True)
        head = model.lm_head.weight[:head_rows] if head_rows else model.lm_head.weight
        times = []
        for i in range(repeats):
            t = time.perf_counter()
            h = model.model(input_ids=ids[:, i % 64 : i % 64 + 1], past_key_values=cache, use_cache=True).last_hidden_state
            torch.nn.functional.linear(h, head)
            times.append(time.perf_counter() - t)
            cache.crop(-1)  # drop the step just timed
    return 1000 * sorted(times)[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--layers", type=int, nargs="+", default=[2, 4, 6, 8, 12, 16, 24])
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    out = {"date": time.strftime("%Y-%m-%d"), "machine": f"{cpu_name()}, torch "
           f"{torch.__version__}, transformers {transformers.__version__}", "dtype": args.dtype, "threads": torch.get_num_threads(), "targets": {}, "exits": {}}
    for name in ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"):
        model = load_packaged_model(name, dtype=dtype)[0].eval()
        out["targets"][name] = step_ms(model)
        if name.startswith("qwen2.5-coder-0.5b"):
            layers = model.model.layers
            for n in args.layers:
                model.model.layers = layers[:n]
                model.config.num_hidden_layers = n
                out["exits"][n] = step_ms(model, head_rows=16384)
            model.model.layers = layers
        del model
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
