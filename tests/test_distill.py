"""Self-distillation that keeps the target's features (hf_spec.training.distill)."""

import json

import pytest
import torch
from conftest import make_target
from test_training import _conversations, tiny_chat_tokenizer

from hf_spec.training.data import features_from_storage, load_feature_cache
from hf_spec.training.distill import distill_features, first_turn_prompts, greedy_with_features


def _stop_ids(target, tok):
    return {tok.convert_tokens_to_ids("<|im_end|>")}


def test_batched_greedy_with_features_equals_plain_generate_and_a_full_forward():
    target, tok = make_target("llama", vocab_size=64, logit_scale=3.0), tiny_chat_tokenizer()
    prompts = [p["prompt_ids"] for p in first_turn_prompts(tok, _conversations(5, seed=3), 64)]
    assert len({len(p) for p in prompts}) > 1  # left padding really happens
    stop = _stop_ids(target, tok)
    results = greedy_with_features(target, prompts, max_new_tokens=7, stop_ids=stop, pad_id=tok.pad_token_id)
    for prompt, (answer, features) in zip(prompts, results):
        ids = torch.tensor([prompt])
        plain = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=7, do_sample=False,
                                eos_token_id=sorted(stop), pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
        assert answer == plain[: len(answer)] and (len(answer) == 7 or answer[-1] in stop)
        full = target.base_model(torch.tensor([prompt + answer])).last_hidden_state[0]
        assert features.shape == full.shape  # prompt + every generated token, the last one included
        torch.testing.assert_close(features, full, atol=1e-5, rtol=1e-4)


def test_distillation_writes_a_resumable_feature_cache(tmp_path):
    target, tok = make_target("llama", vocab_size=64, logit_scale=3.0), tiny_chat_tokenizer()
    conversations = _conversations(10, seed=4)
    out = str(tmp_path / "cache")
    distill_features(target, tok, conversations, out, max_new_tokens=5, max_prompt_tokens=64, batch_size=3,
                     shard_examples=4, limit=6)
    dataset, storage = load_feature_cache(out)
    meta = json.loads((tmp_path / "cache" / "hf_spec_features.json").read_text())
    assert len(dataset) == meta["num_examples"] == 6 and storage == "bfloat16"
    row = dataset[0]
    assert len(row["input_ids"]) == len(row["loss_mask"]) == len(row["hidden_states"])
    assert sum(row["loss_mask"]) >= 1 and row["loss_mask"][0] == 0  # answer tokens only
    features = features_from_storage(row["hidden_states"], storage).float()
    full = target.base_model(torch.tensor([row["input_ids"]])).last_hidden_state[0]
    torch.testing.assert_close(features, full, atol=0.05, rtol=0.02)  # bf16 storage
    # a second run finds every shard written and redoes nothing
    first = sorted(p.stat().st_mtime_ns for p in (tmp_path / "cache").glob("shard-*/*.arrow"))
    distill_features(target, tok, conversations, out, max_new_tokens=5, max_prompt_tokens=64, batch_size=3,
                     shard_examples=4, limit=6)
    assert sorted(p.stat().st_mtime_ns for p in (tmp_path / "cache").glob("shard-*/*.arrow")) == first
    # resuming over other conversations would mix two data sets under one metadata file: refused
    others = [dict(c, id=f"other-{c['id']}") for c in conversations]
    with pytest.raises(ValueError, match="holds other examples.*new output directory"):
        distill_features(target, tok, others, out, max_new_tokens=5, max_prompt_tokens=64, batch_size=3,
                         shard_examples=4, limit=6)
    with pytest.raises(ValueError, match=r"beyond the 1 this run writes"):  # fewer shards than the cache holds
        distill_features(target, tok, conversations, out, max_new_tokens=5, max_prompt_tokens=64, batch_size=3,
                         shard_examples=4, limit=3)
    # a shard left half-written by a killed run is not read
    (tmp_path / "cache" / "shard-00009").mkdir()
    assert len(load_feature_cache(out)[0]) == 6


def test_skip_answers_only_the_prompts_after_the_first_ones(tmp_path):
    target, tok = make_target("llama", vocab_size=64, logit_scale=3.0), tiny_chat_tokenizer()
    conversations = _conversations(10, seed=4)
    usable = [p["id"] for p in first_turn_prompts(tok, conversations, 64)]
    distill_features(target, tok, conversations, str(tmp_path / "first"), max_new_tokens=3, max_prompt_tokens=64,
                     batch_size=4, shard_examples=8, limit=4)
    distill_features(target, tok, conversations, str(tmp_path / "next"), max_new_tokens=3, max_prompt_tokens=64,
                     batch_size=4, shard_examples=8, limit=4, skip=4)
    first, after = (sorted(load_feature_cache(str(tmp_path / d))[0]["id"]) for d in ("first", "next"))
    assert first == sorted(usable[:4]) and after == sorted(usable[4:8])


def test_known_greedy_tokens_give_the_same_draft_vocabulary_targets_without_the_full_head(monkeypatch):
    import hf_spec

    target = make_target("llama", vocab_size=64)
    drafter = hf_spec.EagleDrafter.from_target(target).set_draft_vocab(torch.arange(0, 64, 2))  # even ids
    features = target.base_model(torch.randint(0, 64, (1, 40))).last_hidden_state[0]
    full_logits, full_mask = drafter.training_targets(features)
    argmax = target.get_output_embeddings()(features).argmax(-1)
    assert 0 < int(full_mask.sum()) < 40  # some argmaxes fall outside the draft vocabulary
    rows = []
    real_linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda x, w, b=None: rows.append(w.shape[0]) or real_linear(x, w, b))
    logits, mask = drafter.training_targets(features, argmax_ids=argmax)
    assert rows == [32]  # only the draft rows of the head
    torch.testing.assert_close(logits, full_logits)
    assert torch.equal(mask, full_mask)


def test_feature_trainers_batch_similar_lengths(tmp_path):
    from test_training import _feature_cache
    from transformers.trainer_pt_utils import LengthGroupedSampler

    import hf_spec
    from hf_spec.training.pipeline import _feature_trainer, training_split
    from hf_spec.training.trainers import HassTrainingArguments

    target, path = _feature_cache(str(tmp_path))
    dataset, storage = load_feature_cache(path)
    args = HassTrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, per_device_train_batch_size=4,
                                 report_to="none")
    train_set, held_out = training_split(dataset, args)
    assert held_out is None
    trainer = _feature_trainer(hf_spec.training.trainers.HassTrainer, hf_spec.EagleDrafter.from_target(target), args,
                               train_set, held_out, storage, tiny_chat_tokenizer())
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, LengthGroupedSampler)
    lengths = trainer.train_dataset["length"]
    assert list(lengths) == [len(ids) for ids in dataset["input_ids"]]
    order = list(iter(sampler))
    batches = [[lengths[i] for i in order[k : k + 4]] for k in range(0, len(order) - 3, 4)]
    spread = sum(max(b) - min(b) for b in batches) / len(batches)
    assert spread < (max(lengths) - min(lengths)) / 2  # batches hold similar lengths


def test_an_interrupted_distillation_is_already_a_trainable_cache(tmp_path, monkeypatch):
    from hf_spec.training import distill

    target, tok = make_target("llama", vocab_size=64, logit_scale=3.0), tiny_chat_tokenizer()
    calls = []
    real = distill.greedy_with_features

    def killed_after_two_batches(*args, **kwargs):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(distill, "greedy_with_features", killed_after_two_batches)
    out = str(tmp_path / "cache")
    try:
        distill_features(target, tok, _conversations(10, seed=4), out, max_new_tokens=5, max_prompt_tokens=64,
                         batch_size=2, shard_examples=2, limit=6)
    except KeyboardInterrupt:
        pass
    dataset, _ = load_feature_cache(out)  # the two finished shards, with their metadata
    meta = json.loads((tmp_path / "cache" / "hf_spec_features.json").read_text())
    assert len(dataset) == meta["num_examples"] == 4


def test_the_command_line_distils_on_the_device_it_is_given(tmp_path):
    """``--device`` places the target (the recipe runs unchanged on a GPU with ``--device cuda``); a device
    this machine lacks fails before any prompt is answered."""
    from hf_spec.training import distill

    target, tok = make_target("llama", vocab_size=64, logit_scale=3.0), tiny_chat_tokenizer()
    target.save_pretrained(tmp_path / "target")
    tok.save_pretrained(tmp_path / "target")
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in _conversations(4, seed=5)))
    args = ["--target_model", str(tmp_path / "target"), "--dataset", str(data), "--num_conversations", "3",
            "--max_new_tokens", "3", "--dtype", "float32", "--batch_size", "2"]  # fmt: skip
    distill.main([*args, "--device", "cpu", "--output", str(tmp_path / "cache")])
    meta = json.loads((tmp_path / "cache" / "hf_spec_features.json").read_text())
    assert meta["num_examples"] == 3 and meta["num_loss_tokens"] >= 3
    with pytest.raises(RuntimeError, match="no-such-device"):
        distill.main([*args, "--device", "no-such-device", "--output", str(tmp_path / "other")])
    assert not (tmp_path / "other").exists()
