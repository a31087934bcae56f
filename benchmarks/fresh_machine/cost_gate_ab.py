"""Does the n-gram cost gate pay? A shipped folder as it ships (``ngram_cost_gate`` on) against the same folder
loaded with ``ngram_cost_gate=False`` (the drafter runs every cycle, the n-gram trie grafted in), the speed
controller on in both, interleaved with plain greedy and transformers' prompt lookup.

    python benchmarks/fresh_machine/cost_gate_ab.py float32 [eagle]
    python benchmarks/fresh_machine/cost_gate_ab.py bfloat16 [eagle]

Prompts held aside from fresh_machine.py's set (which no choice may use), as token ids in
cost_gate_prompts.json: the demo's three, prompts 45-46 of MT-bench, HumanEval and GSM8K and code edits 10-11 (the
``hf-spec bench`` sets, each in the target's chat template). 128 new tokens, greedy, best of 2 (second round in
reverse order). Public API only."""

import json
import math
import sys
import time
from pathlib import Path

import torch

import hf_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fresh_machine import geomean  # noqa: E402

dtype = sys.argv[1]
folder = f"drafters/smollm2-135m-instruct-{sys.argv[2] if len(sys.argv) > 2 else 'eagle'}"
torch.set_num_threads(2)
model, tok = hf_spec.load_packaged_model("smollm2-135m-instruct", dtype=getattr(torch, dtype))
on = hf_spec.AutoDrafter.from_pretrained(folder, target=model)
off = hf_spec.AutoDrafter.from_pretrained(folder, target=model, ngram_cost_gate=False)
saved = json.loads((Path(__file__).parent / "cost_gate_prompts.json").read_text())["prompts"]
prompts = [(row["kind"], torch.tensor([row["input_ids"]])) for row in saved]
methods = {"plain": {}, "prompt_lookup": dict(prompt_lookup_num_tokens=10), "gate_on": dict(assistant_model=on),
           "gate_off": dict(assistant_model=off)}
for kwargs in methods.values():  # warm-up, untimed
    model.generate(prompts[0][1], max_new_tokens=8, do_sample=False, **kwargs)
speedups = {k: [] for k in methods}
for i, (kind, ids) in enumerate(prompts):
    best, outs = {}, {}
    for order in (list(methods), list(methods)[::-1]):
        for k in order:
            start = time.perf_counter()
            outs[k] = model.generate(ids, max_new_tokens=128, do_sample=False, **methods[k])
            best[k] = min(best.get(k, math.inf), time.perf_counter() - start)
    line = f"{i} {kind} new={outs['plain'].shape[1] - ids.shape[1]}"
    for k in methods:
        speedups[k].append(best["plain"] / best[k])
        line += f" {k} {best['plain'] / best[k]:.2f}"
    skipped = [d.last_generation_stats.drafter_skipped_cycles / max(1, d.last_generation_stats.cycles) for d in (on, off)]
    same = all(torch.equal(outs["plain"], o) for o in outs.values())
    print(line, "drafter skipped on/off %.2f %.2f" % tuple(skipped), "identical", same, flush=True)
geo = {k: geomean(v) for k, v in speedups.items()}
print(dtype, folder, {k: round(v, 3) for k, v in geo.items()}, "gate_off/gate_on", round(geo["gate_off"] / geo["gate_on"], 3))
