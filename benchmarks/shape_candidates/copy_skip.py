"""HASS and EAGLE with and without ngram_copy_skips_drafter (copy chains of 8, depth 8), held-aside prompts, run
alone on the AMX machine. `python benchmarks/shape_candidates/copy_skip.py [code]`."""
import torch

import hf_spec
from held_aside_timing import compare, held_aside_prompts, load_target

target, tok = load_target()
configs = {"plain": {}, "pl": dict(prompt_lookup_num_tokens=10)}
for name in ("hass", "eagle"):
    for skip in (False, True):
        d = hf_spec.AutoDrafter.from_pretrained(f"drafters/smollm2-135m-instruct-{name}").to(torch.bfloat16)
        d.config.ngram_copy_skips_drafter, d.config.ngram_copy_nodes, d.config.ngram_depth = skip, 8, 8
        configs[f"{name}{'_skip' if skip else ''}"] = dict(assistant_model=d)
compare(target, configs, held_aside_prompts(tok))
