"""EAGLE-3 drafters (hf_spec.drafters.eagle3): the target layers the loop hands over, lossless greedy /
sampling / batched decoding with a draft vocabulary, and the checkpoint round trip."""

import functools

import pytest
import torch
from transformers import AutoModel

import hf_spec
from hf_spec import draft_vocab
from conftest import make_target, plain_generate, random_prompt
from test_sampling import P_VALUE_FLOOR, VOCAB, chi_square_pvalue, exact_joint, sample_counts, warpers

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
    from hf_spec.generation import _Target

    target, drafter = trained_pair()
    prompt = random_prompt()
    loop_target = _Target(target, drafter.target_feature_layers())
    last = loop_target.forward(prompt, compat.full_dynamic_cache())
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
    exact = exact_joint(target, prompt, warpers(**warp))
    torch.manual_seed(1234)
    depth, top_k, total = shape
    counts, tau = sample_counts(target, prompt, drafter, tree_depth=depth, tree_top_k=top_k,
                                tree_total_tokens=total, **warp)  # fmt: skip
    assert chi_square_pvalue(counts, exact) > P_VALUE_FLOOR, tau
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

