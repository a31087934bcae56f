"""Plain greedy outputs (token ids) of SmolLM2-135M-Instruct for the n-gram policy replay (sim.py).

    python benchmarks/ngram_policy/gen_plain.py OUT.json SKIP N

Prompts SKIP..SKIP+N-1 of MT-bench, HumanEval, GSM8K and the code edits, bf16, 2 threads, 128 new tokens.
Resumable: prompts already in OUT.json are skipped; the file is rewritten after each prompt.
"""
import json, os, sys, time

import torch

from hf_spec.bench.harness import build_prompts
from hf_spec.resources import load_model

out_path, skip, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(2)
model, tok = load_model("smollm2-135m-instruct", dtype=torch.bfloat16)
done = json.load(open(out_path)) if os.path.exists(out_path) else {}
prompts = build_prompts(tok, ["mt_bench", "humaneval", "gsm8k", "code_edit"], limit=n, skip=skip)
for dataset, items in prompts.items():
    for p in items:
        if p["id"] in done:
            continue
        ids = torch.tensor([p["input_ids"]])
        start = time.time()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=128, do_sample=False)
        done[p["id"]] = {"dataset": dataset, "prompt": p["input_ids"], "output": out[0, ids.shape[1]:].tolist()}
        json.dump(done, open(out_path, "w"))
        print(p["id"], len(done[p["id"]]["output"]), f"{time.time() - start:.1f}s", flush=True)
