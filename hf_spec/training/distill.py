"""Self-distillation that records the target's features while it generates (one target pass).

HASS (A.4) and ParallelSpec (§5.3) train drafters on the target's own answers. Generating those
answers and then running the target again over the finished conversations to cache its features
(:func:`hf_spec.training.data.build_feature_cache`) computes every feature twice. Greedy
decoding already computes them: the prefill gives the prompt's post-norm last hidden states and
every decoding step gives the feature of the token it feeds. :func:`distill_features` keeps them,
so one pass of the target yields the training data *and* its feature cache, in the same
``datasets`` shard format (``id``, ``input_ids``, ``loss_mask``, ``hidden_states``) that
:func:`~hf_spec.training.data.load_feature_cache` reads.

Decoding is a plain batched greedy loop over the target's base model with a ``DynamicCache``:
left-padded prompts of similar length, explicit position ids, the LM head only on the last
position of rows still generating, and finished rows dropped from the batch (and its cache)
as soon as their last token's feature is known. Answers may differ from unbatched greedy
decoding in the last ulp (padding changes reduction order), which does not matter for
training data. Each shard is written once complete, so an interrupted run resumes at the
first missing shard.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import compat

from .data import _META_FILE, _features_schema, _to_storage, check_no_extra_shards, finished_shard, stop_token_ids

DISTILL_LOG = "distill_log.jsonl"


def first_turn_prompts(tokenizer, conversations: list[dict], max_prompt_tokens: int) -> list[dict]:
    """``{"id", "messages", "prompt_ids"}`` for each conversation's first user turn (with its system
    message, if any), chat-templated with the generation prompt; prompts longer than
    ``max_prompt_tokens`` and repeated prompts are left out."""
    out, seen = [], set()
    for convo in conversations:
        messages = convo["messages"]
        head = messages[:1] if messages[0]["role"] == "system" else []
        user = next(m for m in messages if m["role"] == "user")
        dialog = head + [user]
        text = tokenizer.apply_chat_template(dialog, add_generation_prompt=True, tokenize=False)
        if text in seen:
            continue
        seen.add(text)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= max_prompt_tokens:
            out.append({"id": convo["id"], "messages": dialog, "prompt_ids": ids})
    return out


@torch.no_grad()
def greedy_with_features(target, prompts: list[list[int]], max_new_tokens: int, stop_ids: set[int], pad_id: int):
    """Greedy-decode a batch of prompts; returns, per prompt, (generated ids, features (n, H)) where
    the features cover the prompt and every generated token (the last one included)."""
    from transformers import DynamicCache

    device = target.device
    base, lm_head = target.base_model, target.get_output_embeddings()
    batch = len(prompts)
    longest = max(len(p) for p in prompts)
    ids = torch.full((batch, longest), pad_id, dtype=torch.long)
    attention = torch.zeros(batch, longest, dtype=torch.long)
    for r, p in enumerate(prompts):
        ids[r, longest - len(p) :] = torch.tensor(p)
        attention[r, longest - len(p) :] = 1
    ids, attention = ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    hidden = base(input_ids=ids, attention_mask=attention, position_ids=positions, past_key_values=cache,
                  use_cache=True).last_hidden_state  # fmt: skip
    features = [[hidden[r, longest - len(p) :]] for r, p in enumerate(prompts)]
    generated = [[] for _ in prompts]
    rows = list(range(batch))  # batch slot -> prompt index
    next_tokens = lm_head(hidden[:, -1]).argmax(-1)
    last_position = positions[:, -1]
    while rows:
        tokens = next_tokens.tolist()
        finished = []
        for slot, row in enumerate(rows):
            generated[row].append(tokens[slot])
            finished.append(tokens[slot] in stop_ids or len(generated[row]) >= max_new_tokens)
        attention = torch.cat([attention, attention.new_ones(len(rows), 1)], dim=1)
        last_position = last_position + 1
        hidden = base(input_ids=next_tokens.view(-1, 1), attention_mask=attention, position_ids=last_position.view(-1, 1),
                      past_key_values=cache, use_cache=True).last_hidden_state[:, 0]  # fmt: skip
        for slot, row in enumerate(rows):
            features[row].append(hidden[slot : slot + 1])
        keep = [slot for slot, done in enumerate(finished) if not done]
        if len(keep) < len(rows):
            if not keep:
                break
            index = torch.tensor(keep, device=device)
            cache.batch_select_indices(index)
            attention, last_position, hidden = attention[index], last_position[index], hidden[index]
            rows = [rows[slot] for slot in keep]
        next_tokens = lm_head(hidden).argmax(-1)
    return [(generated[r], torch.cat(features[r])) for r in range(batch)]


def distill_features(
    target,
    tokenizer,
    conversations: list[dict],
    output_dir: str,
    max_new_tokens: int = 256,
    max_prompt_tokens: int = 256,
    batch_size: int = 64,
    shard_examples: int = 256,
    storage: str = "bfloat16",
    limit: int | None = None,
    skip: int = 0,
) -> str:
    """Answer the first user turn of each conversation with ``target`` (greedy) and save the
    conversations with their target features as feature-cache shards in ``output_dir``.

    ``loss_mask`` is 1 on the generated tokens (the answer and its end-of-turn token). Also
    appends the distilled conversations to ``output_dir/conversations.jsonl`` and one
    throughput line per batch to ``output_dir/distill_log.jsonl``. ``limit``: answer the first
    ``limit`` usable prompts (after the length filter); ``skip``: after the first ``skip`` usable
    ones (new data for a drafter trained on those, e.g. with ``--init_drafter``). Resumable by shard.
    """
    from datasets import Dataset

    os.makedirs(output_dir, exist_ok=True)
    usable = first_turn_prompts(tokenizer, conversations, max_prompt_tokens)
    prompts = usable[skip : None if limit is None else skip + limit]
    prompts.sort(key=lambda p: len(p["prompt_ids"]))  # similar lengths per batch: little padding
    hidden_size = target.config.get_text_config().hidden_size
    schema = _features_schema(hidden_size, storage)
    stop_ids = stop_token_ids(target, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    shards = [prompts[i : i + shard_examples] for i in range(0, len(prompts), shard_examples)]
    print(f"[hf_spec] distill: {len(prompts)} prompts (<= {max_prompt_tokens} tokens) in {len(shards)} shards, "
          f"{max_new_tokens} new tokens max, batch {batch_size} -> {output_dir}", flush=True)  # fmt: skip
    check_no_extra_shards(output_dir, len(shards))
    progress = tqdm(total=len(prompts), desc="distill", unit="prompt")
    for number, shard in enumerate(shards):
        path = Path(output_dir, f"shard-{number:05d}")
        if finished_shard(path, [p["id"] for p in shard]):
            progress.update(len(shard))
            continue
        rows = {"id": [], "input_ids": [], "loss_mask": [], "hidden_states": []}
        records = []
        for start in range(0, len(shard), batch_size):
            chunk = shard[start : start + batch_size]
            began = time.perf_counter()
            results = greedy_with_features(target, [p["prompt_ids"] for p in chunk], max_new_tokens, stop_ids, pad_id)
            seconds = time.perf_counter() - began
            new_tokens = 0
            for p, (answer, feats) in zip(chunk, results):
                rows["id"].append(p["id"])
                rows["input_ids"].append(p["prompt_ids"] + answer)
                rows["loss_mask"].append([0] * len(p["prompt_ids"]) + [1] * len(answer))
                rows["hidden_states"].append(_to_storage(feats, storage))
                text = tokenizer.decode([t for t in answer if t not in stop_ids], skip_special_tokens=True)
                records.append({"id": p["id"], "messages": p["messages"] + [{"role": "assistant", "content": text}]})
                new_tokens += len(answer)
            prompt_tokens = sum(len(p["prompt_ids"]) for p in chunk)
            line = {"shard": number, "batch": len(chunk), "prompt_tokens": prompt_tokens, "new_tokens": new_tokens,
                    "seconds": round(seconds, 2), "tokens_per_s": round((prompt_tokens + new_tokens) / seconds, 1),
                    "new_tokens_per_s": round(new_tokens / seconds, 1)}  # fmt: skip
            with open(Path(output_dir, DISTILL_LOG), "a") as log:
                log.write(json.dumps(line) + "\n")
            progress.set_postfix(new_tok_s=line["new_tokens_per_s"], tok_s=line["tokens_per_s"])
            progress.update(len(chunk))
        Dataset.from_dict(rows, features=schema).save_to_disk(str(path))
        with open(Path(output_dir, "conversations.jsonl"), "a") as out:
            out.writelines(json.dumps(r) + "\n" for r in records)
        # after every shard, so an interrupted or still running distillation can already be trained on
        meta = write_cache_meta(output_dir, target, storage, max_new_tokens, max_prompt_tokens)
    progress.close()
    meta = write_cache_meta(output_dir, target, storage, max_new_tokens, max_prompt_tokens)
    print(f"[hf_spec] distill done: {meta['num_examples']} examples, {meta['num_tokens']} tokens, "
          f"{meta['num_loss_tokens']} generated", flush=True)  # fmt: skip
    return output_dir


def write_cache_meta(output_dir: str, target, storage: str, max_new_tokens: int, max_prompt_tokens: int) -> dict:
    """Write the feature-cache metadata over the shards completed so far, so a partial (still
    running or interrupted) distillation can already be trained on."""
    from datasets import load_from_disk

    totals = {"num_examples": 0, "num_tokens": 0, "num_loss_tokens": 0}
    for path in sorted(Path(output_dir).glob("shard-*")):
        if not (path / "dataset_info.json").exists():
            continue
        shard = load_from_disk(str(path)).select_columns(["input_ids", "loss_mask"])
        totals["num_examples"] += len(shard)
        for row in shard:
            totals["num_tokens"] += len(row["input_ids"])
            totals["num_loss_tokens"] += sum(row["loss_mask"])
    config = target.config if hasattr(target, "config") else target
    meta = {"storage": storage, "hidden_size": config.get_text_config().hidden_size,
            "max_length": max_prompt_tokens + max_new_tokens, **totals,
            "target": compat.model_name_or_path(config), "source": "distill_features",
            "max_new_tokens": max_new_tokens, "max_prompt_tokens": max_prompt_tokens}  # fmt: skip
    Path(output_dir, _META_FILE).write_text(json.dumps(meta, indent=1))
    return meta


def main(argv=None):
    import argparse

    from ..hardware import resolve_dtype
    from .data import FEATURE_DTYPES, load_conversations, load_target

    parser = argparse.ArgumentParser(prog="python -m hf_spec.training.distill", description=__doc__.split("\n")[0])
    parser.add_argument("--target_model", default="smollm2-135m-instruct", help="packaged name or local path")
    parser.add_argument("--dataset", default="sharegpt", help="sharegpt | chitchat | path to .jsonl")
    parser.add_argument("--num_conversations", type=int, default=3200, help="prompts to answer (first usable ones after shuffling)")
    parser.add_argument("--skip_conversations", type=int, default=0,
                        help="start after the first N usable prompts (new data for a drafter trained on those)")
    parser.add_argument("--shuffle_seed", type=int, default=0)
    parser.add_argument("--dtype", default="auto", choices=["auto", *sorted(FEATURE_DTYPES)],
                        help="the target's compute dtype (auto: bf16 where this device computes it natively)")
    parser.add_argument("--storage", default="bfloat16", choices=sorted(FEATURE_DTYPES))
    parser.add_argument("--max_new_tokens", type=int, default=256)
    parser.add_argument("--max_prompt_tokens", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--shard_examples", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--device", default="auto", help="where the target runs: auto (cuda when available, else cpu), "
                                                         "cpu, cuda, cuda:1, ...")  # fmt: skip
    parser.add_argument("--output", required=True, help="feature cache directory to write")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    target, tokenizer = load_target(args.target_model, resolve_dtype(args.dtype, device))
    target = target.to(device)
    conversations = load_conversations(args.dataset)
    random.Random(args.shuffle_seed).shuffle(conversations)
    distill_features(target, tokenizer, conversations, args.output, args.max_new_tokens, args.max_prompt_tokens,
                     args.batch_size, args.shard_examples, args.storage, limit=args.num_conversations,
                     skip=args.skip_conversations)  # fmt: skip


if __name__ == "__main__":
    main()
