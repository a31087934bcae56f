"""Batched tree decoding (batch > 1, left padding) must equal per-row plain generate()."""

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

import hf_spec
from conftest import CallCountingStreamer, make_target, oracle_pair, plain_generate, random_prompt
from test_sampling import P_VALUE_FLOOR, VOCAB, chi_square_pvalue, exact_joint, tiny_pair, warpers
from test_s2d import sorted_pair

PAD = 0
LENGTHS_SEEDS = [(10, 1), (6, 2), (13, 3), (8, 4)]


def prompts_of(lengths_seeds=LENGTHS_SEEDS, vocab_size=128):
    return [random_prompt(length=n, vocab_size=vocab_size, seed=s)[0] for n, s in lengths_seeds]


def pad_left(prompts, pad=PAD):
    """(ids, attention_mask) of left-padded prompts, as a tokenizer with padding_side='left' makes them."""
    width = max(p.numel() for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - p.numel() :] = p
        mask[i, width - p.numel() :] = 1
    return ids, mask


def assert_batched_greedy_is_plain_generate(block) -> None:
    """Greedy hf-spec decoding of a left-padded batch inside ``block`` (a context manager: a forced kernel) equals
    each row's plain ``generate()``."""
    target, drafter = oracle_pair("llama")
    prompts = prompts_of()
    input_ids, attention_mask = pad_left(prompts)
    with block:
        out = target.generate(input_ids, attention_mask=attention_mask, assistant_model=drafter, max_new_tokens=24,
                              do_sample=False)  # fmt: skip
    assert torch.equal(out, per_row_expected(target, prompts, max_new_tokens=24, do_sample=False))


def per_row_expected(target, prompts, pad=PAD, **kwargs):
    """Each row's plain single-prompt generate(), after the padded prompt, padded with ``pad`` at the end."""
    ids, _ = pad_left(prompts, pad)
    rows = [plain_generate(target, p.view(1, -1), **kwargs)[0, p.numel() :] for p in prompts]
    out = torch.full((len(prompts), ids.shape[1] + max(r.numel() for r in rows)), pad, dtype=torch.long)
    out[:, : ids.shape[1]] = ids
    for i, r in enumerate(rows):
        out[i, ids.shape[1] : ids.shape[1] + r.numel()] = r
    return out


def check_batch(target, drafter, prompts, also_batched_plain=True, **kwargs):
    ids, mask = pad_left(prompts)
    tree_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k.startswith("tree_")}
    out = target.generate(ids, attention_mask=mask, assistant_model=drafter, do_sample=False, **kwargs, **tree_kwargs)
    assert torch.equal(out, per_row_expected(target, prompts, do_sample=False, **kwargs))
    if also_batched_plain:
        assert torch.equal(out, plain_generate(target, ids, attention_mask=mask, do_sample=False, **kwargs))
    return out


SHAPES = [(4, 4, 16), (5, 1, 5)]  # dynamic tree, chain


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "d%d-k%d-n%d" % s)
@pytest.mark.parametrize("kind", ["random", "oracle"])
def test_batch_matches_per_row_plain_greedy(family, kind, shape):
    if kind == "oracle":
        target, drafter = oracle_pair(family)
    else:
        target = make_target(family)
        drafter = hf_spec.EagleDrafter.from_target(target)
    depth, top_k, total = shape
    check_batch(target, drafter, prompts_of(), max_new_tokens=30, tree_depth=depth, tree_top_k=top_k,
                tree_total_tokens=total)  # fmt: skip
    stats = drafter.last_generation_stats
    assert len(stats.rows) == 4 and stats.new_tokens == 4 * 30
    assert stats.cycles == sum(row.cycles for row in stats.rows)
    if kind == "oracle" and depth > 1:
        assert stats.tau > 1.8  # drafts are accepted, so rows accept different lengths in one forward
        assert stats.verify_forwards < 30


def test_rows_reaching_eos_at_different_times_are_padded_like_plain(family):
    target, drafter = oracle_pair(family)
    prompts = prompts_of()
    free = per_row_expected(target, prompts, max_new_tokens=40, do_sample=False)
    width = pad_left(prompts)[0].shape[1]
    eos = [int(free[0, width + 3]), int(free[2, width + 11])]  # row 0 stops early, row 2 later
    out = check_batch(target, drafter, prompts, max_new_tokens=40, eos_token_id=eos)
    ends = [(row[width:] == PAD).nonzero() for row in out]
    stop_lengths = {int(e[0]) if e.numel() else out.shape[1] - width for e in ends}
    assert len(stop_lengths) >= 2, stop_lengths  # rows really finished at different times


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5, 7])
def test_max_new_tokens_inside_the_tree(max_new_tokens):
    target, drafter = oracle_pair("llama")
    out = check_batch(target, drafter, prompts_of(), max_new_tokens=max_new_tokens)
    assert out.shape[1] == 13 + max_new_tokens


def test_sorted_drafter_batch():
    target, drafter = sorted_pair("llama")
    check_batch(target, drafter, prompts_of(), max_new_tokens=24, tree_depth=4)
    assert drafter.last_generation_stats.cycles > 0


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_parallel_drafter_batch(family):
    target = make_target(family)
    drafter = hf_spec.ParallelDrafter.from_target(target)
    check_batch(target, drafter, prompts_of(), max_new_tokens=24)


def test_sliding_window_target_batch_matches_per_row():
    """Window counted in positions of each row's own tokens, as in its single-prompt run (left padding excluded)."""
    target = make_target("mistral", sliding_window=8)
    drafter = hf_spec.EagleDrafter.from_target(target)
    check_batch(target, drafter, prompts_of(), also_batched_plain=False, max_new_tokens=30, tree_depth=3,
                tree_top_k=3, tree_total_tokens=8)  # fmt: skip


def test_logits_processors_see_each_rows_own_sequence():
    """repetition_penalty / no_repeat_ngram depend on each row's (padded) sequence and each node's path."""
    target, drafter = oracle_pair("llama")
    prompts = prompts_of()
    ids, mask = pad_left(prompts)
    kwargs = dict(max_new_tokens=30, do_sample=False, repetition_penalty=1.3, no_repeat_ngram_size=3)
    out = target.generate(ids, attention_mask=mask, assistant_model=drafter, **kwargs)
    assert torch.equal(out, plain_generate(target, ids, attention_mask=mask, **kwargs))


class StopAfterToken(StoppingCriteria):
    """A criterion without ``eos_token_id``: transformers keeps generating real tokens for finished rows."""

    def __init__(self, tokens):
        self.tokens = torch.tensor(tokens)

    def __call__(self, input_ids, scores, **kwargs):
        return torch.isin(input_ids[:, -1], self.tokens)


def test_stopping_criteria_without_eos_do_not_pad_like_plain():
    target, drafter = oracle_pair("llama")
    prompts = prompts_of()
    ids, mask = pad_left(prompts)
    free = plain_generate(target, ids, attention_mask=mask, max_new_tokens=40, do_sample=False)
    stops = [int(free[row, ids.shape[1] + position]) for row, position in enumerate((4, 9, 15, 20))]
    criteria = StoppingCriteriaList([StopAfterToken(stops)])
    kwargs = dict(max_new_tokens=40, do_sample=False, stopping_criteria=criteria)
    expected = plain_generate(target, ids, attention_mask=mask, **kwargs)
    assert expected.shape[1] < free.shape[1]  # the custom criterion stopped the batch early
    out = target.generate(ids, attention_mask=mask, assistant_model=drafter, **kwargs)
    assert torch.equal(out, expected)


def test_single_padded_prompt_equals_the_unpadded_one():
    target, drafter = oracle_pair("llama")
    prompt = random_prompt(length=7)
    ids = torch.cat([torch.full((1, 3), PAD), prompt], dim=1)
    mask = torch.cat([torch.zeros(1, 3, dtype=torch.long), torch.ones_like(prompt)], dim=1)
    out = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=20, do_sample=False)
    expected = plain_generate(target, prompt, max_new_tokens=20, do_sample=False)
    assert torch.equal(out[:, 3:], expected)


def test_unpadded_batch_and_return_dict():
    target, drafter = oracle_pair("llama")
    prompts = prompts_of([(9, 1), (9, 2), (9, 3)])
    ids = torch.stack(prompts)
    out = target.generate(ids, assistant_model=drafter, max_new_tokens=20, do_sample=False,
                          return_dict_in_generate=True)  # fmt: skip
    assert torch.equal(out.sequences, per_row_expected(target, prompts, max_new_tokens=20, do_sample=False))
    assert out.past_key_values is None


def test_long_generation_repacks_the_cache_and_stays_exact(monkeypatch):
    """Rows accepting different lengths leave holes; re-packing (forced often here) must not change the output."""
    monkeypatch.setattr(hf_spec.decoding, "HOLE_SLACK", 2)
    calls = []
    original = hf_spec.decoding.gather_positions

    def recording(cache, prefix, index):
        calls.append(prefix)
        original(cache, prefix, index)

    monkeypatch.setattr(hf_spec.decoding, "gather_positions", recording)
    target, drafter = oracle_pair("qwen2")
    check_batch(target, drafter, prompts_of(), max_new_tokens=60, also_batched_plain=False)
    assert 0 in calls  # a re-pack happened


# -- bad input ------------------------------------------------------------------------------------
def test_right_padding_is_rejected_with_the_fix():
    target = make_target()
    drafter = hf_spec.EagleDrafter.from_target(target)
    ids, mask = pad_left(prompts_of())
    with pytest.raises(ValueError, match="padding_side = 'left'"):
        target.generate(ids, attention_mask=mask.flip(1), assistant_model=drafter, max_new_tokens=5)


def test_all_padding_row_is_rejected():
    target = make_target()
    drafter = hf_spec.EagleDrafter.from_target(target)
    ids, mask = pad_left(prompts_of())
    mask[1] = 0
    with pytest.raises(ValueError, match="all padding"):
        target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=5)


def test_streamer_with_a_batch_is_rejected_before_generating():
    target = make_target()
    drafter = hf_spec.EagleDrafter.from_target(target)
    ids, mask = pad_left(prompts_of())
    streamer = CallCountingStreamer()
    with pytest.raises(ValueError, match="streamer cannot be used with a batch of 4"):
        target.generate(ids, attention_mask=mask, assistant_model=drafter, streamer=streamer, max_new_tokens=5)
    assert streamer.calls == 0


def test_batch_scores_are_rejected_with_the_fix():
    target = make_target()
    drafter = hf_spec.EagleDrafter.from_target(target)
    ids, mask = pad_left(prompts_of())
    with pytest.raises(ValueError, match="output_scores/output_logits.*Fix:"):
        target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=5,
                        return_dict_in_generate=True, output_scores=True)  # fmt: skip


def test_prefix_allowed_tokens_fn_gets_each_rows_batch_id():
    target, drafter = oracle_pair("llama")
    ids, mask = pad_left(prompts_of())

    def allowed(batch_id, sent):  # each row its own vocabulary slice, shifting with the length
        start = (7 * batch_id + sent.shape[-1]) % 100
        return list(range(start, start + 40))

    kwargs = dict(max_new_tokens=20, do_sample=False, prefix_allowed_tokens_fn=allowed)
    out = target.generate(ids, attention_mask=mask, assistant_model=drafter, **kwargs)
    assert torch.equal(out, plain_generate(target, ids, attention_mask=mask, **kwargs))


# -- sampling -------------------------------------------------------------------------------------
def test_batched_sampling_keeps_each_rows_target_distribution():
    """Rows of two prompts (one left-padded) in one batch: each row's first 3 tokens follow the exact target law."""
    target, drafter = tiny_pair("trained")
    long, short = (random_prompt(length=n, vocab_size=VOCAB, seed=s)[0] for n, s in [(6, 11), (4, 12)])
    prompts = [long, short] * 20  # 40 rows a call: 20 calls draw 400 samples of each prompt
    ids, mask = pad_left(prompts)
    warp = dict(temperature=0.8)
    exact = {p.numel(): exact_joint(target, p.view(1, -1), warpers(**warp)) for p in (long, short)}
    counts = {n: torch.zeros([VOCAB] * 3) for n in exact}
    torch.manual_seed(4321)
    taus = []
    for _ in range(20):
        out = target.generate(ids, attention_mask=mask, assistant_model=drafter, max_new_tokens=3, do_sample=True,
                              top_k=None, tree_depth=3, tree_top_k=3, tree_total_tokens=6, **warp)  # fmt: skip
        for row, p in enumerate(prompts):
            counts[p.numel()][tuple(out[row, ids.shape[1] :].tolist())] += 1
        if drafter.last_generation_stats.cycles:
            taus.append(drafter.last_generation_stats.tau)
    for n in exact:
        assert chi_square_pvalue(counts[n], exact[n]) > P_VALUE_FLOOR, n
    assert sum(taus) / len(taus) > 1.5  # drafts are accepted: the batched accept path is exercised
