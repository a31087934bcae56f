"""Sorted fine-tuning (SoFT) of an S2D drafter extracted from a small source LM.

The shipped recipes (benchmarks/s2d-qwen/train.sh, which trains both S2D folders on the same data): the sorted
drafter is Qwen2.5-Coder-0.5B's first 8 layers with exits after 4 / 6 / 8 trained jointly (LoRA rank 64 on every
layer, 1,000 ShareGPT conversations labelled by the 0.5B, two epochs) and serves the packaged Qwen2.5-Coder-1.5B and
the 0.5B itself:

    python training_scripts/train_s2d.py --source_model qwen2.5-coder-0.5b-instruct --num_layers 8 --exits 4 6 8 \
        --dataset sharegpt --limit 1000 --max_length 512 --distill_from qwen2.5-coder-0.5b-instruct \
        --draft_vocab_size 16384 --lora_rank 64 --num_train_epochs 2 --per_device_train_batch_size 4 \
        --gradient_accumulation_steps 1 --learning_rate 1e-3 --lr_scheduler_type cosine --warmup_steps 20 \
        --eval_examples 32 --eval_strategy steps --eval_steps 50 --use_cpu \
        --targets qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct --output_dir runs/s2d-sorted-r64

CPU-feasible options: ``--draft_vocab_size 32768`` makes every exit score only the
32k most frequent label tokens of the training data (the head is most of a step's cost; labels
outside the draft vocabulary leave the loss, EAGLE-3's masking); the embedding and LM head stay
frozen by default (``--no-freeze_embeddings`` trains them); bf16 autocast is on by default
(``--bf16 False`` for fp32); ``--lora_rank 16`` trains LoRA adapters on the layers instead of the
layers themselves and saves only adapters, norm and draft-vocabulary map (the layers are borrowed
from the source model at bind time; see SortedDrafter.add_lora). With LoRA pass a LoRA learning rate: the
default 2e-5 is for full fine-tuning; in a CPU pilot on Qwen2.5-Coder-0.5B's first 8 layers, 30 steps at
``--learning_rate 2e-3`` came within 2-3 points of the held-aside exit accuracy of 90 steps at 5e-4.

Self-distillation (``--distill_from MODEL``, e.g. the source model) labels every position with the
teacher's greedy next token. The labelled rows are cached as resumable shards in ``--labels_cache``
(default ``<output_dir>/teacher_labels``): a killed run resumes the teacher pass where it stopped,
and a resumed training run with every shard written does not load the teacher at all. A cache made
over other conversations (dataset, ``--limit``, ``--max_length``, tokenizer) or by another teacher
or ``--teacher_dtype`` is refused; give another directory.

Frozen-backbone recipe (``--exit_adapters``; benchmarks/s2d-qwen/): keep all 24
layers of the 0.5B with exits after 8 / 16 / 24 and train only a linear map + norm per early exit, distilled
from the last exit, which is the 0.5B itself (so the drafter is never less accurate than the 0.5B as an
assistant, and confident early exits only save cost):

    python training_scripts/train_s2d.py --source_model qwen2.5-coder-0.5b-instruct --num_layers 24 \
        --exits 8 16 24 --exit_adapters --dataset sharegpt --limit 1000 --max_length 512 \
        --distill_from qwen2.5-coder-0.5b-instruct --draft_vocab_size 16384 --num_train_epochs 1 \
        --per_device_train_batch_size 4 --gradient_accumulation_steps 1 --learning_rate 1e-3 --use_cpu \
        --targets qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct --output_dir runs/s2d-exits

(The teacher labels only choose the draft vocabulary and mark the positions; the loss is the last exit's
distribution.)

Then pick per-target thresholds on held-out prompts by measured speed
(``training_scripts/search_s2d_thresholds.py``). Resumes from the last checkpoint in ``--output_dir``.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, HfArgumentParser
from transformers.trainer_utils import get_last_checkpoint

from hf_spec import PACKAGED_MODELS, SortedDrafter, draft_vocab, load_packaged_model, packaged_model_path
from hf_spec.bench.datasets import load_chitchat, load_sharegpt
from hf_spec.drafters.s2d import target_entry
from hf_spec.training.callbacks import TrainingClock
from hf_spec.training.pipeline import end_training, write_training_summary
from hf_spec.training.s2d_trainer import (
    SortedTrainer,
    SortedTrainingConfig,
    cached_teacher_labels,
    label_token_counts,
    pad_collator,
    tokenize_conversations,
)

LOADERS = {"sharegpt": load_sharegpt, "chitchat": load_chitchat}


def _load(name_or_path: str, dtype: torch.dtype = torch.float32):
    if name_or_path in PACKAGED_MODELS:
        model, tokenizer = load_packaged_model(name_or_path, dtype=dtype)
        model.config._name_or_path = name_or_path
        return model, tokenizer
    return AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype), AutoTokenizer.from_pretrained(name_or_path)


def _target_config(name_or_path: str):
    path = packaged_model_path(name_or_path) if name_or_path in PACKAGED_MODELS else name_or_path
    config = AutoConfig.from_pretrained(path)
    config._name_or_path = name_or_path
    return config


def main(argv=None):
    parser = HfArgumentParser(SortedTrainingConfig)
    parser.add_argument("--source_model", required=True, help="packaged name or path of the source causal LM")
    parser.add_argument("--num_layers", type=int, default=8, help="layers kept from the source")
    parser.add_argument("--exits", type=int, nargs="+", default=None, help="exit layers (default 1/2, 3/4, all)")
    parser.add_argument("--dataset", choices=sorted(LOADERS), default="sharegpt")
    parser.add_argument("--limit", type=int, default=None, help="use only the first N conversations")
    parser.add_argument("--targets", nargs="*", default=[], help="targets served (packaged names or paths)")
    parser.add_argument("--distill_from", default=None,
                        help="label every position with this model's greedy next token (teacher-forced "
                             "self-distillation) instead of the data's own next token; e.g. the source model")
    parser.add_argument("--teacher_dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--labels_cache", default=None,
                        help="resumable cache of the --distill_from labels (default: <output_dir>/teacher_labels); "
                             "the teacher is not loaded when it is complete")
    parser.add_argument("--freeze_embeddings", action=argparse.BooleanOptionalAction, default=True,
                        help="keep the input embedding and LM head fixed (train layers + final norm only); default on")
    parser.add_argument("--draft_vocab_size", type=int, default=None,
                        help="exits score only the N most frequent label tokens of the training data (FR-Spec/EAGLE-3 "
                             "draft vocabulary); labels outside it leave the loss. Default: the full vocabulary")
    parser.add_argument("--lora_rank", type=int, default=None,
                        help="train rank-r LoRA adapters (peft) on the borrowed layers instead of the layers; the "
                             "checkpoint holds adapters + norm + draft-vocabulary map only")
    parser.add_argument("--lora_alpha", type=float, default=None, help="LoRA alpha (default 2 x rank)")  # fmt: skip
    parser.add_argument("--eval_examples", type=int, default=0,
                        help="hold out the last N conversations: held-out loss and each exit's top-1 accuracy at the "
                             "end and at every --eval_steps with --eval_strategy steps (the training curves)")
    parser.add_argument("--exit_adapters", action="store_true",
                        help="frozen backbone: train only a per-exit adapter (linear map + norm) for every exit but "
                             "the last, distilled from the last exit (with --num_layers = the source's depth, the "
                             "source itself); the checkpoint holds adapters + norm + draft-vocabulary map only")
    argv = list(sys.argv[1:] if argv is None else argv)
    command = " ".join(argv)
    if not any(a.split("=")[0] in ("--bf16", "--fp16") for a in argv):
        argv += ["--bf16", "True"]  # bf16 autocast by default (fp32 master weights); --bf16 False turns it off
    training_args, extra = parser.parse_args_into_dataclasses(args=argv)  # extra: the script's own options
    if extra.lora_rank and extra.exit_adapters:  # before the source model and teacher labels are loaded
        parser.error("--lora_rank and --exit_adapters are two recipes; pick one.")
    source, tokenizer = _load(extra.source_model)
    drafter = SortedDrafter.from_source_model(source, num_layers=extra.num_layers, exits=extra.exits,
                                              source_name_or_path=extra.source_model)  # fmt: skip
    for name in extra.targets:
        drafter.config.targets.append(target_entry(_target_config(name), drafter.config.default_thresholds, name))
    del source
    rows = tokenize_conversations(tokenizer, LOADERS[extra.dataset](limit=extra.limit), training_args.max_length)
    if extra.distill_from:
        def load_teacher():  # called only if a labels shard is missing
            return _load(extra.distill_from, getattr(torch, extra.teacher_dtype))[0].eval()

        cache = extra.labels_cache or os.path.join(training_args.output_dir, "teacher_labels")
        name = f"{extra.distill_from} ({extra.teacher_dtype})"  # bf16 and fp32 labels differ in near-ties
        rows = cached_teacher_labels(load_teacher, rows, cache, teacher_name=name)
    coverage = None
    if extra.draft_vocab_size and extra.draft_vocab_size < drafter.config.target_vocab_size:
        counts = label_token_counts(rows, drafter.config.target_vocab_size)
        drafter.set_draft_vocab(counts, extra.draft_vocab_size)
        coverage = draft_vocab.coverage(counts, drafter.draft_ids)
        print(f"[hf_spec] draft vocabulary: {extra.draft_vocab_size} of {drafter.config.target_vocab_size} ids cover "
              f"{coverage:.2%} of the label tokens", flush=True)  # fmt: skip
    if extra.freeze_embeddings:
        drafter.get_input_embeddings().weight.requires_grad_(False)
        drafter.get_output_embeddings().weight.requires_grad_(False)
    if extra.lora_rank:
        drafter.add_lora(extra.lora_rank, alpha=extra.lora_alpha)
    if extra.exit_adapters:
        drafter.add_exit_adapters()
        if training_args.bf16:  # the frozen backbone runs in bf16 (no per-step weight casts); adapters stay fp32
            for frozen in (drafter.embed_tokens, drafter.layers, drafter.norm, drafter.lm_head):
                frozen.to(torch.bfloat16)
    if not 0 <= extra.eval_examples < len(rows):
        parser.error(f"--eval_examples {extra.eval_examples} must be in [0, {len(rows)}) (the conversations kept).")
    held_out = rows[len(rows) - extra.eval_examples :] if extra.eval_examples else None
    rows = rows[: len(rows) - extra.eval_examples]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    trainer = SortedTrainer(model=drafter.train(), args=training_args, train_dataset=rows, eval_dataset=held_out,
                            data_collator=pad_collator(pad), callbacks=[TrainingClock()])  # fmt: skip
    last = get_last_checkpoint(training_args.output_dir) if training_args.output_dir else None
    result = trainer.train(resume_from_checkpoint=last)
    if held_out and training_args.eval_strategy == "no":  # else the Trainer evaluates at the last step itself
        trainer.evaluate()
    info = {"datasets": [extra.dataset], "command": "training_scripts/train_s2d.py " + command,
            "distilled_from": extra.distill_from, "frozen_embeddings": extra.freeze_embeddings,
            "draft_vocab_size": drafter.config.draft_vocab_size, "draft_vocab_coverage": coverage,
            "lora_rank": extra.lora_rank, "exit_adapters": extra.exit_adapters, "bf16": training_args.bf16}  # fmt: skip
    drafter.eval().save_pretrained(training_args.output_dir, training_info=info)
    tokenizer.save_pretrained(training_args.output_dir)
    write_training_summary(trainer, result, method="s2d-exit-adapters" if extra.exit_adapters else "s2d-sorted",
                           data={"dataset": extra.dataset, "limit": extra.limit, "max_length": training_args.max_length,
                                 "distilled_from": extra.distill_from}, held_out_examples=extra.eval_examples,
                           draft_vocab_size=drafter.config.draft_vocab_size, draft_vocab_coverage=coverage)  # fmt: skip
    end_training()


if __name__ == "__main__":
    main()
