"""Side-by-side greedy check of trained drafters: τ and wall-clock vs plain generate().

For each held-out prompt (ShareGPT conversations never used for training: the last usable ones
of the packaged file), runs plain greedy ``target.generate`` and ``target.generate(...,
assistant_model=drafter)`` for every drafter, interleaved prompt by prompt so load changes hit
all methods alike, checks the outputs are token-identical, and records τ (mean tokens per
target forward) and time. Writes a json next to the drafters' READMEs::

    OMP_NUM_THREADS=1 python training_scripts/evaluate_drafters.py \\
        --drafters drafters/smollm2-135m-instruct-eagle drafters/smollm2-135m-instruct-hass \\
        --num_prompts 10 --max_new_tokens 128 --dtype bfloat16 --output runs/eval.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import hf_spec
from hf_spec.training.data import FEATURE_DTYPES, load_conversations, load_target


def held_out_prompts(num_prompts: int, max_chars: int = 600) -> list[str]:
    conversations = load_conversations("sharegpt")
    prompts = []
    for convo in reversed(conversations):  # training takes the first N conversations
        first = next(m["content"] for m in convo["messages"] if m["role"] == "user")
        if 20 <= len(first) <= max_chars:
            prompts.append(first)
        if len(prompts) == num_prompts:
            break
    return prompts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target_model", default="smollm2-135m-instruct")
    parser.add_argument("--drafters", nargs="+", required=True)
    parser.add_argument("--num_prompts", type=int, default=10)
    parser.add_argument("--max_new_tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(FEATURE_DTYPES))
    parser.add_argument("--output", default=None)
    parser.add_argument("--tree_depth", type=int, default=None, help="default: the drafter's generation_config")
    parser.add_argument("--tree_top_k", type=int, default=None)
    parser.add_argument("--tree_total_tokens", type=int, default=None)
    args = parser.parse_args(argv)

    target, tokenizer = load_target(args.target_model, FEATURE_DTYPES[args.dtype])
    drafters = {path: hf_spec.EagleDrafter.from_pretrained(path).bind(target).eval() for path in args.drafters}
    prompts = held_out_prompts(args.num_prompts)
    methods = ["plain", *drafters]
    rows = []
    gen = dict(max_new_tokens=args.max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    tree = {k: v for k in ("tree_depth", "tree_top_k", "tree_total_tokens") if (v := getattr(args, k)) is not None}
    with torch.inference_mode():
        warm = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                             return_tensors="pt", return_dict=True)["input_ids"]  # fmt: skip
        for d in [None, *drafters.values()]:
            target.generate(warm, assistant_model=d, **{**gen, "max_new_tokens": 8})
        for i, prompt in enumerate(prompts):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)["input_ids"]  # fmt: skip
            row = {"prompt": prompt[:80], "prompt_tokens": ids.shape[1]}
            outputs = {}
            for m in methods:
                drafter = drafters.get(m)
                start = time.perf_counter()
                out = target.generate(ids, assistant_model=drafter, **gen, **(tree if drafter is not None else {}))
                seconds = time.perf_counter() - start
                outputs[m] = out
                row[m] = {"seconds": seconds, "new_tokens": out.shape[1] - ids.shape[1]}
                if drafter is not None:
                    stats = drafter.last_generation_stats
                    row[m].update(tau=stats.tau, cycles=stats.cycles,
                                  identical=bool(torch.equal(out, outputs["plain"])),
                                  drafter_s=stats.drafter_forward_seconds, target_s=stats.target_forward_seconds)  # fmt: skip
            rows.append(row)
            print(i, {m: {k: round(v, 3) if isinstance(v, float) else v for k, v in row[m].items()} for m in methods},
                  flush=True)  # fmt: skip
    summary = {"target": args.target_model, "dtype": args.dtype, "max_new_tokens": args.max_new_tokens,
               "num_prompts": len(prompts), "threads": torch.get_num_threads(), "tree": tree, "methods": {}}  # fmt: skip
    plain_s = sum(r["plain"]["seconds"] for r in rows)
    plain_tok = sum(r["plain"]["new_tokens"] for r in rows)
    for m in methods:
        seconds = sum(r[m]["seconds"] for r in rows)
        entry = {"seconds": seconds, "tokens_per_s": sum(r[m]["new_tokens"] for r in rows) / seconds,
                 "speedup": plain_s / seconds}  # fmt: skip
        if m != "plain":
            cycles = sum(r[m]["cycles"] for r in rows)
            entry.update(drafter_s=sum(r[m]["drafter_s"] for r in rows), target_s=sum(r[m]["target_s"] for r in rows),
                         tau=sum(r[m]["tau"] * r[m]["cycles"] for r in rows) / cycles,  # pooled over all cycles
                         tau_mean_of_prompts=sum(r[m]["tau"] for r in rows) / len(rows),
                         identical=sum(r[m]["identical"] for r in rows))  # fmt: skip
        summary["methods"][m] = entry
    summary["plain_new_tokens"] = plain_tok
    summary["rows"] = rows
    print(json.dumps(summary["methods"], indent=1))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
