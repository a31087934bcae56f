"""Training data for feature drafters: conversations -> token ids + assistant loss mask ->
cached target features.

Pipeline (each stage is a function and a sub-command of ``python -m hf_spec.training.data``):

1. :func:`load_conversations` reads ShareGPT, chitchat or a jsonl file into
   ``{"id": str, "messages": [{"role", "content"}, ...]}`` records.
2. (optional) :func:`self_distill` regenerates every assistant turn with the target itself
   (greedy, turn by turn, as HASS A.4), writing a resumable jsonl (``self-distill`` command).
3. :func:`tokenize_conversation` renders a conversation with the tokenizer's chat template and
   marks exactly the tokens the assistant produces (content + end-of-turn marker).
4. :func:`build_feature_cache` runs the frozen target once per example and stores its
   post-norm last hidden state next to the ids and the loss mask as ``datasets`` shards
   (``save_to_disk``). Logits are not stored: the LM head recomputes them from the features.

Packaged models and data sets are located by :mod:`hf_spec.resources` and
:mod:`hf_spec.bench.datasets`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import re
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from .. import compat
from ..hardware import DTYPE_NAMES, resolve_dtype

FEATURE_DTYPES = DTYPE_NAMES  # the dtype names every --dtype / --storage option takes
_META_FILE = "hf_spec_features.json"


# ---------------------------------------------------------------------------------------------
# conversations
# ---------------------------------------------------------------------------------------------
_ROLE_NAMES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
               "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "system": "system"}  # fmt: skip


def normalize_messages(turns: list[dict]) -> list[dict] | None:
    """ShareGPT (``from``/``value``) or chat (``role``/``content``) turns -> chat messages.

    Returns None for conversations that are unusable: unknown roles, no assistant turn, or
    not alternating user/assistant after an optional leading system message.
    """
    messages = []
    for turn in turns:
        role = _ROLE_NAMES.get(str(turn.get("role", turn.get("from", ""))).lower())
        content = turn.get("content", turn.get("value"))
        if role is None or not isinstance(content, str):
            return None
        messages.append({"role": role, "content": content})
    if messages and messages[0]["role"] == "system":
        body = messages[1:]
    else:
        body = messages
    while body and body[0]["role"] != "user":  # ShareGPT sometimes opens with the model
        body = body[1:]
    expected = ["user", "assistant"] * (len(body) // 2 + 1)
    if not body or any(m["role"] != r for m, r in zip(body, expected)) or "assistant" not in {m["role"] for m in body}:
        return None
    return (messages[:1] if messages and messages[0]["role"] == "system" else []) + body


def load_conversations(dataset: str, limit: int | None = None, seed: int = 0) -> list[dict]:
    """``sharegpt`` | ``chitchat`` | path to a jsonl file -> ``[{"id", "messages"}]``.

    jsonl lines carry ``messages`` (role/content) or ``conversations`` (ShareGPT from/value)
    and optionally ``id``. ``limit`` keeps the first ``limit`` usable conversations (the
    ShareGPT/chitchat order is fixed, so a limit is reproducible).
    """
    if dataset == "sharegpt":
        raw = _sharegpt_records()
    elif dataset == "chitchat":
        raw = _chitchat_records()
    elif os.path.exists(dataset):
        raw = _jsonl_records(dataset)
    else:
        raise ValueError(f"Unknown dataset {dataset!r}: use 'sharegpt', 'chitchat' or a path to a .jsonl file.")
    out = []
    for i, record in enumerate(raw):
        if isinstance(record, list):  # hf_spec.bench.datasets yields bare turn lists
            record = {"id": f"{dataset}-{i}", "messages": record}
        messages = normalize_messages(record.get("messages") or record.get("conversations") or [])
        if messages is None:
            continue
        out.append({"id": str(record.get("id", i)), "messages": messages})
        if limit is not None and len(out) >= limit:
            break
    return out


def _jsonl_records(path: str):
    with open(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _sharegpt_records():
    from ..bench.datasets import load_sharegpt

    return load_sharegpt()


def _chitchat_records():
    from ..bench.datasets import load_chitchat

    return load_chitchat()


# ---------------------------------------------------------------------------------------------
# tokenization with an assistant loss mask
# ---------------------------------------------------------------------------------------------
def _render(tokenizer, messages, add_generation_prompt=False) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def assistant_char_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans the assistant produces.

    A span runs from the end of the generation prompt before an assistant turn to the end of
    that turn's rendering, minus trailing whitespace: the content plus the end-of-turn marker
    (e.g. ``<|im_end|>``), which is what generation emits before it stops. Works for any
    template whose renderings of growing prefixes are prefixes of each other; raises
    ``ValueError`` otherwise (templates that rewrite earlier turns).
    """
    text = _render(tokenizer, messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], add_generation_prompt=True)
        upto = _render(tokenizer, messages[: i + 1]).rstrip()
        if not text.startswith(before) or not text.startswith(upto) or len(upto) < len(before):
            raise ValueError("The chat template does not render conversations prefix by prefix; cannot mask turns.")
        spans.append((len(before), len(upto)))
    return text, spans


def tokenize_conversation(tokenizer, messages: list[dict], max_length: int | None = None) -> dict:
    """Chat-templated ``input_ids`` and a 0/1 ``loss_mask`` that is 1 on assistant tokens only.

    A token is an assistant token when its characters lie inside an assistant span (see
    :func:`assistant_char_spans`); tokens straddling a span boundary count as assistant
    tokens only if they start inside it.
    """
    text, spans = assistant_char_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    mask = [0] * len(ids)
    for k, (start, end) in enumerate(offsets):
        if end > start and any(a <= start < b for a, b in spans):
            mask[k] = 1
    if max_length is not None:
        ids, mask = ids[:max_length], mask[:max_length]
    return {"input_ids": ids, "loss_mask": mask}


# ---------------------------------------------------------------------------------------------
# target features, cached as datasets shards
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def target_features(target, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The target's post-norm last hidden state (the EAGLE feature), (b, s, H)."""
    return target.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


AUX_COLUMN = "aux_hidden_states"
"""Cache column of the inputs of the target layers an EAGLE-3 drafter fuses (HF ``hidden_states[i]``,
concatenated in ascending layer order, (L, k*H)); a name of its own so a cache written without them is
never read as if it had them. The layer ids are in the metadata under ``aux_hidden_state_layer_ids``."""


@torch.no_grad()
def target_layer_inputs(target, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, layer_ids) -> tuple:
    """(post-norm last hidden state (b, s, H), inputs of decoder layers ``layer_ids`` concatenated (b, s, k*H)):
    the decoding loop's own capture (:func:`hf_spec.decoding.forward_with_layer_inputs`), so training reads
    exactly what an EAGLE-3 drafter is handed at decoding time."""
    from ..decoding import forward_with_layer_inputs, target_layers

    base = target.base_model
    layers = target_layers(base, sorted(int(i) for i in layer_ids))
    return forward_with_layer_inputs(base, layers, input_ids=input_ids, attention_mask=attention_mask)


def _features_schema(hidden_size: int, storage: str, aux_width: int | None = None):
    from datasets import Array2D, Features, Sequence, Value

    stored = {"bfloat16": "int16", "float16": "float16", "float32": "float32"}[storage]
    return Features(
        {
            "id": Value("string"),
            "input_ids": Sequence(Value("int32")),
            "loss_mask": Sequence(Value("int8")),
            "hidden_states": Array2D(shape=(None, hidden_size), dtype=stored),
            **({AUX_COLUMN: Array2D(shape=(None, aux_width), dtype=stored)} if aux_width else {}),
        }
    )


def _to_storage(features: torch.Tensor, storage: str) -> np.ndarray:
    tensor = features.to(FEATURE_DTYPES[storage]).cpu()
    if storage == "bfloat16":  # arrow has no bf16: keep the raw bits
        return tensor.view(torch.int16).numpy()
    return tensor.numpy()


def features_from_storage(array, storage: str) -> torch.Tensor:
    """Inverse of the on-disk encoding: a stored feature array -> a float tensor."""
    if storage == "bfloat16":  # formats may widen the stored int16 bits; narrow them back first
        return torch.from_numpy(np.asarray(array).astype(np.int16, copy=False)).view(torch.bfloat16)
    return torch.as_tensor(np.asarray(array))


def finished_shard(path, ids: list) -> bool:
    """Whether the cache shard at ``path`` was already written (a resumed run skips it), after checking
    that it holds exactly the examples ``ids`` this run would write there.

    Raises ValueError naming the fix when it holds others: a cache resumed with other conversations
    (another data file, ``--num_conversations``, length filter or shard size) would otherwise mix two
    data sets under metadata that describes only one."""
    from datasets import load_from_disk

    if not Path(path, "dataset_info.json").exists():
        return False
    held = [str(i) for i in load_from_disk(str(path)).select_columns(["id"])["id"]]
    if sorted(held) != sorted(str(i) for i in ids):
        raise ValueError(
            f"The existing shard {path} holds other examples than this run would write there ({len(held)} vs "
            f"{len(ids)} examples, e.g. {held[:2]}): the cache was started with other conversations or settings. "
            "Fix: give a new output directory, or resume with exactly the arguments that started it."
        )
    return True


def check_no_extra_shards(output_dir, num_shards: int) -> None:
    """ValueError when ``output_dir`` holds finished shards past the ``num_shards`` this run writes
    (left by a run over more conversations; they would be loaded as part of this cache)."""
    extra = [p.name for p in sorted(Path(output_dir).glob("shard-*"))
             if re.fullmatch(r"shard-\d+", p.name) and int(p.name.split("-")[1]) >= num_shards
             and (p / "dataset_info.json").exists()]  # fmt: skip; other names (a stray "shard-old" copy) are not shards
    if extra:
        raise ValueError(
            f"{output_dir} holds shards {extra} beyond the {num_shards} this run writes: the cache was started over "
            "more conversations. Fix: give a new output directory, or resume with the arguments that started it."
        )


def build_feature_cache(
    target,
    tokenizer,
    conversations: list[dict],
    output_dir: str,
    max_length: int = 1024,
    storage: str = "bfloat16",
    batch_tokens: int = 4096,
    shard_examples: int = 256,
    min_assistant_tokens: int = 1,
) -> str:
    """Tokenize ``conversations``, run ``target`` once per example and save features as shards.

    Each shard ``output_dir/shard-XXXXX`` is a ``datasets.Dataset`` saved with
    ``save_to_disk`` holding ``id``, ``input_ids``, ``loss_mask`` and ``hidden_states``
    (``storage`` dtype; bf16 stored as int16 bits). Existing shards are kept (resumable).
    Prints the on-disk size estimate before running the target.
    """
    from datasets import Dataset

    os.makedirs(output_dir, exist_ok=True)
    hidden = target.config.get_text_config().hidden_size
    examples = []
    for convo in tqdm(conversations, desc="tokenize", leave=False):
        try:
            tok = tokenize_conversation(tokenizer, convo["messages"], max_length)
        except ValueError:
            continue
        if sum(tok["loss_mask"]) >= min_assistant_tokens and len(tok["input_ids"]) >= 3:
            examples.append({"id": convo["id"], **tok})
    num_tokens = sum(len(e["input_ids"]) for e in examples)
    bytes_per = torch.finfo(FEATURE_DTYPES[storage]).bits // 8
    print(
        f"[hf_spec] feature cache: {len(examples)} examples, {num_tokens} tokens, hidden {hidden}, {storage}: "
        f"~{num_tokens * hidden * bytes_per / 2**20:.0f} MiB on disk in {output_dir}",
        flush=True,
    )
    meta = {"storage": storage, "hidden_size": hidden, "max_length": max_length, "num_examples": len(examples),
            "num_tokens": num_tokens, "target": compat.model_name_or_path(target.config)}  # fmt: skip
    schema = _features_schema(hidden, storage)
    device = target.device
    num_shards = math.ceil(len(examples) / shard_examples)
    check_no_extra_shards(output_dir, num_shards)
    progress = tqdm(total=num_tokens, desc="target features", unit="tok")
    for shard in range(num_shards):
        path = os.path.join(output_dir, f"shard-{shard:05d}")
        chunk = examples[shard * shard_examples : (shard + 1) * shard_examples]
        if finished_shard(path, [e["id"] for e in chunk]):
            progress.update(sum(len(e["input_ids"]) for e in chunk))
            continue
        rows = {"id": [], "input_ids": [], "loss_mask": [], "hidden_states": []}
        order = sorted(range(len(chunk)), key=lambda k: len(chunk[k]["input_ids"]))
        start = 0
        while start < len(order):  # length-sorted batches, right padded (causal: padding never attended)
            longest = len(chunk[order[start]]["input_ids"])
            end = start + 1
            while end < len(order) and (end - start + 1) * len(chunk[order[end]]["input_ids"]) <= batch_tokens:
                end += 1
            batch = [chunk[k] for k in order[start:end]]
            longest = max(len(e["input_ids"]) for e in batch)
            ids = torch.zeros(len(batch), longest, dtype=torch.long)
            attn = torch.zeros(len(batch), longest, dtype=torch.long)
            for r, e in enumerate(batch):
                ids[r, : len(e["input_ids"])] = torch.tensor(e["input_ids"])
                attn[r, : len(e["input_ids"])] = 1
            feats = target_features(target, ids.to(device), attn.to(device))
            for r, e in enumerate(batch):
                n = len(e["input_ids"])
                rows["id"].append(e["id"])
                rows["input_ids"].append(e["input_ids"])
                rows["loss_mask"].append(e["loss_mask"])
                rows["hidden_states"].append(_to_storage(feats[r, :n], storage))
            progress.update(sum(len(e["input_ids"]) for e in batch))
            start = end
        Dataset.from_dict(rows, features=schema).save_to_disk(path)
    progress.close()
    Path(output_dir, _META_FILE).write_text(json.dumps(meta, indent=1))
    return output_dir


def load_feature_cache(path: str, aux_layer_ids=None):
    """All shards of a feature cache as one ``datasets.Dataset`` (+ its storage dtype).

    ``aux_layer_ids``: the target layers whose inputs the caller needs (EAGLE-3); ValueError naming the
    fix unless the cache holds exactly those (:func:`add_layer_features`)."""
    from datasets import concatenate_datasets, load_from_disk

    meta = json.loads(Path(path, _META_FILE).read_text())
    if aux_layer_ids is not None:
        wanted, held = sorted(int(i) for i in aux_layer_ids), meta.get("aux_hidden_state_layer_ids")
        if held != wanted:
            what = "only the target's last hidden state" if held is None else f"the inputs of target layers {held}"
            raise ValueError(
                f"The feature cache {path} holds {what}, but this drafter reads the inputs of target layers {wanted} "
                f"(EAGLE-3). Fix: extend it with hf_spec.training.data.add_layer_features(cache, target, {wanted}) "
                "(`python -m hf_spec.training.data layers --feature_cache CACHE --layers ...`), or let "
                "train_eagle3.py do it (it writes the extended cache next to the one you give)."
            )
    # a shard counts once written completely (a running or killed writer may leave a partial one)
    shards = sorted(p for p in Path(path).iterdir() if p.name.startswith("shard-") and (p / "dataset_info.json").exists())
    if not shards:
        raise FileNotFoundError(f"No feature shards in {path}; build them with `python -m hf_spec.training.data features`.")
    dataset = concatenate_datasets([load_from_disk(str(p)) for p in shards])
    return dataset, meta["storage"]


def datastore_from_feature_cache(path, min_match: int = 2, max_match: int = 4):
    """An :class:`~hf_spec.drafters.datastore.NGramDatastore` over the answer (loss) tokens of a training feature
    cache: after self-distillation (:mod:`hf_spec.training.distill`) those are the target's own greedy answers."""
    from ..drafters.datastore import NGramDatastore

    cache = load_feature_cache(str(path))[0].select_columns(["input_ids", "loss_mask"])
    documents = ([t for t, m in zip(row["input_ids"], row["loss_mask"]) if m] for row in cache)
    return NGramDatastore.from_documents(documents, min_match, max_match)


def layer_cache_dir(base: str, layer_ids) -> str:
    """Where the copy of cache ``base`` extended with the inputs of target layers ``layer_ids`` lives (beside it)."""
    return f"{os.path.normpath(base)}+layers-{'-'.join(str(int(i)) for i in sorted(layer_ids))}"


@torch.no_grad()
def add_layer_features(base: str, target, layer_ids, output_dir: str | None = None, batch_tokens: int = 4096) -> str:
    """A copy of feature cache ``base`` with the :data:`AUX_COLUMN` column added: the inputs of target layers
    ``layer_ids`` over the cached token ids (one prefill forward per batch of examples).

    Ids, loss masks and last hidden states are copied as they are (a self-distilled cache keeps its
    decode-time features), so the extended cache trains on exactly the same data. Written shard by shard
    to ``output_dir`` (default :func:`layer_cache_dir`); existing shards are kept (resumable)."""
    from datasets import Dataset, load_from_disk

    ids = sorted(int(i) for i in layer_ids)
    output_dir = output_dir or layer_cache_dir(base, ids)
    meta = json.loads(Path(base, _META_FILE).read_text())
    if meta.get("aux_hidden_state_layer_ids") is not None:
        raise ValueError(f"{base} already holds layer inputs {meta['aux_hidden_state_layer_ids']}; extend the cache it "
                         f"was made from ({meta.get('base_cache')}).")  # fmt: skip
    storage, hidden = meta["storage"], meta["hidden_size"]
    schema = _features_schema(hidden, storage, len(ids) * hidden)
    os.makedirs(output_dir, exist_ok=True)
    shards = sorted(p for p in Path(base).iterdir() if p.name.startswith("shard-") and (p / "dataset_info.json").exists())
    check_no_extra_shards(output_dir, len(shards))
    device = target.device
    for shard in tqdm(shards, desc=f"target layers {ids}", unit="shard"):
        out_path = Path(output_dir, shard.name)
        data = load_from_disk(str(shard))
        if finished_shard(out_path, data.select_columns(["id"])["id"]):  # refuses a shard of an older base cache
            continue
        token_ids = data.select_columns(["input_ids"])["input_ids"]
        lengths = [len(x) for x in token_ids]
        aux = [None] * len(lengths)
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        start = 0
        while start < len(order):  # length-sorted, right-padded batches, as build_feature_cache
            end = start + 1
            while end < len(order) and (end - start + 1) * lengths[order[end]] <= batch_tokens:
                end += 1
            batch = order[start:end]
            longest = max(lengths[k] for k in batch)
            input_ids = torch.zeros(len(batch), longest, dtype=torch.long)
            attn = torch.zeros(len(batch), longest, dtype=torch.long)
            for r, k in enumerate(batch):
                input_ids[r, : lengths[k]] = torch.tensor(token_ids[k])
                attn[r, : lengths[k]] = 1
            fused = target_layer_inputs(target, input_ids.to(device), attn.to(device), ids)[1]
            for r, k in enumerate(batch):
                aux[k] = _to_storage(fused[r, : lengths[k]], storage)
            start = end
        rows = {name: list(data.with_format("numpy")[name]) if name == "hidden_states" else data[name]
                for name in data.column_names}  # fmt: skip
        rows[AUX_COLUMN] = aux
        Dataset.from_dict(rows, features=schema).save_to_disk(str(out_path))
    meta = {**meta, "aux_hidden_state_layer_ids": ids, "base_cache": os.path.abspath(base)}
    Path(output_dir, _META_FILE).write_text(json.dumps(meta, indent=1))
    return output_dir


def feature_cache_dir(root: str, target_name: str, dataset: str, num_conversations, max_length: int, storage: str):
    """A cache directory name that changes whenever the inputs of the cache change."""
    key = json.dumps([target_name, os.path.abspath(dataset) if os.path.exists(dataset) else dataset,
                      num_conversations, max_length, storage])  # fmt: skip
    slug = Path(str(target_name)).name.replace("/", "_")
    return os.path.join(root, f"{slug}-{Path(dataset).stem}-{hashlib.sha256(key.encode()).hexdigest()[:10]}")


# ---------------------------------------------------------------------------------------------
# self-distillation (HASS A.4): the target answers every user turn itself, greedily
# ---------------------------------------------------------------------------------------------
@torch.no_grad()
def self_distill(
    target,
    tokenizer,
    conversations: list[dict],
    output_path: str,
    max_new_tokens: int = 256,
    max_turns: int = 2,
    max_prompt_tokens: int = 768,
    batch_size: int = 16,
    stop_after: int | None = None,
) -> str:
    """Regenerate assistant turns with ``target`` (greedy), writing one jsonl line per conversation.

    Turn by turn, as HASS A.4: the user turns are kept, each assistant answer is the target's
    own greedy continuation given the previous *generated* answers. Conversations whose id is
    already in ``output_path`` are skipped, so an interrupted run resumes where it stopped.
    Conversations are processed shortest first prompt first, in batches of ``batch_size``;
    ``stop_after`` stops once that many conversations are in the file. Batches are
    left-padded; greedy answers may differ from unbatched ones in the last ulp, which does not
    matter for training data.
    """
    done = set()
    if os.path.exists(output_path):
        done = {json.loads(line)["id"] for line in open(output_path) if line.strip()}
    todo = [c for c in conversations if c["id"] not in done]
    # similar prompt lengths in a batch: less left padding (resuming is by id, so order is free)
    todo.sort(key=lambda c: len(next(m["content"] for m in c["messages"] if m["role"] == "user")))
    print(f"[hf_spec] self-distill: {len(done)} done, {len(todo)} to go -> {output_path}", flush=True)
    tokenizer.padding_side = "left"
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stop_ids = stop_token_ids(target, tokenizer)
    os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
    with open(output_path, "a") as out:
        written = len(done)
        for start in tqdm(range(0, len(todo), batch_size), desc="self-distill", unit="batch"):
            if stop_after is not None and written >= stop_after:
                break
            chunk = todo[start : start + batch_size]
            system = [c["messages"][:1] if c["messages"][0]["role"] == "system" else [] for c in chunk]
            users = [[m["content"] for m in c["messages"] if m["role"] == "user"][:max_turns] for c in chunk]
            dialogs = [list(s) for s in system]
            alive = list(range(len(chunk)))
            for turn in range(max_turns):
                alive = [i for i in alive if turn < len(users[i])]
                prompts = []
                for i in alive:
                    dialogs[i].append({"role": "user", "content": users[i][turn]})
                    prompts.append(tokenizer.apply_chat_template(dialogs[i], add_generation_prompt=True, tokenize=False))
                enc = tokenizer(prompts, add_special_tokens=False)
                keep = [k for k, ids in enumerate(enc["input_ids"]) if len(ids) <= max_prompt_tokens]
                for k in set(range(len(alive))) - set(keep):
                    dialogs[alive[k]].pop()  # prompt too long: the conversation ends before this turn
                alive = [alive[k] for k in keep]
                if not alive:
                    break
                batch = tokenizer([prompts[k] for k in keep], add_special_tokens=False, padding=True, return_tensors="pt")
                output = _plain_generate(target, batch.to(target.device), max_new_tokens, pad_id)
                new = output[:, batch["input_ids"].shape[1] :].tolist()
                for i, ids in zip(alive, new):
                    cut = next((k for k, t in enumerate(ids) if t in stop_ids), len(ids))
                    dialogs[i].append({"role": "assistant", "content": tokenizer.decode(ids[:cut], skip_special_tokens=True)})
            for c, d in zip(chunk, dialogs):
                if any(m["role"] == "assistant" for m in d):
                    out.write(json.dumps({"id": c["id"], "messages": d}) + "\n")
                    written += 1
            out.flush()
    return output_path


def stop_token_ids(target, tokenizer) -> set[int]:
    """The ids that end an answer: the target's generation-config EOS id(s) and the tokenizer's EOS."""
    eos = target.generation_config.eos_token_id
    return (set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}) - {None}


def _plain_generate(target, batch, max_new_tokens, pad_id):
    """Plain greedy generate() (no assistant: hf-spec's routing passes it through untouched)."""
    return target.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad_id)


# ---------------------------------------------------------------------------------------------
# the target model
# ---------------------------------------------------------------------------------------------
def load_target(name_or_path: str, dtype: torch.dtype = torch.float32):
    """(frozen target in eval mode, tokenizer) from a local directory or a packaged name."""
    from ..resources import load_model

    model, tokenizer = load_model(name_or_path, dtype=dtype)
    model.requires_grad_(False)
    return model.eval(), tokenizer


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------
def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m hf_spec.training.data", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sd = sub.add_parser("self-distill", help="regenerate assistant answers with the target (greedy, resumable)")
    ft = sub.add_parser("features", help="cache target features as datasets shards")
    ly = sub.add_parser("layers", help="copy a feature cache, adding the inputs of target layers (EAGLE-3)")
    ly.add_argument("--target_model", default="smollm2-135m-instruct", help="packaged name or local path")
    ly.add_argument("--dtype", default="auto", choices=["auto", *sorted(FEATURE_DTYPES)])
    ly.add_argument("--feature_cache", required=True, help="the cache to extend")
    ly.add_argument("--layers", type=int, nargs="+", required=True, help="target layer ids, e.g. 2 15 27")
    ly.add_argument("--output", default=None, help="default: CACHE+layers-<ids> beside it")
    for p in (sd, ft):
        p.add_argument("--target_model", default="smollm2-135m-instruct", help="packaged name or local path")
        p.add_argument("--dataset", default="sharegpt", help="sharegpt | chitchat | path to .jsonl")
        p.add_argument("--num_conversations", type=int, default=None)
        p.add_argument("--dtype", default="auto", choices=["auto", *sorted(FEATURE_DTYPES)])
        p.add_argument("--output", required=True)
    sd.add_argument("--max_new_tokens", type=int, default=256)
    sd.add_argument("--max_turns", type=int, default=2)
    sd.add_argument("--batch_size", type=int, default=16)
    sd.add_argument("--stop_after", type=int, default=None, help="stop once this many conversations are done")
    sd.add_argument("--shuffle_seed", type=int, default=None, help="shuffle before taking num_conversations")
    ft.add_argument("--max_length", type=int, default=1024)
    ft.add_argument("--storage", default="bfloat16", choices=sorted(FEATURE_DTYPES))
    args = parser.parse_args(argv)
    target, tokenizer = load_target(args.target_model, resolve_dtype(args.dtype))
    if args.command == "layers":
        print(add_layer_features(args.feature_cache, target, args.layers, args.output))
        return
    if args.command == "self-distill":
        conversations = load_conversations(args.dataset)
        if args.shuffle_seed is not None:
            random.Random(args.shuffle_seed).shuffle(conversations)
        self_distill(target, tokenizer, conversations[: args.num_conversations], args.output,
                     args.max_new_tokens, args.max_turns, batch_size=args.batch_size, stop_after=args.stop_after)  # fmt: skip
    else:
        conversations = load_conversations(args.dataset, args.num_conversations)
        build_feature_cache(target, tokenizer, conversations, args.output, args.max_length, args.storage)


if __name__ == "__main__":
    main()
