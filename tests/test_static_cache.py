"""Tree verification on a static cache (``cache_implementation="static"``): every tree padded to a fixed-size
forward in a preallocated cache, eagerly or compiled, and still token for token plain greedy, the sampled law
exact, and a clear error for what it cannot do."""

from __future__ import annotations

import itertools

import pytest
import torch
from transformers import CompileConfig, GenerationConfig

import hf_spec
from conftest import make_target, oracle_pair, plain_generate, random_prompt
from hf_spec import static_cache
from hf_spec.controller import ENGINES, EngineChooser
from hf_spec.decoding import _Target
from test_controlled_switching import FAMILIES as SWITCHING_FAMILIES
from test_controlled_switching import repetitive_prompt, scripted
from test_sampling import P_VALUE_FLOOR, VOCAB, sampled_law_p_value, tiny_pair

STATIC = {"cache_implementation": "static"}


def test_bucket_sizes_are_the_next_power_of_two():
    assert [static_cache.bucket_size(n) for n in (1, 2, 3, 4, 5, 16, 17, 61)] == [1, 2, 4, 4, 8, 16, 32, 64]


def test_calls_of_nearby_lengths_share_one_cache_shape():
    """The mask's width is a compiled graph's shape: lengths round up, so nearby calls reuse the graphs."""
    lengths = [static_cache.cache_length(n) for n in (20, 140, 256, 257, 600)]
    assert lengths[0] == lengths[1] == lengths[2] == 256 + static_cache.MAX_BUCKET
    assert lengths[3] == lengths[4] - 256 == 512 + static_cache.MAX_BUCKET


@pytest.mark.parametrize("shape", [(5, 1, 5), (4, 4, 16)], ids=["chain", "tree"])
def test_static_cache_matches_plain_greedy(family, shape, monkeypatch):
    """Trees of a trained drafter, deep paths accepted (through later children of a node too, so the accepted
    slots are moved down in the static cache): the output is plain greedy's."""
    moves = []
    move = static_cache.move_slots
    monkeypatch.setattr(static_cache, "move_slots", lambda *a: moves.append(1) or move(*a))
    target, drafter = oracle_pair(family)
    depth, top_k, total = shape
    for seed in range(3):
        prompt = random_prompt(seed=seed)
        expected = plain_generate(target, prompt, max_new_tokens=48, do_sample=False)
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=48, do_sample=False, tree_depth=depth,
                              tree_top_k=top_k, tree_total_tokens=total, **STATIC)  # fmt: skip
        assert torch.equal(out, expected), seed
    stats = drafter.last_generation_stats
    assert stats.tau > 1.8 and max(stats.accepted_lengths) >= 3, stats.accepted_lengths
    assert stats.engines is None  # nothing compiled: every forward eager, no engine choice
    assert (len(moves) > 0) == (shape[1] > 1)  # a tree's accepted path was not always its first children


def test_static_cache_returns_the_cache_of_the_output(family):
    """With ``return_dict_in_generate``, the static cache holds exactly the output's positions but the last."""
    target, drafter = oracle_pair(family)
    prompt = random_prompt(seed=4)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=20, do_sample=False,
                          return_dict_in_generate=True, **STATIC)  # fmt: skip
    assert int(out.past_key_values.get_seq_length()) == out.sequences.shape[1] - 1


@pytest.mark.parametrize("name", list(SWITCHING_FAMILIES))
def test_static_cache_with_arms_switching_mid_generation_equals_plain(name):
    """Plain cycles (a one-token forward), drafted trees of several shapes and n-gram branches, switching every
    cycle or two, all through the static cache: plain greedy, for every family."""
    target, drafter = SWITCHING_FAMILIES[name]()
    prompt = repetitive_prompt()
    expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    controller = scripted(drafter, seed=1)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=40, do_sample=False,
                          speed_controller=controller, **STATIC)  # fmt: skip
    assert torch.equal(out, expected)
    assert len(set(drafter.last_generation_stats.arm_per_cycle)) == len(controller.labels)


def test_compiled_static_verification_matches_plain_greedy():
    """A ``compile_config`` compiles the verification forward (inductor runs on the CPU): once per bucket, kept
    for the next call, and the output is plain greedy's."""
    target, drafter = oracle_pair("llama")
    config = CompileConfig(mode="default")
    for seed in range(2):
        prompt = random_prompt(seed=seed)
        expected = plain_generate(target, prompt, max_new_tokens=32, do_sample=False)
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=32, do_sample=False, tree_depth=3,
                              tree_top_k=2, tree_total_tokens=6, compile_config=config, **STATIC)  # fmt: skip
        assert torch.equal(out, expected), seed
        assert drafter.last_generation_stats.tau > 1.5
    assert target.base_model in static_cache._compiled  # the compiled call ran, and is kept
    engines = drafter.last_generation_stats.engines  # the chooser's first check ran both engines, timed
    assert engines and all(sum(bucket["calls"].values()) for bucket in engines.values()), engines
    assert any(bucket["calls"]["eager"] and bucket["ms_per_forward"]["compiled"] for bucket in engines.values())


def test_compiled_static_verification_alternating_engines_matches_plain_greedy(monkeypatch):
    """Eager and compiled verification forwards alternating every cycle (as the engine chooser's checks do): the
    same cache serves both, the output is plain greedy's, and the stats report each engine's forwards."""
    turns, choose, forward, calls = itertools.count(), EngineChooser.choose, _Target.forward, []

    def alternate(chooser, size):
        choose(chooser, size)  # the bucket's state, as the real choice keeps it
        return ENGINES[next(turns) % 2], True

    def forward_with(target, *args, call=None, **kwargs):
        calls.append(call)
        return forward(target, *args, call=call, **kwargs)

    monkeypatch.setattr(EngineChooser, "choose", alternate)
    monkeypatch.setattr(_Target, "forward", forward_with)
    target, drafter = oracle_pair("llama")
    prompt = random_prompt(seed=5)
    expected = plain_generate(target, prompt, max_new_tokens=32, do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=32, do_sample=False, tree_depth=3,
                          tree_top_k=2, tree_total_tokens=6, compile_config=CompileConfig(mode="default"),
                          **STATIC)  # fmt: skip
    assert torch.equal(out, expected)
    engine_calls = (target.base_model.__call__, static_cache._compiled[target.base_model][1])
    assert calls[0] is None and calls[1:] == [engine_calls[i % 2] for i in range(len(calls) - 1)]  # prefill eager
    stats = drafter.last_generation_stats
    assert stats.tau > 1.5 and stats.verify_forwards == len(calls) - 1 >= 4
    for engine in ENGINES:
        assert sum(bucket["calls"][engine] for bucket in stats.engines.values()) >= stats.verify_forwards // 2


def test_compiled_static_cache_sampled_law_is_exact():
    """Chi-square of sampled generations against the exact target law, through the compiled static layout (the
    eager static layout runs the same code without compiling: the greedy tests above)."""
    target, drafter = tiny_pair("trained")
    prompt = random_prompt(length=6, vocab_size=VOCAB, seed=11)
    p_value, tau = sampled_law_p_value(target, prompt, drafter, dict(temperature=1.0), tree_depth=4, tree_top_k=4,
                                       tree_total_tokens=12, compile_config=CompileConfig(mode="default"),
                                       rows=1, **STATIC)  # fmt: skip  (the static layout takes one prompt)
    assert p_value > P_VALUE_FLOOR, (p_value, tau)
    assert tau > 1.5


def test_static_cache_errors_name_the_fix():
    target = make_target("llama")
    drafter = hf_spec.EagleDrafter.from_target(target)
    batch = torch.cat([random_prompt(seed=1), random_prompt(seed=2)])
    with pytest.raises(ValueError, match="one unpadded prompt"):
        target.generate(batch, assistant_model=drafter, max_new_tokens=4, do_sample=False, **STATIC)
    windowed = make_target("mistral", sliding_window=4)
    with pytest.raises(ValueError, match="sliding"):
        windowed.generate(random_prompt(), assistant_model=hf_spec.EagleDrafter.from_target(windowed),
                          max_new_tokens=4, do_sample=False, **STATIC)  # fmt: skip


def test_compile_follows_transformers_rule():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not static_cache.should_compile(GenerationConfig(), cpu)
    assert static_cache.should_compile(GenerationConfig(), cuda)
    assert static_cache.should_compile(GenerationConfig(compile_config=CompileConfig()), cpu)
    assert not static_cache.should_compile(GenerationConfig(disable_compile=True), cuda)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_static_cache_on_cuda_compiles_and_matches_plain_greedy(dtype):
    """On CUDA the static layout compiles by default (transformers' CompileConfig: CUDA graphs); the output is
    plain greedy's (float32), and in bf16 it is plain greedy's unless a near-tie flips (then the texts agree on a
    long prefix)."""
    target = make_target("llama").to("cuda", dtype)
    drafter = hf_spec.EagleDrafter.from_target(target).to("cuda", dtype)
    prompt = random_prompt().to("cuda")
    expected = plain_generate(target, prompt, max_new_tokens=32, do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=32, do_sample=False, tree_depth=3,
                          tree_top_k=2, tree_total_tokens=6, **STATIC)  # fmt: skip
    assert target.base_model in static_cache._compiled
    if dtype == torch.float32:
        assert torch.equal(out, expected)
    else:
        assert torch.equal(out[:, : prompt.shape[1] + 8], expected[:, : prompt.shape[1] + 8])


def test_a_compiled_call_gives_the_drafter_the_same_layer_inputs_as_the_hooks():
    """A compiled verify forward takes EAGLE-3's fused layer inputs from ``output_hidden_states`` (hooks would
    recompile it): the same features as the hooks capture on the eager path."""
    from hf_spec.decoding import _Target

    model = make_target("llama", num_hidden_layers=4)
    prompt = random_prompt(12)
    layers = (0, 2, 3)
    hooked, called = _Target(model, layers), _Target(model, layers)
    with torch.no_grad():
        out = hooked.forward(prompt, None)
        out_call = called.forward(prompt, None, call=model.base_model.__call__)  # what torch.compile wraps
    torch.testing.assert_close(out_call, out)
    assert hooked.drafter_features.shape == (1, 12, 3 * model.config.hidden_size)
    torch.testing.assert_close(called.drafter_features, hooked.drafter_features)
