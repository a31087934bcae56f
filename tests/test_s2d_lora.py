"""S2D small checkpoints (issue #16 item 3): LoRA adapters on layers borrowed from the source model.

The saved folder holds adapters, the final (exit) norm and the draft-vocabulary map only; a loaded
drafter borrows the source's layers, embedding and head at bind time (one from_pretrained call)."""

import copy
import warnings

import pytest
import torch
from safetensors import safe_open

import hf_spec
from conftest import make_target, plain_generate, random_prompt, save_and_read_keys, sorted_loss_before_after_training
from hf_spec.drafters.s2d import SortedDrafter

pytest.importorskip("peft")


def named(model, name):
    model.config._name_or_path = name
    return model


def lora_drafter(rank=4, seed=0):
    source = named(make_target("qwen2", vocab_size=128, num_hidden_layers=6, seed=seed), "tiny-qwen2-source")
    entry = hf_spec.drafters.s2d.target_entry(source, (0.9, 0.9, 0.0))
    # all 6 source layers: the last exit starts as the target itself, so drafts are accepted
    drafter = SortedDrafter.from_source_model(source, num_layers=6, exits=[2, 4, 6], targets=[entry])
    drafter.add_lora(rank)
    return source, drafter


def few_steps(drafter, steps=3, lr=2e-3):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 128, (4, 16), generator=g)
    trainable = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=lr)
    drafter.train()
    for _ in range(steps):
        loss = drafter(ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return drafter.eval()


def test_only_adapters_and_norm_train():
    _, drafter = lora_drafter()
    trainable = {n for n, p in drafter.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n or n.startswith("norm.") for n in trainable), trainable
    assert "norm.weight" in trainable
    ids = random_prompt(8)
    with torch.no_grad():  # LoRA B starts at zero: the drafter is the truncated source
        before = drafter(ids).logits_per_exit[-1]
    few_steps(drafter)
    with torch.no_grad():
        assert not torch.allclose(drafter(ids).logits_per_exit[-1], before)


def test_lora_checkpoint_is_small_and_reloads_bound_to_the_source(tmp_path):
    source, drafter = lora_drafter()
    few_steps(drafter)
    counts = torch.bincount(plain_generate(source, torch.cat([random_prompt(6, seed=s) for s in range(4)]),
                                           max_new_tokens=12, do_sample=False)[:, 6:].reshape(-1), minlength=128)  # fmt: skip
    drafter.set_draft_vocab(counts, 48)
    ids = random_prompt(9, seed=4)
    reference, keys = save_and_read_keys(drafter, ids, tmp_path)
    assert keys and all(".lora_" in k or k.startswith("norm.") or k in ("d2t", "t2d") for k in keys), keys
    assert {"d2t", "t2d", "norm.weight"} <= keys
    assert not any("embed_tokens" in k or "lm_head" in k or "base_layer" in k for k in keys)
    full_layer_bytes = sum(p.numel() * 4 for p in source.model.layers[0].parameters())
    assert (tmp_path / "model.safetensors").stat().st_size < full_layer_bytes  # less than ONE full layer
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = SortedDrafter.from_pretrained(tmp_path)
    assert loaded.config.lora["r"] == 4
    with pytest.raises(RuntimeError, match="bind"):
        loaded(ids)
    loaded.bind(source)  # the target is the source: its layers are borrowed, adapters merged
    with torch.no_grad():
        for a, b in zip(loaded(ids).logits_per_exit, reference):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    for seed in (1, 2):
        prompt = random_prompt(10, seed=seed)
        expected = plain_generate(source, prompt, max_new_tokens=20, do_sample=False)
        out = source.generate(prompt, assistant_model=loaded, max_new_tokens=20, do_sample=False, tree_depth=4)
        assert torch.equal(out, expected)
    assert sum(loaded.last_generation_stats.accepted_lengths) > 0
    lm = loaded.to_causal_lm()  # a plain transformers LM with the adapters folded in
    with torch.no_grad():
        torch.testing.assert_close(lm(ids).logits[..., loaded.draft_ids], reference[-1], atol=1e-4, rtol=1e-4)
    # the source's own weights were copied, not changed by the merge
    torch.testing.assert_close(source.model.layers[0].self_attn.q_proj.weight,
                               make_target("qwen2", vocab_size=128, num_hidden_layers=6).model.layers[0].self_attn.q_proj.weight)  # fmt: skip


def test_a_target_that_is_not_the_source_needs_the_source(tmp_path):
    source, drafter = lora_drafter()
    drafter.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = SortedDrafter.from_pretrained(tmp_path)
        # same vocabulary, other weights and a different layer count (e.g. the 1.5B): the source cannot be loaded here
        other = named(make_target("qwen2", vocab_size=128, num_hidden_layers=3, seed=7), "someone/else")
        with pytest.raises(ValueError, match=r"borrowed at bind time from its source model 'tiny-qwen2-source'.*Fix"):
            loaded.bind(other)
        same_shape = named(make_target("qwen2", vocab_size=128, num_hidden_layers=6, seed=8), "tiny-qwen2-source")
        with pytest.raises(ValueError, match=r"other weights than the source's.*Fix: pass the source model"):
            loaded.attach_source(same_shape)
        wider = make_target("qwen2", vocab_size=128, num_hidden_layers=6, hidden_size=96)
        with pytest.raises(ValueError, match=r"hidden_size 96 != source's 64"):
            loaded.attach_source(wider)
        # with the source attached, it serves another target
        # a bf16 copy is still the source (checksums tolerate the rounding); its matrices are converted, not shared
        loaded.attach_source(copy.deepcopy(source).to(torch.bfloat16)).bind(other)
        assert loaded.embed_tokens.weight.dtype == torch.float32
        prompt = random_prompt(10, seed=3)
        out = other.generate(prompt, assistant_model=loaded, max_new_tokens=16, do_sample=False)
        assert torch.equal(out, plain_generate(other, prompt, max_new_tokens=16, do_sample=False))


def test_sorted_trainer_trains_the_adapters(tmp_path):
    _, drafter = lora_drafter()
    frozen = drafter.layers[0].self_attn.q_proj.base_layer.weight.clone()
    g = torch.Generator().manual_seed(0)
    pattern = torch.randint(1, 128, (8,), generator=g)
    rows = [{"input_ids": pattern.roll(i).repeat(3).tolist(), "labels": pattern.roll(i).repeat(3).tolist()}
            for i in range(8)]  # fmt: skip
    before, after = sorted_loss_before_after_training(drafter, rows, tmp_path, max_steps=10, learning_rate=1e-2)
    assert after < before, (before, after)
    assert torch.equal(drafter.layers[0].self_attn.q_proj.base_layer.weight, frozen)


def test_trainer_checkpoints_hold_only_adapters_and_resume(tmp_path):
    from transformers.trainer_utils import get_last_checkpoint

    from hf_spec.training.s2d_trainer import SortedTrainer, SortedTrainingConfig, pad_collator

    pattern = torch.randint(1, 128, (8,), generator=torch.Generator().manual_seed(0))
    rows = [{"input_ids": pattern.roll(i).repeat(3).tolist(), "labels": pattern.roll(i).repeat(3).tolist()}
            for i in range(8)]  # fmt: skip
    args = SortedTrainingConfig(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=8,
                                gradient_accumulation_steps=1, learning_rate=1e-2, warmup_ratio=0.0, save_strategy="steps",
                                save_steps=3, logging_strategy="no", use_cpu=True, dataloader_num_workers=0)  # fmt: skip
    _, drafter = lora_drafter()
    SortedTrainer(model=drafter.train(), args=args, train_dataset=rows, data_collator=pad_collator(0)).train()
    last = get_last_checkpoint(str(tmp_path))
    with safe_open(f"{last}/model.safetensors", "pt") as f:
        assert all(".lora_" in k or k.startswith("norm.") for k in f.keys())
    _, fresh = lora_drafter()
    SortedTrainer(model=fresh.train(), args=args, train_dataset=rows, data_collator=pad_collator(0)).train(
        resume_from_checkpoint=last
    )
    for mine, theirs in zip(fresh.state_dict().items(), drafter.state_dict().items()):
        assert mine[0] == theirs[0] and torch.equal(mine[1], theirs[1]), mine[0]
