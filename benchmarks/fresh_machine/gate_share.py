"""How often the n-gram cost gate runs the drafter: cycles, cycles whose drafter was skipped, τ and tok/s per call.

    python benchmarks/fresh_machine/gate_share.py drafters/smollm2-135m-instruct-eagle OTHER_FOLDER [--dtype float32]

Five of fresh_machine.py's prompts (chat, code, math, edit, convert), greedy, 128 new tokens, two calls per drafter
and prompt (the gate carries its measurements over to the next call). Public API only."""

import argparse
import sys
import time
from pathlib import Path

import torch

import hf_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fresh_machine import PROMPTS, TARGET  # noqa: E402

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("folders", nargs="+")
parser.add_argument("--dtype", default="float32")
args = parser.parse_args()
torch.set_num_threads(2)
model, tokenizer = hf_spec.load_packaged_model(TARGET, dtype=getattr(torch, args.dtype))
drafters = {folder: hf_spec.AutoDrafter.from_pretrained(folder, target=model) for folder in args.folders}
for index in (0, 3, 5, 9, 12):
    kind, prompt = PROMPTS[index]
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]  # fmt: skip
    for folder, drafter in drafters.items():
        for call in range(2):
            start = time.perf_counter()
            out = model.generate(ids, assistant_model=drafter, max_new_tokens=128, do_sample=False)
            seconds, stats = time.perf_counter() - start, drafter.last_generation_stats
            new_tokens = out.shape[1] - ids.shape[1]  # fewer than 128 where the answer ends first
            print(f"prompt {index} ({kind}) {Path(folder).name} call {call}: {new_tokens / seconds:.1f} "
                  f"tok/s, tau {stats.tau:.2f}, cycles {stats.cycles}, drafter skipped {stats.drafter_skipped_cycles}",
                  flush=True)  # fmt: skip
