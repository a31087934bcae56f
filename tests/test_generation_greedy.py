"""Greedy fp32 tree decoding must equal plain generate() token for token."""

import pytest
import torch
from transformers import TextStreamer
from transformers.generation.streamers import BaseStreamer

import hf_spec
from conftest import make_target, oracle_pair, plain_generate, random_prompt

SHAPES = [  # (depth, top_k, total_tokens)
    (1, 1, 1),
    (5, 1, 5),  # chain
    (4, 4, 16),
    (6, 8, 60),
    (3, 10, 5),  # heavy pruning
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "d%d-k%d-n%d" % s)
def test_random_drafter_matches_plain_greedy(family, shape):
    target = make_target(family)
    drafter = hf_spec.EagleDrafter.from_target(target)
    prompt = random_prompt()
    expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    depth, top_k, total = shape
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=40, do_sample=False,
                          tree_depth=depth, tree_top_k=top_k, tree_total_tokens=total)  # fmt: skip
    assert torch.equal(out, expected)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "d%d-k%d-n%d" % s)
def test_oracle_drafter_matches_plain_greedy_and_accepts(family, shape):
    target, drafter = oracle_pair(family)
    depth, top_k, total = shape
    for seed in range(3):
        prompt = random_prompt(seed=seed)
        expected = plain_generate(target, prompt, max_new_tokens=48, do_sample=False)
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=48, do_sample=False,
                              tree_depth=depth, tree_top_k=top_k, tree_total_tokens=total)  # fmt: skip
        assert torch.equal(out, expected)
    stats = drafter.last_generation_stats
    if depth > 1:
        # The trained drafter must really be accepted, or the test would not reach deep paths.
        assert stats.tau > 1.8, stats.accepted_lengths
        assert max(stats.accepted_lengths) >= 3


@pytest.mark.parametrize("min_prob", [0.05, 0.3])
def test_confidence_floor_matches_plain_greedy_and_shrinks_trees(family, min_prob):
    """tree_min_prob sizes each tree by the drafter's confidence: still token-for-token plain greedy, with fewer
    verified nodes than the same shape without the floor."""
    target, drafter = oracle_pair(family)
    shape = dict(tree_depth=5, tree_top_k=4, tree_total_tokens=24)
    verified = {}
    for floor in (0.0, min_prob):
        nodes = 0
        for seed in range(3):
            prompt = random_prompt(seed=seed)
            expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
            out = target.generate(prompt, assistant_model=drafter, max_new_tokens=40, do_sample=False,
                                  tree_min_prob=floor, **shape)  # fmt: skip
            assert torch.equal(out, expected)
            nodes += sum(drafter.last_generation_stats.tree_sizes)
        verified[floor] = nodes
    assert verified[min_prob] < verified[0.0]


def test_confidence_floor_on_a_family_without_dynamic_trees_names_the_fix():
    target = make_target("llama")
    drafter = hf_spec.ParallelDrafter.from_target(target)
    with pytest.raises(ValueError, match="tree_min_prob"):
        target.generate(random_prompt(), assistant_model=drafter, max_new_tokens=4, do_sample=False, tree_min_prob=0.1)


def test_eos_inside_the_tree_stops_like_plain(family):
    target, drafter = oracle_pair(family)
    prompt = random_prompt(seed=5)
    reference = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    generated = reference[0, prompt.shape[1]:]
    checked = 0
    for position in (3, 7, 12, 20):
        eos = int(generated[position])
        expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False, eos_token_id=eos)
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=40, do_sample=False,
                              eos_token_id=eos)  # fmt: skip
        assert torch.equal(out, expected)
        assert int(out[0, -1]) == eos and out.shape[1] < reference.shape[1] or position >= 20
        checked += 1
    assert checked == 4


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 7, 11])
def test_max_new_tokens_inside_the_tree(max_new_tokens):
    target, drafter = oracle_pair("llama")
    prompt = random_prompt(seed=3)
    expected = plain_generate(target, prompt, max_new_tokens=max_new_tokens, do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=max_new_tokens, do_sample=False)
    assert out.shape[1] == prompt.shape[1] + max_new_tokens
    assert torch.equal(out, expected)


def test_logits_processors_apply_per_tree_path():
    """repetition_penalty depends on each node's own path; greedy must still match."""
    target, drafter = oracle_pair("llama")
    prompt = random_prompt(seed=4)
    kwargs = dict(max_new_tokens=40, do_sample=False, repetition_penalty=1.3, no_repeat_ngram_size=3)
    expected = plain_generate(target, prompt, **kwargs)
    out = target.generate(prompt, assistant_model=drafter, **kwargs)
    assert torch.equal(out, expected)


def test_sliding_window_target_matches_plain():
    target = make_target("mistral", sliding_window=8)
    drafter = hf_spec.EagleDrafter.from_target(target)
    prompt = random_prompt(length=12)
    expected = plain_generate(target, prompt, max_new_tokens=30, do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=30, do_sample=False, tree_top_k=3,
                          tree_depth=3, tree_total_tokens=8)  # fmt: skip
    assert torch.equal(out, expected)


def test_return_dict_scores_and_streamer_match_plain():
    target, drafter = oracle_pair("llama")
    prompt = random_prompt(seed=6)
    kwargs = dict(max_new_tokens=20, do_sample=False, return_dict_in_generate=True, output_scores=True,
                  output_logits=True)  # fmt: skip
    expected = plain_generate(target, prompt, **kwargs)

    class Collect(BaseStreamer):
        def __init__(self):
            self.chunks = []
            self.ended = False

        def put(self, value):
            self.chunks.append(value.view(-1))

        def end(self):
            self.ended = True

    streamer = Collect()
    out = target.generate(prompt, assistant_model=drafter, streamer=streamer, **kwargs)
    assert torch.equal(out.sequences, expected.sequences)
    assert len(out.scores) == len(expected.scores) == 20
    for ours, theirs in zip(out.scores, expected.scores):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    for ours, theirs in zip(out.logits, expected.logits):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert out.past_key_values.get_seq_length() == out.sequences.shape[1] - 1
    assert streamer.ended
    assert torch.equal(torch.cat(streamer.chunks), out.sequences[0])


def test_stats_describe_the_run():
    target, drafter = oracle_pair("llama")
    prompt = random_prompt(seed=2)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=30, do_sample=False)
    stats = drafter.last_generation_stats
    new = out.shape[1] - prompt.shape[1]
    assert stats.new_tokens == new
    # every cycle emits accepted + 1 tokens; the prefill emits the first; the last cycle may be cut
    assert sum(a + 1 for a in stats.accepted_lengths) + 1 >= new
    assert abs(stats.tau - (sum(stats.accepted_lengths) / stats.cycles + 1)) < 1e-9
    rates = stats.acceptance_by_position()
    assert all(rates[i] >= rates[i + 1] for i in range(len(rates) - 1))
    assert 0 < stats.target_forward_seconds + stats.drafter_forward_seconds < stats.total_seconds


def test_plain_generate_untouched_and_uninstall_restores():
    from transformers import GenerationMixin

    target = make_target("llama")
    prompt = random_prompt()
    assert hf_spec.generation.is_installed()
    original = hf_spec.generation._original_generate
    assert GenerationMixin.generate is not original
    routed = target.generate(prompt, max_new_tokens=5, do_sample=False)
    hf_spec.uninstall()
    try:
        assert GenerationMixin.generate is original
        assert torch.equal(target.generate(prompt, max_new_tokens=5, do_sample=False), routed)
    finally:
        hf_spec.install()
    assert GenerationMixin.generate is not original and hf_spec.generation.is_installed()
