"""Sorted fine-tuning (SoFT) of an S2D drafter: a Trainer whose loss is :func:`sorted_loss`.

Kept apart from ``trainers.py``/``data.py`` on purpose: a sorted drafter is a plain causal
LM trained on token sequences, so it needs no target features, only tokenised chats.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import Trainer, TrainingArguments

from .. import compat

_LABELS_META = "teacher_labels.json"


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
    """Trainer for :class:`hf_spec.SortedDrafter`: mean next-token CE over every exit (S2D Eq. 3), or with exit
    adapters on a frozen backbone the early exits' distillation from the last (:meth:`SortedDrafter.training_loss`)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs.get("attention_mask"))
        loss = self.accelerator.unwrap_model(model).training_loss(outputs.logits_per_exit, inputs["labels"])
        return (loss, outputs) if return_outputs else loss

    @torch.no_grad()
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict:
        """Held-out loss and every exit's next-token top-1 accuracy against the labels (with self-distilled rows,
        the teacher's greedy token; labels outside the draft vocabulary count as misses): the sorted drafter's
        training curves, logged as ``eval_loss`` and ``eval_top1_exit_<layer>``."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        drafter = self.accelerator.unwrap_model(self.model)
        was_training = drafter.training
        drafter.eval()
        hits, positions, loss, batches = torch.zeros(len(drafter.config.exits)), 0, 0.0, 0
        for batch in self.get_eval_dataloader(dataset):
            batch = self._prepare_inputs(batch)
            with self.compute_loss_context_manager():
                outputs = drafter(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"))
                loss += float(drafter.training_loss(outputs.logits_per_exit, batch["labels"]))
            labels = batch["labels"][:, 1:]
            valid = labels != -100
            targets = drafter.exit_labels(batch["labels"])[:, 1:][valid]  # -100 (a miss) outside the draft vocabulary
            for i, logits in enumerate(outputs.logits_per_exit):
                hits[i] += float((logits[:, :-1][valid].argmax(-1) == targets).sum())
            positions += int(valid.sum())
            batches += 1
        drafter.train(was_training)
        metrics = {f"{metric_key_prefix}_loss": loss / max(batches, 1)}
        for layer, hit in zip(drafter.config.exits, hits.tolist()):
            metrics[f"{metric_key_prefix}_top1_exit_{layer}"] = hit / max(positions, 1)
        self.log(metrics)
        return metrics


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


def right_pad(rows, pad_token_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask)`` of ``rows``' ``input_ids``, right-padded with ``pad_token_id``."""
    length = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r["input_ids"])] = torch.as_tensor(r["input_ids"])
        mask[i, : len(r["input_ids"])] = 1
    return ids, mask


def pad_collator(pad_token_id: int):
    """Right-pads ``input_ids`` (with ``pad_token_id``) and ``labels`` (with -100); adds ``attention_mask``."""

    def collate(rows):
        ids, mask = right_pad(rows, pad_token_id)
        labels = torch.full_like(ids, -100)
        for i, r in enumerate(rows):
            labels[i, : len(r["input_ids"])] = torch.as_tensor(r["labels"])
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}

    return collate


@torch.no_grad()
def teacher_labels(teacher, rows: list[dict], batch_size: int = 4, head_rows: int = 256, progress=None) -> list[dict]:
    """Replace each row's labels by ``teacher``'s greedy next token at every position (self-distillation).

    Teacher-forced on the row's own text: position t is labelled with the teacher's argmax after
    ``input_ids[: t + 1]`` (stored at ``labels[t + 1]``, the causal-LM convention
    :func:`sorted_loss` reads), so the drafter learns the target's greedy choice, which is
    what greedy speculative decoding accepts. ``labels[0]`` is -100.

    Memory-lean: runs the teacher's base model, then its LM head over ``head_rows`` positions at a
    time (only real, labelled ones), so full-vocabulary logits never exist for a whole batch (4 x 512
    x 151,936 fp32 would be 1.2 GB). The argmax is the full forward's: the head is applied row-wise,
    and a model whose forward rescales or soft-caps logits does so monotonically. ``progress``: a
    tqdm-like object advanced by each batch's token count.
    """
    base, head = teacher.base_model, teacher.get_output_embeddings()
    device = next(teacher.parameters()).device
    out = []
    for begin in range(0, len(rows), batch_size):
        chunk = rows[begin : begin + batch_size]
        lengths = [len(r["input_ids"]) for r in chunk]
        ids, mask = right_pad(chunk)
        hidden = base(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).last_hidden_state
        labelled = torch.arange(ids.shape[1]) < torch.tensor(lengths)[:, None] - 1  # the last token labels nothing
        features = hidden[labelled.to(device)]  # (sum(n - 1), H), row-major: row i's positions, then row i + 1's
        greedy = [head(f).argmax(-1).cpu() for f in features.split(head_rows)]  # <= head_rows x vocab logits at once
        greedy = torch.cat(greedy) if greedy else torch.zeros(0, dtype=torch.long)
        offset = 0
        for r, n in zip(chunk, lengths):
            out.append({"input_ids": list(r["input_ids"]), "labels": [-100] + greedy[offset : offset + n - 1].tolist()})
            offset += n - 1
        if progress is not None:
            progress.update(sum(lengths))
    return out


def _row_key(index: int, input_ids) -> str:
    """A row's identity in a labels cache: its index and a hash of its token ids."""
    digest = hashlib.sha1(np.asarray(input_ids, dtype=np.int64).tobytes()).hexdigest()[:16]
    return f"{index}-{digest}"


def cached_teacher_labels(teacher, rows: list[dict], cache_dir: str, shard_rows: int = 256, batch_size: int = 4,
                          teacher_name: str | None = None) -> list[dict]:  # fmt: skip
    """:func:`teacher_labels` with a resumable on-disk cache: ``cache_dir/shard-XXXXX`` ``datasets`` shards
    (``save_to_disk``) of ``shard_rows`` rows holding ``id`` (row index + hash of its ids), ``input_ids``
    and ``labels``. Finished shards are read back, only missing ones run the teacher, so a killed run
    resumes where it stopped and a complete cache costs no teacher pass.

    ``teacher``: the model, or a zero-argument function loading it, called only if a shard is missing.
    ``teacher_name`` (default: the model's ``_name_or_path``) is recorded in ``teacher_labels.json``; a
    cache of another teacher, or one started over other rows (data set, ``--limit``, ``max_length``,
    tokenizer, ``shard_rows``), raises ValueError naming the fix.
    """
    from datasets import Dataset, Features, Sequence, Value, load_from_disk
    from tqdm.auto import tqdm

    from .data import check_no_extra_shards, finished_shard

    if isinstance(teacher, torch.nn.Module) and teacher_name is None:
        teacher_name = compat.model_name_or_path(teacher.config)
    os.makedirs(cache_dir, exist_ok=True)
    meta_path = Path(cache_dir, _LABELS_META)
    held = json.loads(meta_path.read_text()).get("teacher") if meta_path.exists() else None
    if held is not None and teacher_name is not None and held != teacher_name:
        raise ValueError(
            f"The teacher-labels cache {cache_dir} holds labels of {held!r}, not of {teacher_name!r}. "
            "Fix: give another --labels_cache directory, or delete this one."
        )
    keys = [_row_key(i, r["input_ids"]) for i, r in enumerate(rows)]
    num_shards = math.ceil(len(rows) / shard_rows)
    check_no_extra_shards(cache_dir, num_shards)
    ints = Sequence(Value("int32"))
    schema = Features({"id": Value("string"), "input_ids": ints, "labels": ints})
    parts = [slice(s * shard_rows, (s + 1) * shard_rows) for s in range(num_shards)]
    paths = [os.path.join(cache_dir, f"shard-{s:05d}") for s in range(num_shards)]
    missing = [s for s in range(num_shards) if not finished_shard(paths[s], keys[parts[s]])]  # raises on other rows
    meta_path.write_text(json.dumps({"teacher": teacher_name or held, "shard_rows": shard_rows}, indent=1))
    if missing and not isinstance(teacher, torch.nn.Module):
        teacher = teacher()  # load the teacher only when there is something to label
    tokens = [len(r["input_ids"]) for r in rows]
    cached = sum(sum(tokens[parts[s]]) for s in range(num_shards) if s not in missing)
    progress = tqdm(total=sum(tokens), initial=cached, desc="teacher labels", unit="tok")
    start = time.perf_counter()
    for s in missing:
        labelled = teacher_labels(teacher, rows[parts[s]], batch_size=batch_size, progress=progress)
        columns = {"id": keys[parts[s]], "input_ids": [r["input_ids"] for r in labelled],
                   "labels": [r["labels"] for r in labelled]}  # fmt: skip
        Dataset.from_dict(columns, features=schema).save_to_disk(paths[s])
    progress.close()
    seconds, computed = time.perf_counter() - start, sum(tokens) - cached
    done = f"labelled {computed} tokens in {seconds:.1f}s ({computed / max(seconds, 1e-9):.0f} tok/s)"
    done = done if missing else "all cached"
    print(f"[hf_spec] teacher labels: {len(rows)} rows, {num_shards} shards in {cache_dir} "
          f"({num_shards - len(missing)} cached); {done}", flush=True)  # fmt: skip
    out = []
    for path in paths:
        data = load_from_disk(path)
        out += [{"input_ids": i, "labels": lab} for i, lab in zip(data["input_ids"], data["labels"])]
    return out
