"""Drafter classes: save/load round trips, Auto classes, binding, and clear errors on bad input."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel

import hf_spec
from conftest import CallCountingStreamer, make_target, random_prompt


def test_save_load_round_trip_through_auto_classes(tmp_path, family):
    target = make_target(family)
    drafter = hf_spec.EagleDrafter.from_target(target, name_or_path=f"tiny-{family}")
    drafter.save_pretrained(tmp_path)
    files = sorted(os.listdir(tmp_path))
    assert "model.safetensors" in files and "config.json" in files
    assert not any(f.endswith((".bin", ".pt", ".pkl")) for f in files)
    weights = load_file(tmp_path / "model.safetensors")
    assert not any("embed" in k or "lm_head" in k for k in weights), sorted(weights)
    assert {k.split(".")[0] for k in weights} == {"fc", "layers"}
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "hf_spec_eagle"
    assert config["target_hidden_size"] == 64 and config["target_vocab_size"] == 128
    assert config["target_model_type"] == family

    assert isinstance(AutoConfig.from_pretrained(tmp_path), hf_spec.EagleDrafterConfig)
    loaded = AutoModel.from_pretrained(tmp_path)
    assert type(loaded) is hf_spec.EagleDrafter and not loaded.is_bound
    for name, tensor in drafter.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor)
    # generate() binds the loaded drafter and decodes exactly like the original
    prompt = random_prompt()
    a = target.generate(prompt, assistant_model=drafter, max_new_tokens=12, do_sample=False)
    b = target.generate(prompt, assistant_model=loaded, max_new_tokens=12, do_sample=False)
    assert loaded.is_bound_to(target) and torch.equal(a, b)


def test_unbound_drafter_says_how_to_bind():
    drafter = hf_spec.EagleDrafter(hf_spec.EagleDrafterConfig.for_target(make_target().config))
    with pytest.raises(RuntimeError, match=r"drafter.bind\(target\)"):
        drafter(input_ids=torch.ones(1, 2, dtype=torch.long), hidden_states=torch.zeros(1, 2, 64))


@pytest.mark.parametrize(
    "other,message",
    [
        (dict(hidden_size=32, intermediate_size=64), "hidden size 32 != drafter's 64"),
        (dict(vocab_size=100), "vocab size 100 != drafter's 128"),
    ],
)
def test_wrong_target_shapes_raise(other, message):
    drafter = hf_spec.EagleDrafter.from_target(make_target("llama"))
    wrong = make_target("llama", **other)
    with pytest.raises(ValueError, match=message) as error:
        wrong.generate(random_prompt(vocab_size=100), assistant_model=drafter, max_new_tokens=5)
    assert "Fix:" in str(error.value)


def test_wrong_target_architecture_raises():
    drafter = hf_spec.EagleDrafter.from_target(make_target("llama"))
    with pytest.raises(ValueError, match="architecture 'qwen2' != drafter's 'llama'"):
        drafter.bind(make_target("qwen2"))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(num_beams=2), "num_beams=2"),
        (dict(penalty_alpha=0.6, top_k=4), "contrastive"),
        (dict(num_return_sequences=2, do_sample=True), "num_return_sequences=2"),
        (dict(output_attentions=True, return_dict_in_generate=True), "output_attentions"),
    ],
)
def test_unsupported_modes_raise_before_generating(kwargs, message):
    target = make_target()
    drafter = hf_spec.EagleDrafter.from_target(target)
    streamer = CallCountingStreamer()
    with pytest.raises(ValueError, match=message) as error:
        target.generate(random_prompt(), assistant_model=drafter, streamer=streamer, max_new_tokens=5, **kwargs)
    assert "Fix:" in str(error.value)
    assert streamer.calls == 0  # nothing half-generated reached the user


def test_streamer_with_a_batch_raises_before_generating():
    target = make_target()
    drafter = hf_spec.EagleDrafter.from_target(target)
    streamer = CallCountingStreamer()
    prompts = torch.cat([random_prompt(seed=1), random_prompt(seed=2)])
    with pytest.raises(ValueError, match="streamer cannot be used with a batch of 2"):
        target.generate(prompts, assistant_model=drafter, streamer=streamer, max_new_tokens=5)
    assert streamer.calls == 0


def test_sampling_budget_error_names_the_fix():
    target = make_target()
    drafter = hf_spec.EagleDrafter.from_target(target)
    with pytest.raises(ValueError, match="Raise tree_total_tokens"):
        target.generate(random_prompt(), assistant_model=drafter, max_new_tokens=5, do_sample=True,
                        tree_depth=6, tree_top_k=8, tree_total_tokens=10)  # fmt: skip


def test_tree_defaults_come_from_the_drafter_generation_config():
    target = make_target()
    drafter = hf_spec.EagleDrafter.from_target(target, tree_depth=3, tree_top_k=2, tree_total_tokens=4)
    assert drafter.tree_shape() == hf_spec.TreeShape(3, 2, 4)
    drafter.generation_config.tree_depth = 2
    assert drafter.tree_shape().depth == 2
    assert drafter.tree_shape(depth=5).depth == 5
