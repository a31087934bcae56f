"""Copy cycles (exploration on held-aside prompts, run alone on the AMX machine; README.md there has the numbers):
the shipped HASS folder with the drafter skipped on copy cycles and copy chains of 8/16/24 nodes, beside plain and
prompt lookup. `python benchmarks/shape_candidates/copy_chains.py [code]` (code: code-edit prompts 4..9, else
prompts 3..5 of MT-bench, HumanEval, GSM8K)."""
import torch

import hf_spec
from held_aside_timing import compare, held_aside_prompts, load_target

target, tok = load_target()
variants = {"skip_c8_d8": (True, 8, 8), "skip_c16_d16": (True, 16, 16), "skip_c24_d24": (True, 24, 24),
            "noskip_c16_d16": (False, 16, 16)}  # fmt: skip
configs = {"plain": {}, "pl": dict(prompt_lookup_num_tokens=10)}
for name, (skip, copy, depth) in variants.items():
    d = hf_spec.AutoDrafter.from_pretrained("drafters/smollm2-135m-instruct-hass").to(torch.bfloat16)
    d.config.ngram_copy_skips_drafter, d.config.ngram_copy_nodes, d.config.ngram_depth = skip, copy, depth
    configs[name] = dict(assistant_model=d)
compare(target, configs, held_aside_prompts(tok))
