"""EAGLE-3 drafters (hf_spec.drafters.eagle3): the target layers the loop hands over, lossless greedy /
sampling / batched decoding with a draft vocabulary, and the checkpoint round trip."""

import functools
import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import AutoModel
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

import hf_spec
from hf_spec import draft_vocab
from conftest import make_target, plain_generate, random_prompt
from test_sampling import P_VALUE_FLOOR, VOCAB, sampled_law_p_value

LAYERS = 8  # EAGLE-3's default fused layers (2, L//2, L-3) need L >= 7


def fused_features(target, ids, layer_ids):
    """Reference: the target's ``hidden_states[i]`` at ``layer_ids``, concatenated (b, s, kH)."""
    with torch.no_grad():
        hidden = target.base_model(input_ids=ids, output_hidden_states=True).hidden_states
    return torch.cat([hidden[i] for i in layer_ids], dim=-1)


def train_eagle3(target, drafter, data, steps=150, seed=0):
    """Fit ``drafter``'s first step to the target's outputs ``data`` (cross-entropy over its draft vocabulary)."""
    g = torch.Generator().manual_seed(seed)
    features = fused_features(target, data, drafter.config.eagle_aux_hidden_state_layer_ids)
    labels = data[:, 2:] if not drafter.has_draft_vocab else draft_vocab.draft_labels(data[:, 2:], drafter.t2d)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    drafter.train()
    for _ in range(steps):
        rows = torch.randint(0, data.shape[0], (16,), generator=g)
        out = drafter(input_ids=data[rows, 1:-1], hidden_states=features[rows, :-2], output_logits=True)
        loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), labels[rows].flatten(), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return drafter.eval()


@functools.lru_cache(maxsize=None)
def trained_pair(family="llama", draft_size=None, vocab_size=128, do_sample=False, logit_scale=30.0, seed=0):
    """(tiny target, Eagle3Drafter trained on its outputs), cached; ``draft_size``: the most frequent ids
    of those outputs form its draft vocabulary."""
    target = make_target(family, vocab_size=vocab_size, num_hidden_layers=LAYERS, logit_scale=logit_scale, seed=seed)
    drafter = hf_spec.Eagle3Drafter.from_target(target)
    torch.manual_seed(seed)
    prompts = torch.randint(1, vocab_size, (64, 4), generator=torch.Generator().manual_seed(seed))
    data = plain_generate(target, prompts, max_new_tokens=32, min_new_tokens=32, do_sample=do_sample)
    if draft_size is not None:
        drafter.set_draft_vocab(torch.bincount(data[:, 4:].reshape(-1), minlength=vocab_size), draft_size)
    return target, train_eagle3(target, drafter, data, seed=seed)


def test_config_defaults_and_collision_error():
    target = make_target(num_hidden_layers=LAYERS)
    config = hf_spec.Eagle3DrafterConfig.for_target(target.config)
    assert config.eagle_aux_hidden_state_layer_ids == [2, 4, 5] and config.target_num_layers == LAYERS
    with pytest.raises(ValueError, match=r"collide.*Fix: pass eagle_aux_hidden_state_layer_ids"):
        hf_spec.Eagle3DrafterConfig.for_target(make_target(num_hidden_layers=6).config)
    drafter = hf_spec.Eagle3Drafter.from_target(make_target(), eagle_aux_hidden_state_layer_ids=[1, 0])
    assert drafter.config.eagle_aux_hidden_state_layer_ids == [0, 1] and drafter.fc.in_features == 128


def test_loop_hands_the_drafter_the_inputs_of_the_fused_layers():
    from hf_spec import compat
    from hf_spec.decoding import _Target

    target, drafter = trained_pair()
    prompt = random_prompt()
    loop_target = _Target(target, drafter.target_feature_layers())
    last = loop_target.forward(prompt, compat.full_dynamic_cache())[0]
    torch.testing.assert_close(loop_target.drafter_features[0], fused_features(target, prompt, [2, 4, 5])[0])
    torch.testing.assert_close(last, target.base_model(input_ids=prompt).last_hidden_state[0])
    assert not any(layer._forward_pre_hooks for layer in target.base_model.layers)  # hooks removed


def test_depth_two_feeds_the_pre_norm_hidden_state_without_fc():
    target, drafter = trained_pair()
    ids = random_prompt(length=4)
    features = fused_features(target, ids, [2, 4, 5])
    first = drafter(input_ids=ids, hidden_states=features)
    expected = drafter.layers[0](drafter.fc(features), drafter.embed(ids), attention_mask=hf_spec.tree.tree.causal_mask(
        0, 4, features.dtype, features.device).view(1, 1, 4, 4), position_embeddings=drafter.rotary_emb(features, torch.arange(4).view(1, -1)))  # fmt: skip
    torch.testing.assert_close(first.last_hidden_state, expected)
    second = drafter(input_ids=ids, hidden_states=first.last_hidden_state, output_logits=True)  # H wide: no fc
    torch.testing.assert_close(second.logits, drafter.lm_head(drafter.norm(second.last_hidden_state)))


SHAPES = [(6, 8, 60), (4, 1, 4), (3, 4, 12)]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"d{d}k{k}n{n}" for d, k, n in SHAPES])
def test_greedy_equals_plain_generate(family, shape):
    target, drafter = trained_pair(family, draft_size=48)
    depth, top_k, total = shape
    outside, accepted = False, []
    for seed in (1, 2, 3):
        prompt = random_prompt(seed=seed)
        plain = plain_generate(target, prompt, max_new_tokens=32, do_sample=False)
        ours = target.generate(prompt, assistant_model=drafter, max_new_tokens=32, do_sample=False,
                               tree_depth=depth, tree_top_k=top_k, tree_total_tokens=total)  # fmt: skip
        assert torch.equal(ours, plain)
        outside |= bool((~drafter.t2d[plain[0, prompt.shape[1]:]]).any())
        accepted += drafter.last_generation_stats.accepted_lengths
    assert outside  # the target's argmax left the draft vocabulary at least once
    assert sum(accepted) >= 3  # some drafts are accepted: the accept path runs


def test_batched_left_padded_equals_per_row_plain():
    target, drafter = trained_pair("llama", draft_size=48)
    prompts = [random_prompt(length=n, seed=s)[0] for n, s in ((10, 1), (6, 2), (8, 3))]
    width = max(p.numel() for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, p in enumerate(prompts):
        ids[r, width - p.numel():], mask[r, width - p.numel():] = p, 1
    out = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=24, do_sample=False)
    for r, p in enumerate(prompts):
        plain = plain_generate(target, p.view(1, -1), max_new_tokens=24, do_sample=False)
        assert torch.equal(out[r, width:], plain[0, p.numel():])


@pytest.mark.parametrize("shape,warp", [((4, 4, 12), dict(temperature=1.0)), ((3, 1, 3), dict(temperature=0.7, top_p=0.9))])
def test_sampled_distribution_equals_target(shape, warp):
    target, drafter = trained_pair("llama", draft_size=10, vocab_size=VOCAB, do_sample=True, logit_scale=8.0, seed=3)
    prompt = random_prompt(length=6, vocab_size=VOCAB, seed=11)
    depth, top_k, total = shape
    p_value, tau = sampled_law_p_value(target, prompt, drafter, warp, tree_depth=depth, tree_top_k=top_k,
                                       tree_total_tokens=total)  # fmt: skip
    assert p_value > P_VALUE_FLOOR, tau
    assert tau > 1.2


def test_save_load_round_trip(tmp_path):
    target, drafter = trained_pair("llama", draft_size=48)
    drafter.save_pretrained(tmp_path)
    from safetensors.torch import load_file

    weights = load_file(tmp_path / "model.safetensors")
    assert weights["lm_head.weight"].shape == (48, 64) and weights["fc.weight"].shape == (64, 192)
    assert weights["d2t"].dtype == torch.int64 and weights["t2d"].dtype == torch.bool
    assert not any("embed" in k for k in weights)
    prompt = random_prompt(seed=5)
    expected = target.generate(prompt, assistant_model=drafter, max_new_tokens=20, do_sample=False)
    for loaded in (AutoModel.from_pretrained(tmp_path), hf_spec.Eagle3Drafter.from_pretrained(tmp_path)):
        assert type(loaded) is hf_spec.Eagle3Drafter
        assert loaded.config.eagle_aux_hidden_state_layer_ids == [2, 4, 5]
        state = loaded.state_dict()
        for name, tensor in drafter.state_dict().items():
            assert torch.equal(state[name], tensor), name
        assert torch.equal(target.generate(prompt, assistant_model=loaded, max_new_tokens=20, do_sample=False), expected)


# -- published EAGLE-3 and speculators eagle3 checkpoints (hf_spec.hub.convert) ---------------------------
def eagle3_files(path, target, layout, draft_ids=None, norm_before_residual=None, layer_ids=None, embed=False, seed=0):
    """Random weights and config.json with the exact names and shapes of an EAGLE-3 (``layout="eagle3"``,
    ``midlayer.*``) or speculators eagle3 (``"speculators"``, ``layers.0.*``) checkpoint for ``target``."""
    c = target.config
    g = torch.Generator().manual_seed(seed)
    h, heads, kv, inter, vocab = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, c.vocab_size
    d = h // heads
    ids = torch.arange(vocab) if draft_ids is None else torch.as_tensor(draft_ids)
    p = "midlayer." if layout == "eagle3" else "layers.0."

    def rand(*shape, scale=0.08):
        return torch.randn(*shape, generator=g) * scale

    w = {
        "fc.weight": rand(h, 3 * h),
        p + "self_attn.q_proj.weight": rand(heads * d, 2 * h),
        p + "self_attn.k_proj.weight": rand(kv * d, 2 * h),
        p + "self_attn.v_proj.weight": rand(kv * d, 2 * h),
        p + "self_attn.o_proj.weight": rand(h, heads * d),
        p + "mlp.gate_proj.weight": rand(inter, h),
        p + "mlp.up_proj.weight": rand(inter, h),
        p + "mlp.down_proj.weight": rand(h, inter),
        p + "input_layernorm.weight": 1 + rand(h, scale=0.1),
        p + "hidden_norm.weight": 1 + rand(h, scale=0.1),
        p + "post_attention_layernorm.weight": 1 + rand(h, scale=0.1),
        "norm.weight": 1 + rand(h, scale=0.1),
        "lm_head.weight": rand(ids.numel(), h, scale=1.0),
        "d2t": ids - torch.arange(ids.numel()),
        "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, ids, True),
    }
    if embed:
        w["embed_tokens.weight"] = target.get_input_embeddings().weight.detach().clone()
    llama = {"model_type": "llama", "hidden_act": "silu", "hidden_size": h, "intermediate_size": inter,
             "num_attention_heads": heads, "num_key_value_heads": kv, "num_hidden_layers": 1,
             "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_parameters["rope_theta"],
             "max_position_embeddings": c.max_position_embeddings, "vocab_size": vocab}  # fmt: skip
    if layout == "eagle3":
        config = {**llama, "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": ids.numel(), "torch_dtype": "float32"}
    else:
        config = {
            "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.3.0",
            "transformer_layer_config": llama, "draft_vocab_size": ids.numel(), "eagle_aux_hidden_state_layer_ids": layer_ids,
            "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                                   "verifier": {"name_or_path": "tiny-target", "architectures": [type(target).__name__]}},
        }  # fmt: skip
        if norm_before_residual is not None:
            config["norm_before_residual"] = norm_before_residual
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(w, str(path / "model.safetensors"))
    return {k.replace(p, "layer."): v for k, v in w.items()}


def eagle3_reference(target, w, input_ids, fused, norm_before_residual):
    """EAGLE-3's forward written out from the layout: h = fc(fused); q/k/v over cat[input_layernorm(emb),
    hidden_norm(h)]; residual h (or hidden_norm(h)); causal GQA attention with RoPE; MLP; logits
    lm_head(norm(.)) over the draft vocabulary."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    c = target.config
    heads, kv, d = c.num_attention_heads, c.num_key_value_heads, c.hidden_size // c.num_attention_heads

    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.rms_norm_eps))

    b, s = input_ids.shape
    h = F.linear(fused, w["fc.weight"])
    normed = rms(h, w["layer.hidden_norm.weight"])
    x = torch.cat([rms(target.get_input_embeddings()(input_ids), w["layer.input_layernorm.weight"]), normed], -1)
    q, k, v = (F.linear(x, w[f"layer.self_attn.{n}_proj.weight"]).view(b, s, -1, d).transpose(1, 2) for n in "qkv")
    rope = LlamaRotaryEmbedding(config=target.config)
    cos, sin = rope(x, torch.arange(s).view(1, -1))
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    k, v = (t.repeat_interleave(heads // kv, dim=1) for t in (k, v))
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
    h = (normed if norm_before_residual else h) + F.linear(attn, w["layer.self_attn.o_proj.weight"])
    m = rms(h, w["layer.post_attention_layernorm.weight"])
    h = h + F.linear(F.silu(F.linear(m, w["layer.mlp.gate_proj.weight"])) * F.linear(m, w["layer.mlp.up_proj.weight"]),
                     w["layer.mlp.down_proj.weight"])  # fmt: skip
    return h, F.linear(rms(h, w["norm.weight"]), w["lm_head.weight"])


CONVERT_CASES = [  # (family, layout, draft vocab size (None: D == V), norm_before_residual in config.json, layer ids, embed)
    ("llama", "eagle3", 40, None, None, True),
    ("qwen2", "eagle3", None, None, None, False),
    ("llama", "speculators", 40, None, [1, 3, 6], True),  # absent norm_before_residual: true (vLLM)
    ("qwen2", "speculators", 40, False, None, False),
]


@pytest.mark.parametrize("family,layout,draft_size,nbr,layer_ids,embed", CONVERT_CASES)
def test_converted_checkpoint_computes_the_format_forward(tmp_path, family, layout, draft_size, nbr, layer_ids, embed):
    target = make_target(family, num_hidden_layers=LAYERS)
    ids = None if draft_size is None else torch.randperm(128, generator=torch.Generator().manual_seed(0))[:draft_size].sort().values
    w = eagle3_files(tmp_path, target, layout, ids, nbr, layer_ids, embed)
    drafter = hf_spec.AutoDrafter.from_pretrained(tmp_path, target=target)
    assert type(drafter) is hf_spec.Eagle3Drafter and drafter.is_bound_to(target)
    expected_ids = layer_ids or [2, 4, 5]
    assert drafter.config.eagle_aux_hidden_state_layer_ids == expected_ids
    norm_before_residual = layout == "speculators" and nbr is not False
    assert drafter.config.norm_before_residual is norm_before_residual
    assert drafter.config.draft_vocab_size == (draft_size or 128)  # D == V: an identity d2t/t2d map

    prompt = random_prompt(length=7)
    fused = fused_features(target, prompt, expected_ids)
    out = drafter(input_ids=prompt, hidden_states=fused, output_logits=True)
    ref_hidden, ref_logits = eagle3_reference(target, w, prompt, fused, norm_before_residual)
    torch.testing.assert_close(out.last_hidden_state, ref_hidden, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out.logits, ref_logits, atol=1e-5, rtol=1e-4)
    logq = drafter.draft_log_probs(out.last_hidden_state[0])  # full V: -inf outside, target id = i + d2t[i]
    target_ids = torch.arange(ref_logits.shape[-1]) + w["d2t"]
    torch.testing.assert_close(logq[:, target_ids], torch.log_softmax(ref_logits[0], -1), atol=1e-5, rtol=1e-4)
    assert bool(torch.isinf(logq[:, ~w["t2d"]]).all())

    plain = plain_generate(target, prompt, max_new_tokens=16, do_sample=False)
    assert torch.equal(target.generate(prompt, assistant_model=drafter, max_new_tokens=16, do_sample=False), plain)
    drafter.save_pretrained(tmp_path / "hf_spec")  # hf-spec's format, loaded back unchanged
    loaded = hf_spec.Eagle3Drafter.from_pretrained(tmp_path / "hf_spec", target=target)
    for name, tensor in drafter.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_eagle3_checkpoint_errors_name_the_fix(tmp_path):
    eagle3_files(tmp_path, make_target("llama", num_hidden_layers=LAYERS), "eagle3", torch.arange(40))
    with pytest.raises(ValueError, match="converts to Eagle3Drafter, not EagleDrafter"):
        hf_spec.EagleDrafter.from_pretrained(tmp_path, target=make_target("llama", num_hidden_layers=LAYERS))
    with pytest.raises(ValueError, match=r"collide.*Fix"):  # EAGLE-3's fixed layers on a 6-layer target
        hf_spec.AutoDrafter.from_pretrained(tmp_path, target=make_target("llama", num_hidden_layers=6))
    with pytest.raises(ValueError, match=r"hidden size 64.*has 32.*Fix"):
        hf_spec.AutoDrafter.from_pretrained(tmp_path, target_config=make_target(
            "llama", num_hidden_layers=LAYERS, hidden_size=32, intermediate_size=64).config)  # fmt: skip


def test_cli_converts_a_speculators_checkpoint(tmp_path):
    from hf_spec.cli import main

    target = make_target("llama", num_hidden_layers=LAYERS)
    target.save_pretrained(tmp_path / "target")
    eagle3_files(tmp_path / "spec", target, "speculators", torch.arange(0, 128, 2))
    expected = hf_spec.AutoDrafter.from_pretrained(tmp_path / "spec", target=target)
    assert main(["convert", str(tmp_path / "spec"), str(tmp_path / "out"), "--target", str(tmp_path / "target")]) == 0
    loaded = AutoModel.from_pretrained(tmp_path / "out")
    assert type(loaded) is hf_spec.Eagle3Drafter and loaded.config.converted_from["format"] == "speculators_eagle3"
    assert all(torch.equal(v, loaded.state_dict()[k]) for k, v in expected.state_dict().items())


_REMOTE_SCRIPT = """
import sys, torch
from transformers import AutoModel, AutoModelForCausalLM
d = AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True).bind(AutoModelForCausalLM.from_pretrained(sys.argv[2]))
io = torch.load(sys.argv[3])
out = d(input_ids=io["ids"], hidden_states=io["feats"], output_logits=True).logits
print("REPORT", type(d).__module__, type(d).__name__, torch.equal(out, io["logits"]), [m for m in sys.modules if m.startswith("hf_spec")])
"""


def test_remote_code_loads_without_hf_spec(tmp_path):
    import os
    import subprocess
    import sys

    target = make_target("llama", num_hidden_layers=LAYERS)
    drafter = hf_spec.Eagle3Drafter.from_target(target).set_draft_vocab(torch.arange(0, 128, 3))
    drafter.save_pretrained(tmp_path / "drafter")
    target.save_pretrained(tmp_path / "target")
    ids, feats = torch.tensor([[3, 5, 7]]), torch.randn(1, 3, 192)
    logits = drafter(input_ids=ids, hidden_states=feats, output_logits=True).logits
    torch.save({"ids": ids, "feats": feats, "logits": logits}, tmp_path / "io.pt")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-I", "-c", _REMOTE_SCRIPT, str(tmp_path / "drafter"), str(tmp_path / "target"),
                             str(tmp_path / "io.pt")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    module, name, equal, hf_spec_modules = result.stdout.split("REPORT", 1)[1].split(None, 3)
    assert module.startswith("transformers_modules.") and name == "Eagle3Drafter"
    assert equal == "True" and hf_spec_modules.strip() == "[]"
