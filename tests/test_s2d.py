"""S2D sorted drafter: losslessness, early-exit semantics, KV catch-up, binding, saving, training."""

import warnings

import pytest
import torch
from transformers import AutoModel

import hf_spec
from conftest import make_target, plain_generate, random_prompt, sorted_loss_before_after_training
from hf_spec.drafters.s2d import SortedDrafter, search_thresholds
from hf_spec.tree.dynamic import TreeShape
from test_sampling import VOCAB, chi_square_pvalue, exact_joint, rejects_colder_law, sample_batches, warpers

P_VALUE_FLOOR = 1e-3


def named(model, name):
    model.config._name_or_path = name
    return model


def sorted_pair(family="llama", vocab_size=128, num_layers=4, exits=(1, 2, 4), thresholds=(0.5, 0.5, 0.0), **kw):
    """A 6-layer target and a drafter of its first ``num_layers`` layers (an untrained SoFT start)."""
    target = named(make_target(family, vocab_size=vocab_size, num_hidden_layers=6, **kw), f"tiny-{family}")
    entry = hf_spec.drafters.s2d.target_entry(target, thresholds)
    drafter = SortedDrafter.from_source_model(target, num_layers=num_layers, exits=list(exits), targets=[entry])
    return target, drafter


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_greedy_equals_plain_generate_with_early_exits(family):
    target, drafter = sorted_pair(family)
    prompt = random_prompt(10)
    expected = plain_generate(target, prompt, max_new_tokens=24, do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False, tree_depth=4)
    assert torch.equal(out, expected)
    counts = drafter.last_generation_stats.early_exits.exit_counts
    assert sum(c > 0 for c in counts) >= 2, counts  # early exit really active, deeper exits too


def _context_logits(drafter, ids, exit_index):
    return drafter(ids.view(1, -1)).logits_per_exit[exit_index][0, -1].float()


@torch.no_grad()
def test_incremental_exits_match_full_forward():
    """Lazy catch-up: every draft's q equals the full forward's distribution at its chosen exit."""
    target, drafter = sorted_pair(thresholds=(0.4, 0.6, 0.0))
    drafter.bind(target)
    prompt = random_prompt(8)
    torch.manual_seed(0)
    session = drafter.new_drafting_session(target, TreeShape(depth=4, top_k=1, total_tokens=4), True, 1.0, prompt)
    context = prompt[0]
    commit = prompt[0, 1:]
    seen_exits = set()
    for _ in range(4):
        tree = session.propose(None, commit)
        drafts = tree.tokens[1:]
        for i, (token, s) in enumerate(zip(drafts, session.last_exits)):
            ids = torch.cat([context, drafts[:i]])
            reference = torch.softmax(_context_logits(drafter, ids, s), dim=-1)
            torch.testing.assert_close(tree.draft_probs[i], reference, atol=1e-5, rtol=1e-4)
            seen_exits.add(s)
        # commit: accept the first draft (if any) and a fresh bonus token
        accepted = drafts[:1]
        commit = torch.cat([accepted, torch.randint(1, 128, (1,))])
        context = torch.cat([context, commit])
    assert len(seen_exits) >= 2, seen_exits


@torch.no_grad()
@pytest.mark.parametrize("threshold,exit_index", [(0.0, 0), (2.0, -1)])
def test_thresholds_zero_and_above_one_are_the_smallest_and_full_submodels(threshold, exit_index):
    target, drafter = sorted_pair()
    drafter.bind(target)
    drafter.set_thresholds([threshold] * 3)
    prompt = random_prompt(9)
    session = drafter.new_drafting_session(target, TreeShape(depth=5, top_k=1, total_tokens=5), False, 1.0, prompt)
    tree = session.propose(None, prompt[0, 1:])
    exits = drafter.config.exits
    expected_exit = exit_index % len(exits)
    assert session.last_exits == [expected_exit] * 5
    assert session.head_calls == 5  # exits that can never fire (threshold > 1) cost no LM head
    truncated = drafter.to_causal_lm(exits[expected_exit])
    assert truncated.config.num_hidden_layers == exits[expected_exit]
    greedy = plain_generate(truncated, prompt, max_new_tokens=5, do_sample=False)
    assert torch.equal(tree.tokens[1:], greedy[0, prompt.shape[1]:])


@pytest.mark.parametrize("exit_index", [0, 1, 2])
def test_use_fixed_exit_drafts_only_from_that_submodel(exit_index):
    target, drafter = sorted_pair(thresholds=(0.5, 0.5, 0.0))
    exit_layer = drafter.config.exits[exit_index]
    drafter.use_fixed_exit(exit_layer)
    assert drafter.config.targets[0]["thresholds"] == drafter.config.default_thresholds == drafter.thresholds
    prompt = random_prompt(10)
    sessions, new_session = [], drafter.new_drafting_session
    drafter.new_drafting_session = lambda *args, **kwargs: sessions.append(new_session(*args, **kwargs)) or sessions[-1]
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=16, do_sample=False, tree_depth=3)
    assert torch.equal(out, plain_generate(target, prompt, max_new_tokens=16, do_sample=False))
    exits = drafter.last_generation_stats.early_exits
    counts = exits.exit_counts
    assert counts[exit_index] > 0 and sum(counts) == counts[exit_index], counts
    assert exits.head_calls == sum(counts)
    (session,) = sessions
    # the layers beyond the exit never run
    assert session.done[exit_index + 1 :] == [0] * (len(counts) - exit_index - 1)


def test_use_fixed_exit_rejects_a_layer_without_exit():
    _, drafter = sorted_pair()
    with pytest.raises(ValueError, match=r"one of this drafter's exits \[1, 2, 4\]"):
        drafter.use_fixed_exit(3)


@torch.no_grad()
def test_teacher_labels_are_the_teachers_greedy_next_tokens():
    from hf_spec.training.s2d_trainer import teacher_labels

    target = make_target("llama", vocab_size=128)
    rows = [{"input_ids": random_prompt(n, seed=n)[0].tolist(), "labels": []} for n in (7, 12, 4)]
    labelled = teacher_labels(target, rows, batch_size=2)  # right-padded batches of unequal rows
    for row, out in zip(rows, labelled):
        ids = torch.tensor([row["input_ids"]])
        greedy = target(ids).logits[0].argmax(-1)
        assert out["input_ids"] == row["input_ids"]
        assert out["labels"] == [-100] + greedy[:-1].tolist()


def test_search_thresholds_default_grid_has_no_equivalent_candidates():
    target, drafter = sorted_pair()  # the target's listed thresholds: (0.5, 0.5, 0.0)
    _, results = search_thresholds(drafter, target, [random_prompt(6, seed=2)], max_new_tokens=3, repeats=1,
                                   record=False)  # fmt: skip
    candidates = [tuple(r["thresholds"]) for r in results]
    assert len(candidates) == len(set(candidates)) == 1 + 4 * 5  # first exit 0.0 makes the rest unreachable
    assert all(t[1:] == (0.0, 0.0) for t in candidates if t[0] == 0.0)
    speeds = [r["tokens_per_second"] for r in results]
    assert speeds == sorted(speeds, reverse=True) and all(v > 0 for v in speeds)
    assert drafter.thresholds == drafter.config.targets[0]["thresholds"] == [0.5, 0.5, 0.0]  # record=False


def test_threshold_grid_drops_unreachable_duplicates():
    from hf_spec.drafters.s2d import threshold_grid

    grid = threshold_grid([0.0, 0.9, 2.0], 3)
    assert grid[0] == [0.0, 0.0, 0.0] and len(grid) == 1 + 2 * 3
    assert [0.9, 2.0, 0.0] in grid and all(g[-1] == 0.0 for g in grid)


def test_bad_target_vocab_raises_clear_error():
    _, drafter = sorted_pair()
    other = make_target("llama", vocab_size=96)
    with pytest.raises(ValueError, match=r"vocab size 96 != drafter's 128.*Fix"):
        drafter.bind(other)
    with pytest.raises(ValueError, match="vocab size"):
        other.generate(random_prompt(5, 96), assistant_model=drafter, max_new_tokens=3)


def test_unlisted_target_with_same_vocab_binds_with_warning_and_defaults():
    _, drafter = sorted_pair()
    other = named(make_target("llama", seed=5), "someone/else")
    with pytest.warns(UserWarning, match="not among the targets"):
        drafter.bind(other)
    assert drafter.thresholds == drafter.config.default_thresholds


SAMPLING_CASES = [((0.4, 0.6, 0.0), dict(temperature=1.0)), ((0.3, 0.5, 0.0), dict(temperature=0.7, top_p=0.9))]


@pytest.mark.parametrize("thresholds,warp", SAMPLING_CASES)
def test_sampling_keeps_target_distribution(thresholds, warp):
    target, drafter = sorted_pair(vocab_size=VOCAB, logit_scale=8.0, seed=3, thresholds=thresholds)
    prompt = random_prompt(length=6, vocab_size=VOCAB, seed=11)
    exact = exact_joint(target, prompt, warpers(**warp))
    torch.manual_seed(1234)
    counts, stats = sample_batches(target, prompt, drafter, 1200, tree_depth=3, **warp)  # in batches of rows
    totals = [sum(exits) for exits in zip(*(s.early_exits.exit_counts for s in stats))]
    accepted = sum(sum(s.accepted_lengths) for s in stats)
    assert chi_square_pvalue(counts, exact) > P_VALUE_FLOOR
    assert rejects_colder_law(counts, target, prompt, warp)  # the test can fail
    assert sum(t > 0 for t in totals) >= 2, totals
    assert accepted > 0  # the accept path is exercised


def test_save_load_round_trip(tmp_path):
    target, drafter = sorted_pair("qwen2", tie_word_embeddings=True)
    assert drafter.config.tie_word_embeddings
    assert drafter.lm_head.weight.data_ptr() == drafter.embed_tokens.weight.data_ptr()
    drafter.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path)
    assert isinstance(loaded, SortedDrafter)
    assert loaded.config.targets == drafter.config.targets and loaded.config.exits == drafter.config.exits
    ids = random_prompt(7)
    for a, b in zip(drafter(ids).logits_per_exit, loaded(ids).logits_per_exit):
        torch.testing.assert_close(a, b)
    prompt = random_prompt(10)
    out = target.generate(prompt, assistant_model=loaded.eval(), max_new_tokens=12, do_sample=False)
    assert torch.equal(out, plain_generate(target, prompt, max_new_tokens=12, do_sample=False))
    assert loaded.thresholds == drafter.config.targets[0]["thresholds"]


def test_to_causal_lm_is_a_plain_transformers_assistant():
    target, drafter = sorted_pair()
    assistant = drafter.to_causal_lm(drafter.config.exits[1])
    prompt = random_prompt(10)
    expected = plain_generate(target, prompt, max_new_tokens=16, do_sample=False)
    out = target.generate(prompt, assistant_model=assistant, max_new_tokens=16, do_sample=False)  # transformers' path
    assert torch.equal(out, expected)


def test_sorted_trainer_lowers_the_loss(tmp_path):
    from hf_spec.training.s2d_trainer import SortedTrainer, SortedTrainingConfig, pad_collator

    _, drafter = sorted_pair(num_layers=2, exits=(1, 2), thresholds=(0.5, 0.0))
    g = torch.Generator().manual_seed(0)
    pattern = torch.randint(1, 128, (8,), generator=g)
    rows = [{"input_ids": pattern.roll(i).repeat(3).tolist(), "labels": pattern.roll(i).repeat(3).tolist()}
            for i in range(8)]  # fmt: skip
    collate = pad_collator(0)
    batch = collate(rows)
    with torch.no_grad():
        before = float(drafter(batch["input_ids"], labels=batch["labels"]).loss)
    args = SortedTrainingConfig(output_dir=str(tmp_path), max_steps=15, per_device_train_batch_size=8,
                                gradient_accumulation_steps=1, learning_rate=3e-3, warmup_ratio=0.0,
                                save_strategy="no", logging_strategy="no", use_cpu=True, dataloader_num_workers=0)  # fmt: skip
    SortedTrainer(model=drafter.train(), args=args, train_dataset=rows, data_collator=collate).train()
    drafter.eval()
    after = float(drafter(batch["input_ids"], labels=batch["labels"]).loss)
    assert after < 0.5 * before, (before, after)


def test_search_thresholds_picks_and_records_the_best():
    target, drafter = sorted_pair(thresholds=(0.5, 0.5, 0.0))
    prompts = [random_prompt(8, seed=s) for s in (3, 4)]
    candidates = [[0.0, 0.0, 0.0], [0.6, 0.6, 0.0], [2.0, 2.0, 0.0]]
    best, results = search_thresholds(drafter, target, prompts, candidates=candidates, max_new_tokens=10)
    speeds = [r["tokens_per_second"] for r in results]
    assert speeds == sorted(speeds, reverse=True)
    assert sorted(r["thresholds"] for r in results) == sorted(candidates)  # each candidate once
    assert best == results[0]["thresholds"] and best in candidates
    assert drafter.config.targets[0]["thresholds"] == best and drafter.thresholds == best
    by = {tuple(r["thresholds"]): r for r in results}
    first_only, last_only = by[(0.0, 0.0, 0.0)]["exit_counts"], by[(2.0, 2.0, 0.0)]["exit_counts"]
    assert first_only[0] > 0 and first_only[1:] == [0, 0]  # 0.0 at the first exit: every draft leaves there
    assert last_only[:2] == [0, 0] and last_only[2] > 0  # > 1 never fires: the last exit only
    for thresholds in candidates:  # the counts and tau are those of generate() with these thresholds
        drafter.set_thresholds(thresholds)
        runs = []
        for prompt in prompts:
            target.generate(prompt, assistant_model=drafter, do_sample=False, max_new_tokens=10, speed_controller=False)
            runs.append(drafter.last_generation_stats)
        r = by[tuple(thresholds)]
        accepted = [a for s in runs for a in s.accepted_lengths]
        assert r["cycles"] == len(accepted) > 0 and r["new_tokens"] == sum(s.new_tokens for s in runs)
        assert r["tau"] == pytest.approx(sum(accepted) / len(accepted) + 1.0)
        assert r["exit_counts"] == [sum(c) for c in zip(*(s.early_exits.exit_counts for s in runs))]
        assert sum(r["exit_counts"]) > 0


def test_search_thresholds_times_every_candidate_repeats_times_and_keeps_its_best_round(monkeypatch):
    """Warm-up once per candidate, then ``repeats`` rounds of every (prompt, candidate), rotating the order;
    a candidate fast only in round 1 of 3 is scored by round 1, not the first, last or mean (a fake clock)."""
    from hf_spec.drafters.s2d import thresholds as thresholds_module

    target, drafter = sorted_pair()
    prompts = [random_prompt(7, seed=s) for s in (5, 6)]
    candidates = [[0.0, 0.0, 0.0], [0.6, 0.6, 0.0], [2.0, 2.0, 0.0]]
    flaky = (2.0, 2.0, 0.0)
    now = [0.0]
    calls = []  # (thresholds, prompt index, max_new_tokens)
    generate = target.generate

    def counted_generate(prompt, **kwargs):
        out = generate(prompt, **kwargs)
        thresholds = tuple(drafter.thresholds)
        calls.append((thresholds, next(i for i, p in enumerate(prompts) if torch.equal(p, prompt)),
                      kwargs["max_new_tokens"]))  # fmt: skip
        timed_before = sum(c[0] == thresholds for c in calls) - 2  # this candidate's earlier timed calls
        if thresholds == flaky:
            now[0] += 1.0 if timed_before // len(prompts) == 1 else 10.0  # fast in round 1 only
        else:
            now[0] += 2.0
        return out

    monkeypatch.setattr(target, "generate", counted_generate)
    monkeypatch.setattr(thresholds_module.timing, "clock", lambda device=None: now[0])
    _, results = search_thresholds(drafter, target, prompts, candidates=candidates, max_new_tokens=10, repeats=3)

    n = len(candidates)
    assert len(calls) == n * (1 + 3 * len(prompts))
    warmups, timed = calls[:n], calls[n:]
    assert sorted(list(t) for t, _, _ in warmups) == sorted(candidates)
    assert all(p == 0 and m == 8 for _, p, m in warmups)  # the first prompt, min(8, max_new_tokens) tokens
    assert all(m == 10 for _, _, m in timed)
    order = [tuple(c) for c in candidates]
    for r in range(3):
        for p in range(len(prompts)):
            block = timed[(r * len(prompts) + p) * n : (r * len(prompts) + p + 1) * n]
            assert [b[1] for b in block] == [p] * n
            assert [b[0] for b in block] == [order[(r + p + i) % n] for i in range(n)]  # rotating start
    by = {tuple(r["thresholds"]): r for r in results}
    assert by[flaky]["tokens_per_second"] == pytest.approx(by[flaky]["new_tokens"] / (1.0 * len(prompts)))
    for t in order[:2]:
        assert by[t]["tokens_per_second"] == pytest.approx(by[t]["new_tokens"] / (2.0 * len(prompts)))
    speeds = [r["tokens_per_second"] for r in results]
    assert speeds == sorted(speeds, reverse=True)


# -- draft vocabulary (issue #16 item 1): exits score D rows, verification stays over the full vocabulary --
def test_greedy_with_a_draft_vocabulary_equals_plain_generate_qwen2():
    target, drafter = sorted_pair("qwen2", thresholds=(0.9, 0.9, 0.0))
    prompts = torch.cat([random_prompt(6, seed=100 + s) for s in range(8)])
    counts = torch.bincount(plain_generate(target, prompts, max_new_tokens=16, do_sample=False)[:, 6:].reshape(-1),
                            minlength=128)  # fmt: skip
    drafter.set_draft_vocab(counts, 40)
    outside = accepted = 0
    for seed in (1, 2, 3):
        prompt = random_prompt(10, seed=seed)
        expected = plain_generate(target, prompt, max_new_tokens=24, do_sample=False)
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False, tree_depth=4)
        assert torch.equal(out, expected)
        outside += int((~drafter.t2d[expected[0, 10:]]).sum())
        accepted += sum(drafter.last_generation_stats.accepted_lengths)
    assert outside > 0, "the target never chose a token outside the draft vocabulary: the test means nothing"
    assert accepted > 0


@pytest.mark.parametrize("warp", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9)])
def test_sampling_with_a_draft_vocabulary_keeps_target_distribution(warp):
    target, drafter = sorted_pair("qwen2", vocab_size=VOCAB, logit_scale=8.0, seed=3, thresholds=(0.3, 0.5, 0.0))
    prompt = random_prompt(length=6, vocab_size=VOCAB, seed=11)
    with torch.no_grad():
        first = torch.softmax(target(prompt).logits[0, -1].float(), -1)
    order = first.argsort(descending=True)
    drafter.set_draft_vocab(order[1:9])  # the target's most likely first token is outside the draft vocabulary
    assert not drafter.t2d[first.argmax()] and drafter.config.draft_vocab_size == 8
    exact = exact_joint(target, prompt, warpers(**warp))
    torch.manual_seed(1234)
    counts, stats = sample_batches(target, prompt, drafter, 1200, tree_depth=3, **warp)  # in batches of rows
    accepted = sum(sum(s.accepted_lengths) for s in stats)
    assert chi_square_pvalue(counts, exact) > P_VALUE_FLOOR
    assert rejects_colder_law(counts, target, prompt, warp)  # the test can fail
    assert counts[first.argmax()].sum() > 0  # tokens outside the draft vocabulary are still emitted
    assert accepted > 0


def test_label_token_counts_and_trainer_with_a_draft_vocabulary(tmp_path):
    from hf_spec.training.losses import sorted_loss
    from hf_spec.training.s2d_trainer import label_token_counts, pad_collator

    rows = [{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [7, 7], "labels": [-100, 7]}]
    counts = label_token_counts(rows, 10)
    assert counts.tolist() == [0, 0, 0, 0, 0, 0, 1, 2, 0, 0]
    _, drafter = sorted_pair(num_layers=2, exits=(1, 2), thresholds=(0.5, 0.0))
    g = torch.Generator().manual_seed(0)
    pattern = torch.randint(1, 128, (8,), generator=g)
    rows = [{"input_ids": pattern.roll(i).repeat(3).tolist(), "labels": pattern.roll(i).repeat(3).tolist()}
            for i in range(8)]  # fmt: skip
    drafter.set_draft_vocab(label_token_counts(rows, 128), 6)  # two of the 8 pattern tokens fall outside
    drafter.get_input_embeddings().weight.requires_grad_(False)
    drafter.get_output_embeddings().weight.requires_grad_(False)
    batch = pad_collator(0)(rows)
    assert (drafter.exit_labels(batch["labels"]) == -100).any()
    before, after = sorted_loss_before_after_training(drafter, rows, tmp_path, max_steps=15, learning_rate=3e-3)
    assert after < 0.5 * before, (before, after)
    all_outside = torch.full_like(batch["labels"], -100)
    assert float(sorted_loss(drafter(batch["input_ids"]).logits_per_exit, all_outside)) == 0.0


def test_sorted_loss_is_the_mean_of_each_exits_cross_entropy_hand_computed():
    """S2D Eq. 3 on a hand-computed case: 2 exits, 4 tokens, one sequence of 3 positions whose first label is
    padding; position t is scored against labels[t + 1] (the last position predicts nothing)."""
    from hf_spec.training.losses import sorted_loss

    labels = torch.tensor([[-100, 0, -100, 3]])  # positions 0 and 2 count (targets 0 and 3), position 1 does not
    shallow = torch.zeros(1, 4, 4)  # uniform: CE = log 4 at every position
    deep = torch.zeros(1, 4, 4)
    deep[0, 0, 0] = 2.0  # right token at logit 2: CE = log(e^2 + 3) - 2
    deep[0, 2, 1] = 1.0  # wrong token at logit 1: CE = log(e + 3)
    deep[0, 1, 2] = 9.0  # an ignored position moves nothing
    expected_deep = ((torch.log(torch.tensor(2.0).exp() + 3) - 2) + torch.log(torch.tensor(1.0).exp() + 3)) / 2
    expected = (torch.log(torch.tensor(4.0)) + expected_deep) / 2
    assert torch.allclose(sorted_loss([shallow, deep], labels), expected, atol=1e-6)
    assert torch.allclose(sorted_loss([deep], labels), expected_deep, atol=1e-6)  # one exit: plain causal-LM CE


def test_sorted_trainer_evaluate_reports_each_exits_held_out_top1(tmp_path):
    """The curves' metric: each exit's argmax against the labels at the labelled positions, computed by hand."""
    from hf_spec.training.s2d_trainer import SortedTrainer, SortedTrainingConfig, pad_collator

    _, drafter = sorted_pair(num_layers=2, exits=(1, 2), thresholds=(0.5, 0.0))
    g = torch.Generator().manual_seed(1)
    rows = [{"input_ids": (ids := torch.randint(1, 128, (n,), generator=g).tolist()), "labels": [-100] + ids[1:]}
            for n in (5, 9, 7)]  # fmt: skip
    args = SortedTrainingConfig(output_dir=str(tmp_path), per_device_eval_batch_size=2, use_cpu=True, report_to="none")
    trainer = SortedTrainer(model=drafter.eval(), args=args, eval_dataset=rows, data_collator=pad_collator(0))
    metrics = trainer.evaluate()
    batch = pad_collator(0)(rows)
    with torch.no_grad():
        exits = drafter(batch["input_ids"]).logits_per_exit
    labels = batch["labels"][:, 1:]
    valid = labels != -100
    assert int(valid.sum()) == 4 + 8 + 6  # position t predicts labels[t + 1]: n - 1 positions a row
    for layer, logits in zip((1, 2), exits):
        expected = float((logits[:, :-1].argmax(-1) == labels)[valid].float().mean())
        assert metrics[f"eval_top1_exit_{layer}"] == pytest.approx(expected)
    with torch.no_grad():
        assert metrics["eval_loss"] > 0 and metrics["eval_loss"] == pytest.approx(
            float(drafter(batch["input_ids"], labels=batch["labels"]).loss), rel=0.2)  # two batches vs one: close
