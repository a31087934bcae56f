"""EAGLE-1/2 and HASS checkpoints (hf_spec.hub.convert): random-weight checkpoints in the exact
published layout load as EagleDrafters that compute what the EAGLE forward computes."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

import hf_spec
from hf_spec.hub import convert
from hf_spec.tree.tree import causal_mask

from conftest import make_target, plain_generate, random_prompt


def eagle_weights(target, bias: bool, embed: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights with the exact names and shapes of an EAGLE-1/2 / HASS checkpoint for ``target``
    (q/k/v biases for Qwen2 targets, as EAGLE's ``qkv_bias``)."""
    c = target.config
    g = torch.Generator().manual_seed(seed)
    h, heads, kv, inter = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size
    d = h // heads

    def rand(*shape, scale=0.08):
        return torch.randn(*shape, generator=g) * scale

    w = {
        "fc.weight": rand(h, 2 * h),
        "layers.0.self_attn.q_proj.weight": rand(heads * d, h),
        "layers.0.self_attn.k_proj.weight": rand(kv * d, h),
        "layers.0.self_attn.v_proj.weight": rand(kv * d, h),
        "layers.0.self_attn.o_proj.weight": rand(h, heads * d),
        "layers.0.mlp.gate_proj.weight": rand(inter, h),
        "layers.0.mlp.up_proj.weight": rand(inter, h),
        "layers.0.mlp.down_proj.weight": rand(h, inter),
        "layers.0.post_attention_layernorm.weight": 1 + rand(h, scale=0.1),
    }
    if bias:
        w["fc.bias"] = rand(h)
    if c.model_type == "qwen2":
        for p, n in (("q", heads), ("k", kv), ("v", kv)):
            w[f"layers.0.self_attn.{p}_proj.bias"] = rand(n * d)
    if embed:
        w["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    return w


def eagle_config(target, bias: bool | None) -> dict:
    """An EAGLE ``config.json``: the target's settings as a one-layer Llama config (+ bias flags)."""
    c = target.config
    out = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads, "num_key_value_heads": c.num_key_value_heads,
        "num_hidden_layers": 1, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_parameters["rope_theta"],
        "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size,
        "torch_dtype": "float32", "transformers_version": "4.28.1",
    }  # fmt: skip
    if bias is not None:  # absent: EAGLE's default, a biased fc
        out["bias"] = bias
    if c.model_type == "qwen2":
        out["qkv_bias"] = True
    return out


def write_eagle(path, target, bias: bool | None = True, embed: bool = False, fmt: str = "safetensors", seed: int = 0):
    path.mkdir(parents=True, exist_ok=True)
    weights = eagle_weights(target, bias is not False, embed, seed)
    (path / "config.json").write_text(json.dumps(eagle_config(target, bias)))
    if fmt == "safetensors":
        save_file(weights, str(path / "model.safetensors"))
    else:
        torch.save(weights, str(path / "pytorch_model.bin"))
    return weights


def eagle_reference(target, weights, config: dict, input_ids, features):
    """EAGLE's forward written out: fc(cat[emb, feat]) (EAGLE's order: inputs_embeds first), one Llama
    decoder layer without input norm (q/k/v biases when present), the target's head."""
    emb = target.get_input_embeddings()(input_ids)
    x = F.linear(torch.cat([emb, features], dim=-1), weights["fc.weight"], weights.get("fc.bias"))
    fields = {k: v for k, v in config.items() if k not in ("bias", "qkv_bias", "architectures", "model_type")}
    lconfig = LlamaConfig(**fields)
    lconfig._attn_implementation = "eager"
    layer = LlamaDecoderLayer(lconfig, 0)
    layer.input_layernorm = nn.Identity()
    attn = layer.self_attn
    for p in "qkv":
        if f"layers.0.self_attn.{p}_proj.bias" in weights:
            old = getattr(attn, f"{p}_proj")
            setattr(attn, f"{p}_proj", nn.Linear(old.in_features, old.out_features, bias=True))
    state = {k.removeprefix("layers.0."): v for k, v in weights.items() if k.startswith("layers.0.")}
    layer.load_state_dict(state, strict=True)
    rotary = LlamaRotaryEmbedding(config=lconfig)
    positions = torch.arange(input_ids.shape[1]).view(1, -1)
    mask = causal_mask(0, input_ids.shape[1], x.dtype, x.device).view(1, 1, input_ids.shape[1], -1)
    x = layer(x, attention_mask=mask, position_ids=positions, position_embeddings=rotary(x, positions))
    return x, target.get_output_embeddings()(x)


CASES = [
    ("llama", True, False, "safetensors"),
    ("llama", False, True, "bin"),
    ("llama", None, True, "safetensors"),
    ("qwen2", True, True, "bin"),
    ("qwen2", False, False, "safetensors"),
]


@pytest.mark.parametrize("family,bias,embed,fmt", CASES)
def test_converted_forward_equals_eagle_forward(tmp_path, family, bias, embed, fmt):
    target = make_target(family, rope_theta=500000.0, rms_norm_eps=1e-5)  # not the defaults: they must carry over
    weights = write_eagle(tmp_path, target, bias, embed, fmt)
    drafter = hf_spec.AutoDrafter.from_pretrained(tmp_path, target=target)
    assert isinstance(drafter, hf_spec.EagleDrafter) and drafter.is_bound
    assert drafter.config.target_model_type == family
    assert drafter.config.converted_from["ignored_weights"] == (["embed_tokens.weight"] if embed else [])
    ids = random_prompt(12)
    with torch.no_grad():
        features = target.model(ids).last_hidden_state
        out = drafter(input_ids=ids[:, 1:], hidden_states=features[:, :-1], output_logits=True)
        ref_feat, ref_logits = eagle_reference(target, weights, eagle_config(target, bias), ids[:, 1:], features[:, :-1])
    torch.testing.assert_close(out.last_hidden_state, ref_feat, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.logits, ref_logits, rtol=1e-4, atol=1e-4)
    if bias is False:
        assert torch.count_nonzero(drafter.fc.bias) == 0


def test_reference_detects_a_swapped_concatenation(tmp_path):
    """The check above can fail: swapping EAGLE's [emb, feat] order changes the output."""
    target = make_target("llama")
    weights = write_eagle(tmp_path, target)
    drafter = hf_spec.EagleDrafter.from_pretrained(tmp_path, target=target)
    ids = random_prompt(8)
    with torch.no_grad():
        features = target.model(ids).last_hidden_state
        swapped = dict(weights, **{"fc.weight": torch.cat(weights["fc.weight"].chunk(2, dim=1)[::-1], dim=1)})
        ref, _ = eagle_reference(target, swapped, eagle_config(target, True), ids, features)
        out = drafter(input_ids=ids, hidden_states=features).last_hidden_state
    assert not torch.allclose(out, ref, atol=1e-3)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_generate_with_converted_drafter_equals_plain(tmp_path, family):
    target = make_target(family)
    write_eagle(tmp_path, target, bias=False, embed=True, fmt="bin")
    drafter = hf_spec.EagleDrafter.from_pretrained(tmp_path, target_config=target.config)
    assert not drafter.is_bound
    prompt = random_prompt(10)
    expected = plain_generate(target, prompt, max_new_tokens=24, do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_round_trip_is_bit_identical(tmp_path, family):
    target = make_target(family)
    write_eagle(tmp_path / "eagle", target, bias=True, embed=True)
    drafter = hf_spec.AutoDrafter.from_pretrained(tmp_path / "eagle", target_config=target.config, training_method="hass")
    drafter.save_pretrained(tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["model_type"] == "hf_spec_eagle"
    assert convert.detect_layout(tmp_path / "ours") == convert.HF_SPEC
    for loaded in (hf_spec.AutoDrafter.from_pretrained(tmp_path / "ours"),
                   hf_spec.EagleDrafter.from_pretrained(tmp_path / "ours", target=target)):  # fmt: skip
        a, b = drafter.state_dict(), loaded.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
        assert loaded.config.training_method == "hass" and loaded.config.layer_config == drafter.config.layer_config


def test_dtype_follows_checkpoint_unless_given(tmp_path):
    target = make_target("llama")
    weights = eagle_weights(target, True, False)
    tmp_path.joinpath("config.json").write_text(json.dumps(eagle_config(target, True)))
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, str(tmp_path / "model.safetensors"))
    assert hf_spec.AutoDrafter.from_pretrained(tmp_path, target_config=target.config).dtype == torch.bfloat16
    assert hf_spec.AutoDrafter.from_pretrained(tmp_path, target_config=target.config, dtype=None).dtype == torch.float32


def test_hidden_size_mismatch_names_the_fix(tmp_path):
    write_eagle(tmp_path, make_target("llama"))
    other = make_target("llama", hidden_size=32)
    with pytest.raises(ValueError, match=r"hidden size 64.*has 32.*Fix: pass the target"):
        hf_spec.AutoDrafter.from_pretrained(tmp_path, target=other)


def test_missing_target_names_the_fix(tmp_path):
    write_eagle(tmp_path, make_target("llama"))
    with pytest.raises(ValueError, match="target=.*target_config="):
        hf_spec.AutoDrafter.from_pretrained(tmp_path)


def test_sharded_checkpoint_is_refused(tmp_path):
    target = make_target("llama")
    (tmp_path / "config.json").write_text(json.dumps(eagle_config(target, True)))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    with pytest.raises(ValueError, match="sharded"):
        hf_spec.AutoDrafter.from_pretrained(tmp_path, target=target)


def test_unknown_layouts_list_what_was_found(tmp_path):
    target = make_target("llama")
    target.save_pretrained(tmp_path / "full_model")  # a whole LlamaForCausalLM is no drafter
    with pytest.raises(convert.UnsupportedLayoutError, match=r"lm_head.*Supported layouts.*EAGLE-3"):
        hf_spec.AutoDrafter.from_pretrained(tmp_path / "full_model", target=target)
    eagle3 = tmp_path / "eagle3"
    eagle3.mkdir()
    (eagle3 / "config.json").write_text(json.dumps({**eagle_config(target, False), "draft_vocab_size": 32}))
    save_file({"fc.weight": torch.zeros(64, 192), "midlayer.mlp.up_proj.weight": torch.zeros(4, 64)},
              str(eagle3 / "model.safetensors"))  # fmt: skip
    with pytest.raises(ValueError, match="converts to Eagle3Drafter, not EagleDrafter"):
        hf_spec.EagleDrafter.from_pretrained(eagle3, target=target)
    (tmp_path / "empty").mkdir()
    with pytest.raises(convert.UnsupportedLayoutError, match="no config.json"):
        convert.detect_layout(tmp_path / "empty")


def test_weights_that_do_not_match_the_config_are_named(tmp_path):
    target = make_target("llama")
    weights = write_eagle(tmp_path, target)
    weights["layers.0.mlp.up_proj.weight"] = weights["layers.0.mlp.up_proj.weight"][:-1]
    save_file(weights, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"up_proj.weight: shape \(127, 64\) != \(128, 64\)"):
        hf_spec.AutoDrafter.from_pretrained(tmp_path, target=target)


class _Payload:
    def __reduce__(self):
        return (print, ("code ran",))


def test_pickle_is_read_weights_only(tmp_path):
    target = make_target("llama")
    weights = write_eagle(tmp_path, target, fmt="bin")
    torch.save({**weights, "evil": _Payload()}, str(tmp_path / "pytorch_model.bin"))
    with pytest.raises(pickle.UnpicklingError):
        hf_spec.AutoDrafter.from_pretrained(tmp_path, target=target)


def test_hub_download_only_for_non_local_paths(tmp_path, monkeypatch):
    import huggingface_hub

    target = make_target("llama")
    write_eagle(tmp_path, target)
    calls = []

    def fake_file(repo_id, filename, **kwargs):
        calls.append(("file", repo_id, kwargs))
        return str(tmp_path / filename)

    def fake_snapshot(repo_id, **kwargs):
        calls.append(("snapshot", repo_id, kwargs))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_file)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    hf_spec.AutoDrafter.from_pretrained(tmp_path, target=target)
    assert calls == []
    drafter = hf_spec.AutoDrafter.from_pretrained("someone/EAGLE-tiny", target=target, revision="v1")
    assert [c[:2] for c in calls] == [("file", "someone/EAGLE-tiny"), ("snapshot", "someone/EAGLE-tiny")]
    assert calls[1][2]["revision"] == "v1" and drafter.config.converted_from["source"] == "someone/EAGLE-tiny"


def test_cli_convert(tmp_path):
    from transformers import AutoModel

    from hf_spec.cli import main

    target = make_target("qwen2")
    target.save_pretrained(tmp_path / "target")
    write_eagle(tmp_path / "eagle", target, bias=False, fmt="bin")
    expected = hf_spec.AutoDrafter.from_pretrained(tmp_path / "eagle", target=target)
    assert main(["convert", str(tmp_path / "eagle"), str(tmp_path / "out"), "--target", str(tmp_path / "target"),
                 "--training-method", "hass"]) == 0  # fmt: skip
    loaded = AutoModel.from_pretrained(tmp_path / "out")
    assert type(loaded) is hf_spec.EagleDrafter and loaded.config.training_method == "hass"
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in expected.state_dict().items())
