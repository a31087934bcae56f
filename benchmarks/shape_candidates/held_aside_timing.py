"""Shared by copy_chains.py and copy_skip.py: time `generate()` configurations side by side (interleaved per
prompt, greedy, 128 new tokens, bf16, 2 threads) on held-aside prompts and print tok/s, speedup over plain, τ,
verified nodes and drafting ms per cycle."""
import sys
import time

import torch

from hf_spec.bench.datasets import bench_prompt_ids, load_code_edit, render_prompt
from hf_spec.resources import load_model


def load_target():
    torch.set_num_threads(2)
    return load_model("smollm2-135m-instruct", dtype=torch.bfloat16)


def held_aside_prompts(tok):
    """Code-edit prompts 4..9 with `code` on the command line, else prompts 3..5 of MT-bench, HumanEval, GSM8K."""
    if "code" in sys.argv:
        return [torch.tensor([render_prompt(tok, row)]) for row in load_code_edit()[4:10]]
    return bench_prompt_ids(tok, 3, skip=3)


def compare(target, configs: dict, prompts: list, max_new_tokens: int = 128):
    for kw in configs.values():  # warm-up
        target.generate(prompts[0], max_new_tokens=16, do_sample=False, **kw)
    res = {k: dict(seconds=0.0, tokens=0, cycles=0, nodes=0, accepted=0, draft=0.0) for k in configs}
    for ids in prompts:
        for name, kw in configs.items():
            start = time.perf_counter()
            out = target.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, **kw)
            r = res[name]
            r["seconds"] += time.perf_counter() - start
            r["tokens"] += out.shape[1] - ids.shape[1]
            if "assistant_model" in kw:
                st = kw["assistant_model"].last_generation_stats
                r["cycles"] += st.cycles
                r["nodes"] += sum(st.tree_sizes)
                r["accepted"] += sum(st.accepted_lengths)
                r["draft"] += st.drafter_forward_seconds
    base = res["plain"]["tokens"] / res["plain"]["seconds"]
    for k, r in res.items():
        c, speed = max(r["cycles"], 1), r["tokens"] / r["seconds"]
        print(f"{k:16s} {speed:6.1f} tok/s {speed / base:5.2f}x tau {1 + r['accepted'] / c:4.2f} "
              f"nodes {r['nodes'] / c:5.1f} draft ms/cyc {1000 * r['draft'] / c:4.1f}")
