"""Bad input and broken drafters: clear errors, or correct output at lower speed."""

import json

import pytest
import torch

import hf_spec
from conftest import make_target, plain_generate, random_prompt


def test_nan_drafter_costs_speed_not_correctness():
    target = make_target("llama")
    drafter = hf_spec.EagleDrafter.from_target(target)
    with torch.no_grad():
        drafter.fc.weight.fill_(float("nan"))
    prompt = random_prompt()
    expected = plain_generate(target, prompt, max_new_tokens=20, do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=20, do_sample=False)
    assert torch.equal(out, expected)
    assert drafter.last_generation_stats.accepted_lengths == [0] * drafter.last_generation_stats.cycles
    torch.manual_seed(0)
    sampled = target.generate(prompt, assistant_model=drafter, max_new_tokens=20, do_sample=True)
    assert sampled.shape == expected.shape and int(sampled.max()) < target.config.vocab_size


def test_truncated_safetensors_fails_loudly(tmp_path):
    drafter = hf_spec.EagleDrafter.from_target(make_target("llama"))
    drafter.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(Exception, match="(?i)safetensors|header|incomplete|invalid|deserializ"):
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
    with pytest.raises(ValueError):
        target.generate(torch.zeros(1, 0, dtype=torch.long), assistant_model=drafter, max_new_tokens=4)
