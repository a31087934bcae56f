"""Sorted fine-tuning (SoFT) of an S2D drafter: a Trainer whose loss is :func:`sorted_loss`.

Kept apart from ``trainers.py``/``data.py`` on purpose: a sorted drafter is a plain causal
LM trained on token sequences, so it needs no target features, only tokenised chats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import Trainer, TrainingArguments

from .losses import sorted_loss


@dataclass
class SortedTrainingConfig(TrainingArguments):
    """TrainingArguments with S2D's defaults (App. 7.1), scaled to one CPU/GPU box.

    The paper trains 3 epochs on ShareGPT with batch size 8 and 16 accumulation steps
    (effective 128); here 2 x 64 keeps the effective batch with less memory.
    """

    num_train_epochs: float = field(default=3.0, metadata={"help": "S2D App. 7.1: 3 epochs."})
    per_device_train_batch_size: int = field(default=2, metadata={"help": "x gradient_accumulation_steps = 128."})
    gradient_accumulation_steps: int = field(default=64, metadata={"help": "Effective batch 128 (8 x 16 in S2D)."})
    learning_rate: float = field(default=2e-5, metadata={"help": "Full fine-tuning LR (not given in the paper)."})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "LR schedule."})
    warmup_ratio: float = field(default=0.03, metadata={"help": "Warm-up share of the steps."})
    save_strategy: str = field(default="steps", metadata={"help": "Checkpoint so runs can resume."})
    save_steps: int = field(default=500, metadata={"help": "Steps between checkpoints."})
    report_to: str = field(default="none", metadata={"help": "Logging integrations."})
    remove_unused_columns: bool = field(default=False, metadata={"help": "Keep input_ids/labels columns."})
    max_length: int = field(default=1024, metadata={"help": "Tokens per training sequence (truncation)."})


class SortedTrainer(Trainer):
    """Trainer for :class:`hf_spec.SortedDrafter`: mean next-token CE over every exit (S2D Eq. 3)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"))
        labels = self.accelerator.unwrap_model(model).exit_labels(inputs["labels"])  # draft indices, if any
        loss = sorted_loss(outputs.logits_per_exit, labels)
        return (loss, outputs) if return_outputs else loss


def tokenize_conversations(tokenizer, conversations, max_length: int, assistant_only: bool = False) -> list[dict]:
    """Chats -> ``{"input_ids", "labels"}`` rows with the tokenizer's chat template (raw text without one)."""
    rows = []
    for chat in conversations:
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True)["input_ids"]
        else:
            ids = tokenizer("\n".join(turn["content"] for turn in chat))["input_ids"]
        ids = list(ids)[:max_length]
        if len(ids) >= 2:
            rows.append({"input_ids": ids, "labels": list(ids)})
    return rows


def label_token_counts(rows: list[dict], vocab_size: int) -> torch.Tensor:
    """How often each token id is a training label (``labels`` != -100) in ``rows``: the frequency that
    orders a sorted drafter's draft vocabulary (with self-distilled rows, the target's own greedy tokens)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for r in rows:
        labels = torch.as_tensor(r["labels"], dtype=torch.long)
        labels = labels[(labels >= 0) & (labels < vocab_size)]
        counts += torch.bincount(labels, minlength=vocab_size)
    return counts


def pad_collator(pad_token_id: int):
    """Right-pads ``input_ids`` (with ``pad_token_id``) and ``labels`` (with -100); adds ``attention_mask``."""

    def collate(rows):
        length = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), length), -100, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, r in enumerate(rows):
            n = len(r["input_ids"])
            ids[i, :n] = torch.as_tensor(r["input_ids"])
            labels[i, :n] = torch.as_tensor(r["labels"])
            mask[i, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    return collate


@torch.no_grad()
def teacher_labels(teacher, rows: list[dict], batch_size: int = 4) -> list[dict]:
    """Replace each row's labels by ``teacher``'s greedy next token at every position (self-distillation).

    Teacher-forced on the row's own text: position t is labelled with the teacher's argmax after
    ``input_ids[: t + 1]`` (stored at ``labels[t + 1]``, the causal-LM convention
    :func:`sorted_loss` reads), so the drafter learns the target's greedy choice, which is
    what greedy speculative decoding accepts. ``labels[0]`` is -100.
    """
    out = []
    for begin in range(0, len(rows), batch_size):
        chunk = rows[begin : begin + batch_size]
        length = max(len(r["input_ids"]) for r in chunk)
        ids = torch.zeros((len(chunk), length), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(chunk):
            ids[i, : len(r["input_ids"])] = torch.as_tensor(r["input_ids"])
            mask[i, : len(r["input_ids"])] = 1
        device = next(teacher.parameters()).device
        logits = teacher(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        greedy = logits.argmax(-1).cpu()
        for i, r in enumerate(chunk):
            n = len(r["input_ids"])
            out.append({"input_ids": list(r["input_ids"]), "labels": [-100] + greedy[i, : n - 1].tolist()})
    return out

