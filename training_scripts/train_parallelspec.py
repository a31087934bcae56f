"""Train a ParallelSpec drafter (EAGLE-ParallelSpec, k=4 [MASK] tokens) for a target model.

Reproduction (paper A.2 settings; the global batch of 32 is 4 per device x 8 accumulation):

    python training_scripts/train_parallelspec.py \
        --target_model HuggingFaceTB/SmolLM2-135M-Instruct --dataset data/sharegpt.jsonl \
        --output_dir runs/parallelspec-smollm2 --num_mask_tokens 4 --num_parallel_groups 4 \
        --learning_rate 5e-5 --adam_beta2 0.95 --weight_decay 0 --num_train_epochs 40 \
        --per_device_train_batch_size 4 --gradient_accumulation_steps 8 --max_length 1024

``--dataset``: a JSON-lines file (or ``datasets.load_from_disk`` directory) whose rows have
``text`` (tokenized here) or ``input_ids``. The target runs once over the data and its
features are cached as safetensors next to the output (``--feature_cache``); later runs and
resumed runs read the cache. Training resumes from the last Trainer checkpoint in
``--output_dir``. Every hyper-parameter of ``ParallelTrainingArguments`` is a flag.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser
from transformers.trainer_utils import get_last_checkpoint

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import hf_spec  # noqa: E402
from hf_spec.training.parallel import ParallelTrainer, ParallelTrainingArguments, collate_features  # noqa: E402


@dataclass
class ScriptArguments:
    target_model: str = field(metadata={"help": "Target model name or path."})
    dataset: str = field(metadata={"help": "JSON-lines file or load_from_disk directory (text or input_ids)."})
    num_mask_tokens: int = field(default=4, metadata={"help": "k [MASK] tokens (paper: 4, group size 5)."})
    tree_widths: str = field(default="4,2,2,1,1", metadata={"help": "Default static tree widths per depth."})
    max_length: int = field(default=1024, metadata={"help": "Tokens per training sequence."})
    max_samples: int | None = field(default=None, metadata={"help": "Use only the first N rows."})
    feature_cache: str | None = field(default=None, metadata={"help": "safetensors cache of target features."})
    dtype: str = field(default="bfloat16", metadata={"help": "Target dtype for feature extraction."})


def build_parser() -> HfArgumentParser:
    return HfArgumentParser((ScriptArguments, ParallelTrainingArguments))


def load_rows(script, tokenizer):
    import datasets

    if os.path.isdir(script.dataset):
        data = datasets.load_from_disk(script.dataset)
    else:
        data = datasets.load_dataset("json", data_files=script.dataset, split="train")
    if script.max_samples:
        data = data.select(range(min(script.max_samples, len(data))))
    for row in data:
        ids = row["input_ids"] if "input_ids" in row else tokenizer()(row["text"])["input_ids"]
        if len(ids) >= 3:
            yield torch.as_tensor(ids[: script.max_length], dtype=torch.long)


@torch.no_grad()
def extract_features(script, target, tokenizer) -> list[dict]:
    """Target features of every row, computed once and cached as safetensors."""
    from safetensors.torch import load_file, save_file

    if script.feature_cache and os.path.exists(script.feature_cache):
        tensors = load_file(script.feature_cache)
        count = len([k for k in tensors if k.startswith("input_ids.")])
        return [{"input_ids": tensors[f"input_ids.{i}"], "hidden_states": tensors[f"hidden_states.{i}"]}
                for i in range(count)]  # fmt: skip
    rows = []
    for ids in load_rows(script, tokenizer):
        feats = target.base_model(input_ids=ids.view(1, -1).to(target.device)).last_hidden_state[0]
        rows.append({"input_ids": ids, "hidden_states": feats.float().cpu()})
    if script.feature_cache:
        tensors = {}
        for i, row in enumerate(rows):
            tensors[f"input_ids.{i}"] = row["input_ids"].contiguous()
            tensors[f"hidden_states.{i}"] = row["hidden_states"].contiguous()
        save_file(tensors, script.feature_cache)
    return rows


def main(argv=None) -> None:
    script, args = build_parser().parse_args_into_dataclasses(argv)
    tokenizer = functools.cache(lambda: AutoTokenizer.from_pretrained(script.target_model))  # only for text rows
    target = AutoModelForCausalLM.from_pretrained(script.target_model, dtype=getattr(torch, script.dtype)).eval()
    target.requires_grad_(False)
    rows = extract_features(script, target, tokenizer)
    target = target.float()  # the drafter trains in fp32; its borrowed LM head follows the target's dtype
    widths = [int(w) for w in script.tree_widths.split(",")]
    drafter = hf_spec.ParallelDrafter.from_target(
        target, name_or_path=script.target_model, num_mask_tokens=script.num_mask_tokens, tree_widths=widths
    )
    trainer = ParallelTrainer(model=drafter, args=args, train_dataset=rows, data_collator=collate_features)
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer.train(resume_from_checkpoint=last)
    info = {"command": " ".join(sys.argv), "epochs": args.num_train_epochs}
    drafter.save_pretrained(args.output_dir, training_info=info)


if __name__ == "__main__":
    main()
