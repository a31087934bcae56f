"""Bad input and broken drafters: clear errors, or correct output at lower speed."""

import json

import pytest
import torch
from safetensors import SafetensorError

import hf_spec
from conftest import make_target, plain_generate, random_prompt


def nan_drafter_and_target():
    target = make_target("llama")
    drafter = hf_spec.EagleDrafter.from_target(target)
    with torch.no_grad():
        drafter.fc.weight.fill_(float("nan"))
    return target, drafter


def assert_drafted_nothing(stats, new_tokens: int):
    """A NaN drafter proposes nothing (eagle.py maps its NaN log-probs to -inf): its trees keep their fixed size
    (no host read decides what to drop) but no node is reachable, so no draft is accepted (tau exactly 1) and the
    target alone still makes every token."""
    assert stats.cycles == new_tokens - 1 and stats.new_tokens == new_tokens  # the first token comes from the prefill
    assert stats.accepted_lengths == [0] * stats.cycles and stats.tau == 1.0


def test_nan_drafter_costs_speed_not_correctness():
    target, drafter = nan_drafter_and_target()
    prompt = random_prompt()
    expected = plain_generate(target, prompt, max_new_tokens=20, do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=20, do_sample=False)
    assert torch.equal(out, expected)
    assert_drafted_nothing(drafter.last_generation_stats, 20)


def test_nan_drafter_sampling_draws_from_the_target_alone():
    target, drafter = nan_drafter_and_target()
    prompt = random_prompt()
    # top_k=1 leaves one token with probability 1 at each step: sampling must then give plain greedy's output.
    greedy = plain_generate(target, prompt, max_new_tokens=20, do_sample=False)
    torch.manual_seed(0)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=20, do_sample=True, top_k=1)
    assert torch.equal(out, greedy)
    assert_drafted_nothing(drafter.last_generation_stats, 20)
    # top_k=5: every sampled token is one of the target's 5 most likely at its position (the others have
    # probability 0), checked against one independent forward over the whole sequence.
    torch.manual_seed(0)
    sampled = target.generate(prompt, assistant_model=drafter, max_new_tokens=20, do_sample=True, top_k=5)
    assert sampled.shape == greedy.shape and torch.equal(sampled[:, : prompt.shape[1]], prompt)
    assert_drafted_nothing(drafter.last_generation_stats, 20)
    with torch.no_grad():
        logits = target(sampled).logits[0, prompt.shape[1] - 1 : -1]
    new = sampled[0, prompt.shape[1] :]
    fifth = logits.topk(5, dim=-1).values[:, -1]
    assert bool((logits.gather(1, new.view(-1, 1)).view(-1) >= fifth - 1e-4).all()), (new, logits.topk(5, dim=-1))


def test_truncated_safetensors_fails_loudly(tmp_path):
    drafter = hf_spec.EagleDrafter.from_target(make_target("llama"))
    drafter.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(SafetensorError, match="Error while deserializing header"):
        hf_spec.EagleDrafter.from_pretrained(tmp_path)


def test_config_from_a_newer_format_names_the_fix(tmp_path):
    drafter = hf_spec.EagleDrafter.from_target(make_target("llama"))
    drafter.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["hf_spec_version"] == "0.1"
    config["hf_spec_version"] = "9.0"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="pip install -U hf-spec"):
        hf_spec.EagleDrafter.from_pretrained(tmp_path)


def test_prompt_longer_than_the_context_window():
    target = make_target("llama", max_position_embeddings=16)
    drafter = hf_spec.EagleDrafter.from_target(target)
    with pytest.raises(ValueError, match="context window is 16"):
        target.generate(random_prompt(length=20), assistant_model=drafter, max_new_tokens=4)


def test_max_length_reached_inside_a_tree_matches_plain():
    target = make_target("llama")
    drafter = hf_spec.EagleDrafter.from_target(target)
    prompt = random_prompt(length=10)
    expected = plain_generate(target, prompt, max_length=17, do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, max_length=17, do_sample=False)
    assert out.shape[1] == 17 and torch.equal(out, expected)


def test_empty_prompt_is_rejected():
    target = make_target("llama")
    drafter = hf_spec.EagleDrafter.from_target(target)
    with pytest.raises(ValueError, match="The prompt is empty. Fix: pass at least one token"):
        target.generate(torch.zeros(1, 0, dtype=torch.long), assistant_model=drafter, max_new_tokens=4)


def test_drafter_cast_after_binding_follows_its_target(monkeypatch):
    """A drafter cast after binding (`from_target` binds) used to fail inside the drafter's LM-head matmul;
    generate() now casts it back to the target's dtype, and the output is plain greedy's."""
    target = make_target("llama")
    drafter = hf_spec.EagleDrafter.from_target(target).to(torch.bfloat16)
    prompt = random_prompt()
    expected = plain_generate(target, prompt, max_new_tokens=12, do_sample=False)
    with monkeypatch.context() as m:  # the old failure, without the cast
        m.setattr(hf_spec.generation, "follow_target_placement", lambda drafter, model: None)
        with pytest.raises(RuntimeError, match="expected m1 and m2 to have the same dtype"):
            target.generate(prompt, assistant_model=drafter, max_new_tokens=12, do_sample=False)
    with pytest.warns(UserWarning, match=r"in torch.bfloat16 on cpu but its target in torch.float32 on cpu .*moves"):
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=12, do_sample=False)
    assert drafter.dtype == torch.float32 and torch.equal(out, expected)


def test_target_cast_after_binding_takes_the_drafter_along():
    target = make_target("llama")
    drafter = hf_spec.EagleDrafter.from_target(target)
    target.to(torch.bfloat16)
    prompt = random_prompt()
    with pytest.warns(UserWarning, match=r"in torch.float32 on cpu but its target in torch.bfloat16 on cpu"):
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=12, do_sample=False)
    assert drafter.dtype == torch.bfloat16 and drafter.is_bound_to(target)
    assert out.shape == (1, prompt.shape[1] + 12) and drafter.last_generation_stats.new_tokens == 12


@pytest.mark.cuda
def test_target_moved_to_the_gpu_after_binding_takes_the_drafter_along():
    target = make_target("llama")
    drafter = hf_spec.EagleDrafter.from_target(target)
    target.to("cuda")
    prompt = random_prompt().to("cuda")
    expected = plain_generate(target, prompt, max_new_tokens=12, do_sample=False)
    with pytest.warns(UserWarning, match="on cpu but its target in torch.float32 on cuda"):
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=12, do_sample=False)
    assert drafter.device == target.device and torch.equal(out, expected)


@pytest.mark.parametrize("bad_id", [128, -1])
@pytest.mark.parametrize("batched", [False, True])
def test_prompt_id_outside_the_vocabulary_is_named_before_any_forward(bad_id, batched):
    target = make_target("llama", vocab_size=128)
    drafter = hf_spec.EagleDrafter.from_target(target)
    prompt = random_prompt(length=8).repeat(2 if batched else 1, 1)
    prompt[-1, 3] = bad_id
    with pytest.raises(IndexError, match="index out of range in self"):  # what plain decoding does with it
        plain_generate(target, prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4, do_sample=False)
    forwards = []
    target.get_input_embeddings().register_forward_pre_hook(lambda module, args: forwards.append(1))
    row = 1 if batched else 0
    message = (rf"Prompt token id {bad_id} \(row {row}, position 3\) is outside the target's vocabulary of 128 ids "
               r"\(valid ids: 0 to 127\)\. Fix: tokenize with the target's own tokenizer")
    with pytest.raises(ValueError, match=message):
        target.generate(prompt, attention_mask=torch.ones_like(prompt), assistant_model=drafter, max_new_tokens=4)
    assert forwards == []
