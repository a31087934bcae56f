"""Drafter training: losses against hand-computed values, the HASS step masks of Figure 3, the
chat loss mask, the feature cache, and Trainer runs (loss goes down; kill + resume == straight run)."""

from __future__ import annotations

import functools
import random
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import DynamicCache, PreTrainedTokenizerFast, TrainerCallback

import hf_spec
from conftest import make_target
from hf_spec.training.collators import FeatureCollator
from hf_spec.training.data import build_feature_cache, load_feature_cache, tokenize_conversation
from hf_spec.training.losses import (
    eagle_loss,
    hass_loss,
    hass_step_mask,
    shift_for_drafter,
    topk_distillation_loss,
)
from hf_spec.training.parallelspec import ParallelTrainer, ParallelTrainingArguments
from hf_spec.training.pipeline import assistant_token_counts, split_held_out
from hf_spec.training.trainers import (
    CoralTrainer,
    CoralTrainingArguments,
    EagleTrainer,
    EagleTrainingArguments,
    HassTrainer,
    HassTrainingArguments,
    RouterTrainer,
    RouterTrainingArguments,
    recipe_settings,
)

LN = torch.log


# --------------------------------------------------------------------------------------------
# losses against hand-computed values
# --------------------------------------------------------------------------------------------
def test_eagle_loss_hand_computed():
    # two positions, H = 2, V = 4; the second position is masked out
    pred_feat = torch.tensor([[[0.0, 2.0], [9.0, 9.0]]])
    target_feat = torch.tensor([[[0.0, 0.0], [0.0, 0.0]]])
    target_logits = LN(torch.tensor([[[0.1, 0.2, 0.3, 0.4], [1.0, 1.0, 1.0, 1.0]]]))
    pred_logits = torch.zeros(1, 2, 4)
    out = eagle_loss(pred_feat, target_feat, pred_logits, target_logits, torch.tensor([[1, 0]]))
    # SmoothL1 per element: 0 and |2| - 0.5 = 1.5 -> mean 0.75; CE vs uniform p = ln 4
    assert out["reg"].item() == pytest.approx(0.75)
    assert out["cls"].item() == pytest.approx(1.3862944)
    assert out["loss"].item() == pytest.approx(0.75 + 0.1 * 1.3862944)


def test_topk_loss_hand_computed():
    target_logits = LN(torch.tensor([[[0.1, 0.2, 0.3, 0.4], [0.4, 0.3, 0.2, 0.1]]]))
    pred_logits = torch.stack([torch.zeros(4), LN(torch.tensor([0.1, 0.1, 0.4, 0.4]))]).unsqueeze(0)
    # K = 2. position 0: top tokens {3, 2} (q = .4, .3), p = .25 each -> -(.7) ln .25
    # position 1: top tokens {0, 1} (q = .4, .3), p = .1 each -> -(.7) ln .1
    first, second = -0.7 * torch.log(torch.tensor(0.25)), -0.7 * torch.log(torch.tensor(0.1))
    loss = topk_distillation_loss(pred_logits, target_logits, k=2)
    assert loss.item() == pytest.approx(((first + second) / 2).item(), rel=1e-6)
    masked = topk_distillation_loss(pred_logits, target_logits, torch.tensor([[0, 1]]), k=2)
    assert masked.item() == pytest.approx(second.item(), rel=1e-6)
    # K = V: the full cross-entropy (EAGLE's cls term)
    full = topk_distillation_loss(pred_logits, target_logits, k=4)
    assert full.item() == pytest.approx(eagle_loss(pred_logits, pred_logits, pred_logits, target_logits)["cls"].item())


# --------------------------------------------------------------------------------------------
# HASS step masks (Figure 3 / A.1), 5 tokens, spelled out by hand: 1 = may attend
# --------------------------------------------------------------------------------------------
FIG3_STEP2 = [  # keys: target features k(l)_0..4 | step-1 drafts k(s1)_0..4
    [0, 0, 0, 0, 0,  1, 0, 0, 0, 0],
    [1, 0, 0, 0, 0,  0, 1, 0, 0, 0],
    [1, 1, 0, 0, 0,  0, 0, 1, 0, 0],
    [1, 1, 1, 0, 0,  0, 0, 0, 1, 0],
    [1, 1, 1, 1, 0,  0, 0, 0, 0, 1],
]  # fmt: skip
FIG3_STEP3 = [  # keys: k(l)_0..4 | k(s1)_0..4 | k(s2)_0..4
    [0, 0, 0, 0, 0,  0, 0, 0, 0, 0,  1, 0, 0, 0, 0],
    [0, 0, 0, 0, 0,  1, 0, 0, 0, 0,  0, 1, 0, 0, 0],
    [1, 0, 0, 0, 0,  0, 1, 0, 0, 0,  0, 0, 1, 0, 0],
    [1, 1, 0, 0, 0,  0, 0, 1, 0, 0,  0, 0, 0, 1, 0],
    [1, 1, 1, 0, 0,  0, 0, 0, 1, 0,  0, 0, 0, 0, 1],
]  # fmt: skip


@pytest.mark.parametrize("step,expected", [(2, FIG3_STEP2), (3, FIG3_STEP3)])
def test_hass_step_mask_matches_figure_3(step, expected):
    mask = hass_step_mask(5, step)
    assert mask.shape == (1, 1, 5, 5 * step)
    allowed = (mask[0, 0] == 0).int()
    assert allowed.tolist() == expected
    assert (mask[0, 0][allowed == 0] == torch.finfo(torch.float32).min).all()


def test_hass_step_one_is_causal():
    allowed = (hass_step_mask(5, 1)[0, 0] == 0).int()
    assert allowed.tolist() == torch.tril(torch.ones(5, 5, dtype=torch.int)).tolist()


def _decode_like(drafter, ids, feats, start, depth):
    """Draft as generate() does: target features up to position ``start``, then ``depth``
    positions fed with the drafter's own predicted features. Returns the last output."""
    cache = DynamicCache()
    out = drafter(input_ids=ids[:, : start + 1], hidden_states=feats[:, : start + 1], past_key_values=cache,
                  use_cache=True).last_hidden_state[:, -1:]  # fmt: skip
    for d in range(1, depth + 1):
        p = start + d
        out = drafter(input_ids=ids[:, p : p + 1], hidden_states=out, past_key_values=cache,
                      use_cache=True).last_hidden_state  # fmt: skip
    return out[:, -1]


def test_hass_steps_reproduce_decoding_time_contexts():
    """Step j's prediction at position t equals drafting j-1 tokens past a verified prefix ending
    at t-j+1: the masks give training exactly the contexts the drafter sees at decode time."""
    target = make_target("llama")
    drafter = hf_spec.EagleDrafter.from_target(target).eval()
    ids = torch.randint(1, 128, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        feats = target.base_model(input_ids=ids).last_hidden_state
        d_ids, f_in, f_tgt, _ = shift_for_drafter(ids, feats, torch.ones_like(ids))
        out = hass_loss(drafter, d_ids, f_in, f_tgt, num_steps=3, return_predictions=True)
        for j, predicted in enumerate(out["predictions"], start=1):
            for t in range(j - 1, d_ids.shape[1]):
                expected = _decode_like(drafter, d_ids, f_in, t - j + 1, j - 1)
                torch.testing.assert_close(predicted[:, t], expected, atol=1e-5, rtol=1e-4)


def test_hass_loss_is_weighted_sum_of_step_losses():
    target = make_target("llama")
    drafter = hf_spec.EagleDrafter.from_target(target)
    ids = torch.randint(1, 128, (2, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        feats = target.base_model(input_ids=ids).last_hidden_state
    loss_mask = torch.ones_like(ids)
    loss_mask[0, :4] = 0  # a prompt: those positions must not count
    d_ids, f_in, f_tgt, mask = shift_for_drafter(ids, feats, loss_mask)
    out = hass_loss(drafter, d_ids, f_in, f_tgt, mask, num_steps=3, beta=0.5, w_topk=0.7, topk=5,
                    return_predictions=True)  # fmt: skip
    target_logits = drafter.lm_logits(f_tgt)
    expected = 0.0
    for j, predicted in enumerate(out["predictions"], start=1):
        logits = drafter.lm_logits(predicted)
        step = eagle_loss(predicted, f_tgt, logits, target_logits, mask)["loss"]
        step = step + 0.7 * topk_distillation_loss(logits, target_logits, mask, k=5)
        expected = expected + 0.5 ** (j - 1) * step
    torch.testing.assert_close(out["loss"], expected)
    # one step with w_topk = 0 is exactly EAGLE's loss
    one = hass_loss(drafter, d_ids, f_in, f_tgt, mask, num_steps=1, w_topk=0.0)
    plain = drafter(input_ids=d_ids, hidden_states=f_in, output_logits=True)
    ref = eagle_loss(plain.last_hidden_state, f_tgt, plain.logits, target_logits, mask)["loss"]
    torch.testing.assert_close(one["loss"], ref)


@pytest.mark.parametrize("args_class, own", [(HassTrainingArguments, {"hass_steps": 2, "topk": 10, "w_topk": 1.0}),
                                             (ParallelTrainingArguments, {"parallel_group_density": 1.0})])  # fmt: skip
def test_recipe_settings_hold_the_methods_own_fields_and_the_optimisers(args_class, own, tmp_path):
    """What a run's summary and its model card state as its recipe: the fields the method adds to
    TrainingArguments and the optimiser's, not where it logs or saves."""
    kwargs = {"hass_steps": 2} if args_class is HassTrainingArguments else {}
    recipe = recipe_settings(args_class(output_dir=str(tmp_path), learning_rate=5e-4, **kwargs))
    assert own.items() <= recipe.items()
    assert recipe["learning_rate"] == 5e-4 and "warmup_steps" in recipe and "per_device_train_batch_size" in recipe
    assert recipe["lr_scheduler_type"] == "linear"  # the value a card prints, not transformers' enum
    assert not {"output_dir", "logging_steps", "save_steps", "report_to"} & recipe.keys()


def test_shift_for_drafter_masks_the_predicted_token():
    ids = torch.tensor([[5, 6, 7, 8, 9, 0]])
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 0]])  # tokens 7, 8, 9 are the assistant's
    attention = torch.tensor([[1, 1, 1, 1, 1, 0]])
    feats = torch.arange(6.0).view(1, 6, 1)
    d_ids, f_in, f_tgt, mask = shift_for_drafter(ids, feats, loss_mask, attention)
    assert d_ids.tolist() == [[6, 7, 8, 9, 0]]
    assert f_in.view(-1).tolist() == [0, 1, 2, 3, 4] and f_tgt.view(-1).tolist() == [1, 2, 3, 4, 5]
    # position t predicts x_{t+2}: t = 0, 1, 2 predict 7, 8, 9
    assert mask.tolist() == [[1, 1, 1, 0, 0]]


# --------------------------------------------------------------------------------------------
# data: chat template loss mask and the feature cache, with a tokenizer built offline
# --------------------------------------------------------------------------------------------
WORDS = ("hello hi there friend how are you fine thanks what is the weather sunny rain cold warm "
         "tell me a story once upon time cat dog ran far away end yes no maybe").split()  # fmt: skip
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@functools.lru_cache(maxsize=None)
def tiny_chat_tokenizer() -> PreTrainedTokenizerFast:
    specials = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([" ".join(WORDS + ["user", "assistant", "system"])],
                            trainers.WordLevelTrainer(special_tokens=specials))  # fmt: skip
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>",
                                   additional_special_tokens=specials[2:], chat_template=CHATML)  # fmt: skip


def test_loss_mask_covers_exactly_the_assistant_tokens():
    tok = tiny_chat_tokenizer()
    messages = [
        {"role": "system", "content": "yes"},
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": "hi friend"},
        {"role": "user", "content": "how are you"},
        {"role": "assistant", "content": "fine thanks what is the weather"},
    ]
    out = tokenize_conversation(tok, messages)
    tokens = tok.convert_ids_to_tokens(out["input_ids"])
    assert tokens == ["<|im_start|>", "system", "yes", "<|im_end|>", "<|im_start|>", "user", "hello", "there",
                      "<|im_end|>", "<|im_start|>", "assistant", "hi", "friend", "<|im_end|>", "<|im_start|>",
                      "user", "how", "are", "you", "<|im_end|>", "<|im_start|>", "assistant", "fine", "thanks",
                      "what", "is", "the", "weather", "<|im_end|>"]  # fmt: skip
    assistant = [t for t, m in zip(tokens, out["loss_mask"]) if m]
    assert assistant == ["hi", "friend", "<|im_end|>", "fine", "thanks", "what", "is", "the", "weather", "<|im_end|>"]
    # the role header of an assistant turn is prompt, not answer
    assert out["loss_mask"][tokens.index("assistant")] == 0
    cut = tokenize_conversation(tok, messages, max_length=12)
    assert cut["input_ids"] == out["input_ids"][:12] and cut["loss_mask"] == out["loss_mask"][:12]


def _conversations(n=48, seed=0):
    rng = random.Random(seed)

    def sentence():
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10)))

    return [
        {"id": str(i), "messages": [{"role": r, "content": sentence()} for r in ("user", "assistant") * 2]}
        for i in range(n)
    ]


@functools.lru_cache(maxsize=None)
def _feature_cache(root):
    target = make_target("llama")
    path = build_feature_cache(target, tiny_chat_tokenizer(), _conversations(), f"{root}/features",
                               max_length=64, storage="bfloat16", shard_examples=20)  # fmt: skip
    return target, path


@pytest.fixture(scope="module")
def feature_cache(tmp_path_factory):
    return _feature_cache(str(tmp_path_factory.mktemp("cache")))


def test_feature_cache_round_trip(feature_cache):
    target, path = feature_cache
    dataset, storage = load_feature_cache(path)
    assert storage == "bfloat16" and len(dataset) == 48
    assert len(list((p for p in __import__("pathlib").Path(path).iterdir() if p.name.startswith("shard-")))) == 3
    example = dataset.with_format("numpy")[5]
    batch = FeatureCollator(storage=storage)([example])
    ids = torch.as_tensor(example["input_ids"]).long().view(1, -1)
    with torch.no_grad():
        expected = target.base_model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(batch["hidden_states"], expected.to(torch.bfloat16).float())
    assert batch["loss_mask"].sum() > 0 and batch["attention_mask"].all()


def test_feature_cache_resumed_with_other_conversations_is_refused(feature_cache, tmp_path):
    target, path = feature_cache
    again = build_feature_cache(target, tiny_chat_tokenizer(), _conversations(), path, max_length=64,
                                storage="bfloat16", shard_examples=20)  # same arguments: every shard reused
    assert again == path and len(load_feature_cache(path)[0]) == 48
    other = [dict(c, id=f"other-{c['id']}") for c in _conversations()]
    with pytest.raises(ValueError, match="holds other examples.*new output directory"):
        build_feature_cache(target, tiny_chat_tokenizer(), other, path, max_length=64, storage="bfloat16",
                            shard_examples=20)
    with pytest.raises(ValueError, match="beyond the 2 this run writes"):
        build_feature_cache(target, tiny_chat_tokenizer(), _conversations()[:40], path, max_length=64,
                            storage="bfloat16", shard_examples=20)


# --------------------------------------------------------------------------------------------
# Trainer runs
# --------------------------------------------------------------------------------------------
def _trainer(cls, args_cls, target, path, out_dir, seed=0, drafter_class=hf_spec.EagleDrafter, held_out=0,
             **overrides):
    dataset, storage = load_feature_cache(path)
    dataset, eval_dataset = split_held_out(dataset, held_out)
    torch.manual_seed(seed)
    drafter = drafter_class.from_target(target)
    kwargs = dict(output_dir=str(out_dir), per_device_train_batch_size=8, learning_rate=3e-3, warmup_steps=2,
                  max_steps=20, logging_steps=1, save_strategy="no", use_cpu=True, seed=0,
                  disable_tqdm=True, dataloader_num_workers=0)  # fmt: skip
    kwargs.update(overrides)
    args = args_cls(**kwargs)
    return cls(model=drafter, args=args, train_dataset=dataset.with_format("numpy"),
               eval_dataset=eval_dataset and eval_dataset.with_format("numpy"), data_collator=FeatureCollator(storage=storage, max_length=args.max_length))  # fmt: skip


TRAINER_SETUPS = {
    "eagle": (EagleTrainer, EagleTrainingArguments, {"feature_noise": 0.0}, 0.8),
    "hass": (HassTrainer, HassTrainingArguments, {"feature_noise": 0.0}, 0.8),
    "coral": (CoralTrainer, CoralTrainingArguments, {"feature_noise": 0.0}, 0.8),
    # the sum over 5 depths; the [MASK] depths (2..5 tokens ahead) fall slower than depth 0
    "parallelspec": (ParallelTrainer, ParallelTrainingArguments,
                     {"drafter_class": hf_spec.ParallelDrafter, "gradient_accumulation_steps": 1}, 0.9),
}  # fmt: skip
"""method -> (Trainer class, arguments class, _trainer overrides, loss ratio a short run must reach)."""


@pytest.mark.parametrize("kind", ["eagle", "hass", "coral", "parallelspec"])
def test_a_few_trainer_steps_lower_the_loss(kind, feature_cache, tmp_path):
    """Each training method runs on the shared feature cache (assistant loss mask + padding)."""
    target, path = feature_cache
    trainer_class, args_class, extra, ratio = TRAINER_SETUPS[kind]
    trainer = _trainer(trainer_class, args_class, target, path, tmp_path, max_steps=25, **extra)
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(0)  # ParallelSpec draws its group anchors from the global RNG: same anchors both times
        before = trainer.compute_loss(trainer.model.eval(), batch).item()
    trainer.train()
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(0)
        after = trainer.compute_loss(trainer.model.eval(), batch).item()
    assert after < ratio * before, (before, after)


def test_router_stage_trains_only_the_router_toward_the_group_mass(feature_cache, tmp_path):
    """CORAL stage 2: the drafter stays frozen, the router's cross-entropy to the target's
    per-group mass falls, and the groups follow the data's assistant-token frequency."""
    target, path = feature_cache
    dataset, _ = load_feature_cache(path)
    counts = assistant_token_counts(dataset, target.config.vocab_size)
    assert counts.sum() == sum(int(sum(m)) for m in dataset["loss_mask"])
    trainer = _trainer(RouterTrainer, RouterTrainingArguments, target, path, tmp_path, max_steps=30,
                       router_num_groups=4, learning_rate=1e-2)  # fmt: skip
    drafter = trainer.model
    drafter.requires_grad_(False)
    drafter.add_router(hf_spec.drafters.eagle.router.frequency_order(counts), num_groups=4, top_n=2).requires_grad_(True)
    frozen = {k: v.clone() for k, v in drafter.state_dict().items() if not k.startswith("router")}
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        before = trainer.compute_loss(drafter.eval(), batch).item()
    trainer.train()
    with torch.no_grad():
        after = trainer.compute_loss(drafter.eval(), batch).item()
    # cross-entropy = entropy of the target's group mass (the floor) + KL. The drafter here is untrained,
    # so its outputs say little about the target's next group and much of the KL cannot be removed.
    _, _, feats_target, mask = shift_for_drafter(batch["input_ids"], batch["hidden_states"], batch["loss_mask"],
                                                 batch["attention_mask"])  # fmt: skip
    with torch.no_grad():
        probs = torch.softmax(drafter.lm_logits(feats_target[mask.bool()]).float(), dim=-1)
    mass = hf_spec.drafters.eagle.router.group_mass(probs, drafter.router_token_order, 4)
    floor = -(mass * mass.clamp_min(1e-12).log()).sum(-1).mean().item()
    assert after - floor < 0.9 * (before - floor), (before, after, floor)
    assert all(torch.equal(v, drafter.state_dict()[k]) for k, v in frozen.items())
    assert drafter.router_token_order[0] == int(counts.argmax())


class _StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True


def test_training_clock_sums_the_runs_of_a_resumed_training(feature_cache, tmp_path):
    """Trainer's train_runtime covers the last run only; TrainingClock adds a resumed run's time to what its
    checkpoint recorded, and says when a checkpoint had no record (its earlier time unknown)."""
    import json

    from hf_spec.training.callbacks import CLOCK_FILE, TrainingClock
    from hf_spec.training.pipeline import training_runtime

    target, path = feature_cache
    common = dict(max_steps=4, save_strategy="steps", save_steps=2)
    first = _trainer(HassTrainer, HassTrainingArguments, target, path, tmp_path, **common)
    first.add_callback(TrainingClock())
    first.add_callback(_StopAt(2))
    first.train()
    saved = json.loads((tmp_path / "checkpoint-2" / CLOCK_FILE).read_text())
    assert saved["complete"] and saved["seconds"] > 0
    clock = TrainingClock()
    resumed = _trainer(HassTrainer, HassTrainingArguments, target, path, tmp_path, **common)
    resumed.add_callback(clock)
    result = resumed.train(resume_from_checkpoint=True)
    assert clock.complete and clock.before == saved["seconds"]
    assert clock.seconds >= saved["seconds"] + result.metrics["train_runtime"] * 0.9
    entries = training_runtime(resumed, result)  # what training summaries (drafter and CORAL router) state
    assert set(entries) == {"train_runtime_s"}
    assert entries["train_runtime_s"] >= saved["seconds"] + result.metrics["train_runtime"] * 0.9
    assert json.loads((tmp_path / "checkpoint-4" / CLOCK_FILE).read_text())["seconds"] > saved["seconds"]
    (tmp_path / "checkpoint-4" / CLOCK_FILE).unlink()  # a checkpoint saved without the clock
    unknown = TrainingClock()
    again = _trainer(HassTrainer, HassTrainingArguments, target, path, tmp_path, **{**common, "max_steps": 6})
    again.add_callback(unknown)
    result = again.train(resume_from_checkpoint=True)
    assert not unknown.complete and unknown.before == 0.0
    assert "lower bound" in training_runtime(again, result)["train_runtime_note"]


def test_killed_and_resumed_run_equals_straight_run(feature_cache, tmp_path):
    target, path = feature_cache
    n = 4
    common = dict(max_steps=2 * n, save_strategy="steps", save_steps=n, feature_noise=0.1, hass_steps=2)
    straight = _trainer(HassTrainer, HassTrainingArguments, target, path, tmp_path / "straight", **common)
    straight.train()

    first = _trainer(HassTrainer, HassTrainingArguments, target, path, tmp_path / "killed", **common)
    first.add_callback(_StopAt(n))  # "killed" right after the step-n checkpoint
    first.train()
    assert first.state.global_step == n and (tmp_path / "killed" / f"checkpoint-{n}").is_dir()
    # a new process: fresh, differently initialised drafter, resumed from the last checkpoint
    resumed = _trainer(HassTrainer, HassTrainingArguments, target, path, tmp_path / "killed", seed=123, **common)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 2 * n
    for (name, a), b in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    # checkpoints hold the drafter only, as safetensors
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "killed" / f"checkpoint-{2 * n}" / "model.safetensors"))
    assert saved.keys() == straight.model.state_dict().keys()
    assert not any("embed" in k or "lm_head" in k for k in saved)


_DDP_SCRIPT = """
import sys, torch
sys.path[:0] = [{root!r}, {tests!r}]
import hf_spec
from conftest import make_target
from test_training import _conversations, tiny_chat_tokenizer
from hf_spec.training.collators import FeatureCollator
from hf_spec.training.data import build_feature_cache, load_feature_cache
from hf_spec.training.trainers import HassTrainer, HassTrainingArguments

args = HassTrainingArguments(output_dir={out!r}, per_device_train_batch_size=4, max_steps=4, save_steps=2,
                             learning_rate=1e-3, warmup_steps=1, use_cpu=True, disable_tqdm=True, hass_steps=2)
target = make_target("llama")
with args.main_process_first():
    build_feature_cache(target, tiny_chat_tokenizer(), _conversations(16), {out!r} + "/features", max_length=48)
dataset, storage = load_feature_cache({out!r} + "/features")
torch.manual_seed(0)
trainer = HassTrainer(model=hf_spec.EagleDrafter.from_target(target), args=args,
                      train_dataset=dataset.with_format("numpy"), data_collator=FeatureCollator(storage=storage))
trainer.train(resume_from_checkpoint={resume})
assert trainer.accelerator.num_processes == 2, trainer.accelerator.num_processes
import hashlib
digest = hashlib.sha256()
for name, tensor in sorted(trainer.accelerator.unwrap_model(trainer.model).state_dict().items()):
    digest.update(name.encode()); digest.update(tensor.detach().float().cpu().numpy().tobytes())
with open({out!r} + f"/rank{{trainer.args.process_index}}_{resume}.sha256", "w") as f:
    f.write(digest.hexdigest())
if trainer.is_world_process_zero():
    trainer.model.save_pretrained({out!r} + "/final")
trainer.accelerator.wait_for_everyone()  # ranks leave together and close the process group (accelerate's advice);
# once, a rank exiting with gloo threads alive aborted (`terminate called without an active exception`)
trainer.accelerator.end_training()
"""


def test_hass_trainer_under_accelerate_launch_two_processes(tmp_path):
    """Two CPU processes (gloo DDP): trains, checkpoints, resumes, and both ranks end with equal weights."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    for resume in (False, True):
        script = tmp_path / f"ddp_{resume}.py"
        script.write_text(_DDP_SCRIPT.format(root=str(tests.parent), tests=str(tests), out=str(tmp_path / "run"),
                                             resume=resume))  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script)]  # fmt: skip
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        rank0 = "\n".join(line for line in result.stderr.splitlines() if "[rank0]" in line)
        assert result.returncode == 0, rank0[-3000:] + "\n...\n" + result.stderr[-2000:]  # the failing rank first
    assert (tmp_path / "run" / "final" / "model.safetensors").exists()
    assert (tmp_path / "run" / "checkpoint-4").is_dir()
    for resume in (False, True):
        ranks = [(tmp_path / "run" / f"rank{r}_{resume}.sha256").read_text() for r in (0, 1)]
        assert ranks[0] == ranks[1], f"ranks disagree after {'resumed ' if resume else ''}training"


def test_self_distillation_is_resumable(tmp_path):
    import json

    from hf_spec.training.data import self_distill

    target, tok = make_target("llama", vocab_size=64), tiny_chat_tokenizer()
    conversations = _conversations(6, seed=1)
    out = tmp_path / "sd.jsonl"
    self_distill(target, tok, conversations, str(out), max_new_tokens=5, batch_size=2, stop_after=2)
    first = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(first) == 2
    self_distill(target, tok, conversations, str(out), max_new_tokens=5, batch_size=2)  # resumes: skips done ids
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert records[:2] == first and sorted(r["id"] for r in records) == sorted(c["id"] for c in conversations)
    by_id = {c["id"]: c for c in conversations}
    for r in records:  # user turns kept, assistant turns regenerated by the target
        users = [m["content"] for m in r["messages"] if m["role"] == "user"]
        assert users == [m["content"] for m in by_id[r["id"]]["messages"] if m["role"] == "user"][:2]
        assert [m["role"] for m in r["messages"]] == ["user", "assistant"] * 2


@pytest.mark.parametrize("script", sorted(p.name for p in (Path(__file__).parents[1] / "training_scripts").glob("*.py")))
def test_training_script_parses_its_arguments(script):
    """Every training script imports and builds its argument parser (catches broken imports)."""
    result = subprocess.run([sys.executable, str(Path(__file__).parents[1] / "training_scripts" / script), "--help"],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.lstrip().startswith("usage:")


def test_training_methods_read_their_drafter_class_from_the_registry():
    """train_drafter's methods name a family by ``model_type``; its class is the registry's, and an unknown method
    is refused (before any target or data is loaded) naming the methods."""
    from hf_spec.training.pipeline import METHODS, method_drafter_class, train_drafter

    assert {m: method_drafter_class(m) for m in METHODS} == {
        "eagle": hf_spec.EagleDrafter, "hass": hf_spec.EagleDrafter, "coral": hf_spec.EagleDrafter,
        "eagle3": hf_spec.Eagle3Drafter, "parallelspec": hf_spec.ParallelDrafter}  # fmt: skip
    with pytest.raises(ValueError, match=r"method must be one of \['coral', 'eagle', 'eagle3', 'hass', 'parallelspec'\], got 's2d'"):
        train_drafter("s2d", None, None)


def test_warm_start_keeps_weights_and_draft_vocab_and_rejects_another_family(feature_cache, tmp_path):
    """``--init_drafter``: continuing a trained drafter on new data starts from exactly its weights and draft
    vocabulary, in float32, bound to the target; a checkpoint of another family is refused with the fix."""
    from hf_spec.training.pipeline import warm_start_drafter

    target, path = feature_cache
    dataset, _ = load_feature_cache(path)
    counts = assistant_token_counts(dataset, target.config.vocab_size)
    torch.manual_seed(0)
    trained = hf_spec.EagleDrafter.from_target(target).set_draft_vocab(counts, 16)
    trained.to(torch.bfloat16).save_pretrained(tmp_path / "trained")
    drafter, coverage = warm_start_drafter(hf_spec.EagleDrafter, str(tmp_path / "trained"), target, "hass", dataset)
    assert drafter.dtype == torch.float32 and drafter.config.training_method == "hass"
    assert torch.equal(drafter.draft_ids, trained.draft_ids)
    for name, tensor in trained.state_dict().items():
        torch.testing.assert_close(drafter.state_dict()[name].to(tensor.dtype), tensor, rtol=0, atol=0, msg=name)
    assert coverage == pytest.approx(float(counts[trained.draft_ids].sum() / counts.sum())) and coverage < 1.0
    hf_spec.ParallelDrafter.from_target(target).save_pretrained(tmp_path / "parallel")
    with pytest.raises(ValueError, match="same family|not a EagleDrafter"):
        warm_start_drafter(hf_spec.EagleDrafter, str(tmp_path / "parallel"), target, "hass", dataset)


def test_growing_a_trained_drafter_keeps_its_function_and_generation_exact(feature_cache, tmp_path):
    """``--init_drafter`` with more ``--num_layers``: the grown drafter computes what the trained one did (new
    layers' residual branches start at zero), its new layers then learn, and decoding with it stays exact."""
    from hf_spec.training.pipeline import grow_layers

    target, path = feature_cache
    torch.manual_seed(0)
    trained = hf_spec.EagleDrafter.from_target(target)
    grown = grow_layers(trained, 2).bind(target)
    assert grown.config.num_layers == 2 and trained.config.num_layers == 1
    ids = torch.randint(0, target.config.vocab_size, (2, 7))
    feats = torch.randn(2, 7, target.config.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(grown(ids, feats).last_hidden_state, trained(ids, feats).last_hidden_state)
    loss = grown(ids, feats).last_hidden_state.square().mean()
    loss.backward()
    assert grown.layers[1].self_attn.o_proj.weight.grad.abs().sum() > 0  # the new layer trains
    with torch.no_grad():
        grown.layers[1].self_attn.o_proj.weight.normal_(std=0.05)  # as after training: not the identity any more
    prompt = torch.randint(0, target.config.vocab_size, (1, 9))
    plain = target.generate(prompt, max_new_tokens=24, do_sample=False)
    spec = target.generate(prompt, max_new_tokens=24, do_sample=False, assistant_model=grown)
    assert torch.equal(plain, spec)
    with pytest.raises(ValueError, match="EagleDrafter"):
        grow_layers(hf_spec.ParallelDrafter.from_target(target), 2)


def test_training_overfits_the_targets_own_answers_and_generate_accepts_them(tmp_path):
    """Train -> inference alignment in seconds: self-distil a few answers (features recorded as decoding sees
    them), train EAGLE on them with the Trainer and collator the scripts use, then decode those prompts. A drafter
    that memorised its data is accepted almost everywhere, unless training and decoding disagree about which
    feature goes with which token (a shifted label, a pre-/post-norm feature, a dropped first pair), which would
    leave training accuracy high and acceptance at zero."""
    from hf_spec.training.distill import distill_features, first_turn_prompts

    tok = tiny_chat_tokenizer()
    target = make_target("llama", vocab_size=len(tok), seed=2)
    conversations = _conversations(4, seed=5)
    path = distill_features(target, tok, conversations, str(tmp_path / "features"), max_new_tokens=24,
                            max_prompt_tokens=32, batch_size=4, storage="float32")  # fmt: skip
    trainer = _trainer(EagleTrainer, EagleTrainingArguments, target, path, tmp_path / "run", max_steps=300,
                       per_device_train_batch_size=4, feature_noise=0.0)  # fmt: skip
    trainer.train()
    drafter = trainer.model.eval()
    taus = []
    for prompt in first_turn_prompts(tok, conversations, 32):
        ids = torch.tensor([prompt["prompt_ids"]])
        expected = target.generate(ids, max_new_tokens=16, do_sample=False)
        out = target.generate(ids, assistant_model=drafter, max_new_tokens=16, do_sample=False, tree_depth=4,
                              tree_top_k=1, tree_total_tokens=4)  # fmt: skip
        assert torch.equal(out, expected)
        taus.append(drafter.last_generation_stats.tau)
    assert min(taus) > 3.0, taus  # of 5 at most (features shifted by one position in training: 2.3-3.4)


def test_top1_accuracy_counts_out_of_vocabulary_targets_as_misses():
    from hf_spec.training.losses import top1_accuracy

    predicted = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0], [0.0, 0.0, 5.0], [1.0, 0.0, 0.0]])
    target = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 9.0], [2.0, 0.0, 0.0]])
    # argmax hits at rows 0, 2, 3; row 3's true argmax lies outside the draft vocabulary; row 2 is not a loss position
    in_vocab, loss_mask = torch.tensor([1, 1, 1, 0]), torch.tensor([1, 1, 0, 1])
    assert top1_accuracy(predicted, target).item() == pytest.approx(3 / 4)
    assert top1_accuracy(predicted, target, in_vocab).item() == pytest.approx(2 / 4)
    assert top1_accuracy(predicted, target, in_vocab, loss_mask).item() == pytest.approx(1 / 3)


def test_the_draft_vocabulary_is_counted_on_the_training_examples_only(feature_cache, tmp_path, monkeypatch):
    """train_drafter splits the held-out examples off before it counts the draft vocabulary, so nothing learnt
    before training has seen them, and the Trainer trains and evaluates on the same split."""
    from hf_spec.training import pipeline

    target, path = feature_cache
    dataset, storage = load_feature_cache(path)
    monkeypatch.setattr(pipeline, "prepare_features",
                        lambda data_args, training_args, aux=None: (target, tiny_chat_tokenizer(), path, dataset, storage))
    counted = []
    real_attach = pipeline.attach_draft_vocab
    monkeypatch.setattr(pipeline, "attach_draft_vocab", lambda d, data, size: counted.append(data) or real_attach(d, data, size))
    trained = []
    monkeypatch.setattr(EagleTrainer, "train",
                        lambda self, **kw: trained.append(self) or SimpleNamespace(metrics={}, training_loss=0.0))
    data_args = pipeline.DataArguments(draft_vocab_size=24, eval_examples=6)
    args = EagleTrainingArguments(output_dir=str(tmp_path / "run"), use_cpu=True, report_to="none", max_steps=1)
    pipeline.train_drafter("eagle", data_args, args)
    _, held = split_held_out(dataset, 6)
    held_rows = {tuple(x) for x in held["input_ids"]}
    assert len(counted) == 1 and len(counted[0]) == len(dataset) - 6
    assert not {tuple(x) for x in counted[0]["input_ids"]} & held_rows
    assert {tuple(x) for x in trained[0].eval_dataset["input_ids"]} == held_rows
    assert len(trained[0].train_dataset) == len(dataset) - 6


@pytest.mark.parametrize("kind", ["eagle", "hass", "parallelspec"])
def test_a_run_logs_training_and_held_out_top1_curves(kind, feature_cache, tmp_path):
    """With a held-out split and step evaluations, the log history holds the training and the held-out teacher-forced
    top-1 (per alignment step for HASS, per [MASK] depth for ParallelSpec), and the held-out examples are not
    trained on."""
    target, path = feature_cache
    dataset, _ = load_feature_cache(path)
    train, held = split_held_out(dataset, 6)
    again_train, again_held = split_held_out(dataset, 6)
    assert len(held) == 6 and len(train) == len(dataset) - 6 and held["input_ids"] == again_held["input_ids"]
    assert not {tuple(x) for x in held["input_ids"]} & {tuple(x) for x in train["input_ids"]}
    with pytest.raises(ValueError, match="eval_examples"):
        split_held_out(dataset, len(dataset))
    trainer_class, args_class, extra, _ = TRAINER_SETUPS[kind]
    trainer = _trainer(trainer_class, args_class, target, path, tmp_path, max_steps=4, eval_strategy="steps",
                       eval_steps=2, per_device_eval_batch_size=4, held_out=6, **extra)  # fmt: skip
    trainer.train()
    train_key, eval_key = {"eagle": ("top1", "eval_top1"), "hass": ("top1_3", "eval_top1_3"),
                           "parallelspec": ("top1_d2", "eval_top1_d2")}[kind]  # fmt: skip
    history = trainer.state.log_history
    train_logs = [h[train_key] for h in history if train_key in h]
    eval_logs = [h for h in history if eval_key in h]
    assert len(train_logs) == 4 and all(0.0 <= v <= 1.0 for v in train_logs), history
    assert [h["step"] for h in eval_logs] == [2, 4] and all("eval_loss" in h for h in eval_logs), history
