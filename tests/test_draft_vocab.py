"""Draft vocabulary (hf_spec.draft_vocab): the map, its checkpoint round trip and errors, drafting
over only D head rows, losslessness (greedy and sampled) when the target's choice lies outside
the draft vocabulary, and training against the restricted target distribution."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import hf_spec
from conftest import oracle_pair, plain_generate, random_prompt
from hf_spec import draft_vocab
from test_sampling import P_VALUE_FLOOR, VOCAB, chi_square_pvalue, exact_joint, sample_counts, tiny_pair, warpers


# -- the map --------------------------------------------------------------------------------------
def test_map_is_top_d_by_count_ties_by_lower_id_sorted_ascending():
    counts = torch.tensor([3, 0, 5, 3, 0, 9, 3])
    ids = draft_vocab.select_draft_ids(counts, 4)
    assert ids.tolist() == [0, 2, 3, 5]  # 9, 5, then the tie 3/3/3 keeps ids 0 and 3
    d2t, t2d = draft_vocab.d2t_from_ids(ids), draft_vocab.t2d_from_ids(ids, 7)
    assert d2t.dtype == torch.int64 and d2t.tolist() == [0, 1, 1, 2]  # target id = i + d2t[i]
    assert t2d.tolist() == [True, False, True, True, False, True, False]
    assert torch.equal(draft_vocab.ids_from_d2t(d2t), ids)
    assert draft_vocab.coverage(counts, ids) == pytest.approx((3 + 5 + 3 + 9) / 23)
    draft_vocab.validate(d2t, t2d, 7)
    with pytest.raises(ValueError, match="disagree"):
        draft_vocab.validate(d2t, draft_vocab.t2d_from_ids(torch.tensor([0, 1, 3, 5]), 7))
    with pytest.raises(ValueError, match="draft_vocab_size"):
        draft_vocab.select_draft_ids(counts, 8)


def vocab_pair(family="llama", size=40, seed=0):
    """The conftest oracle drafter (V = 128) with a draft vocabulary of the ``size`` tokens most frequent
    in the target's own greedy outputs, plus the ids (the map only ever removes drafting options)."""
    target, trained = oracle_pair(family)
    prompts = torch.cat([random_prompt(6, seed=100 + s) for s in range(16)])
    outputs = plain_generate(target, prompts, max_new_tokens=24, do_sample=False)[:, 6:]
    counts = torch.bincount(outputs.reshape(-1), minlength=target.config.vocab_size)
    drafter = copy.deepcopy(trained).bind(target)
    drafter.set_draft_vocab(counts, size)
    return target, drafter


def test_greedy_with_a_draft_vocabulary_equals_plain_generate():
    for family in ("llama", "qwen2"):
        target, drafter = vocab_pair(family, size=40)
        outside = 0
        for seed in (1, 2, 3):
            prompt = random_prompt(10, seed=seed)
            expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
            outside += int((~drafter.t2d[expected[0, 10:]]).sum())
            out = target.generate(prompt, assistant_model=drafter, max_new_tokens=40, do_sample=False)
            assert torch.equal(out, expected)
        assert outside > 0, "the target never chose a token outside the draft vocabulary: the test means nothing"
        assert drafter.last_generation_stats.tau > 1.5  # drafts inside the vocabulary are still accepted


def test_the_draft_head_runs_through_the_few_row_kernels(monkeypatch):
    """The copy of the head's rows at the draft ids is not a submodule of the drafter, yet decoding multiplies it
    at every drafting step: generate() hands it to few_row_linears with the drafter (greedy output unchanged)."""
    from hf_spec import linear_kernels

    target, drafter = vocab_pair("llama", size=40)
    shapes = []
    transposed = linear_kernels._transposed
    monkeypatch.setattr(linear_kernels, "_transposed",
                        lambda x2, weight, bias: shapes.append(tuple(weight.shape)) or transposed(x2, weight, bias))
    prompt = random_prompt(10, seed=1)
    expected = plain_generate(target, prompt, max_new_tokens=24, do_sample=False)
    with linear_kernels.forced_kernel("transposed"):
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False)
    assert torch.equal(out, expected)
    assert (40, target.config.hidden_size) in shapes
    assert drafter.decoding_modules() == (drafter.draft_head().linear,)
    assert "forward" not in drafter.draft_head().linear.__dict__  # restored after the call
    # without a draft vocabulary the drafter multiplies the target's own head: decoding runs the module (whose
    # kernel few_row_linears chose), training a detached copy of its weight
    full = copy.deepcopy(oracle_pair("llama")[1]).bind(target)
    hidden = torch.randn(3, target.config.hidden_size, requires_grad=True)
    shapes.clear()
    with linear_kernels.few_row_linears(target), linear_kernels.forced_kernel("transposed"):
        with torch.no_grad():
            decoding = full.lm_logits(hidden)
        assert shapes == [tuple(target.lm_head.weight.shape)]
        full.lm_logits(hidden).sum().backward()
    assert shapes == [tuple(target.lm_head.weight.shape)] and hidden.grad is not None
    assert target.lm_head.weight.grad is None
    torch.testing.assert_close(decoding, target.lm_head(hidden).detach())


def test_batched_greedy_with_a_draft_vocabulary_equals_plain_generate():
    target, drafter = vocab_pair("llama", size=40)
    prompts = torch.cat([random_prompt(8, seed=3), random_prompt(8, seed=4)])
    expected = plain_generate(target, prompts, max_new_tokens=20, do_sample=False)
    assert torch.equal(target.generate(prompts, assistant_model=drafter, max_new_tokens=20, do_sample=False), expected)


def test_draft_log_probs_multiply_only_the_draft_rows(monkeypatch):
    target, drafter = vocab_pair(size=40)
    head = target.get_output_embeddings().weight
    calls = []
    real_linear = F.linear

    def recording_linear(x, weight, bias=None):
        calls.append((tuple(weight.shape), weight.data_ptr()))
        return real_linear(x, weight, bias)

    hidden = torch.randn(5, target.config.hidden_size)
    monkeypatch.setattr(torch.nn.functional, "linear", recording_linear)
    logq = drafter.draft_log_probs(hidden, temperature=0.7)
    monkeypatch.undo()
    assert calls and all(ptr != head.data_ptr() and shape[0] == 40 for shape, ptr in calls)
    # the distribution: softmax of the draft rows' logits, -inf outside the draft vocabulary
    ids = drafter.draft_ids
    assert torch.isinf(logq[:, ~drafter.t2d]).all()
    torch.testing.assert_close(logq[:, ids], torch.log_softmax(drafter.lm_logits(hidden)[:, ids] / 0.7, dim=-1))


@pytest.mark.parametrize("warp", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9)], ids=["T1", "T0.7-p0.9"])
def test_sampling_with_a_draft_vocabulary_keeps_the_target_distribution(warp):
    target, trained = tiny_pair("trained")
    drafter = copy.deepcopy(trained).bind(target)
    prompt = random_prompt(length=6, vocab_size=VOCAB, seed=11)
    exact = exact_joint(target, prompt, warpers(**warp))
    # token marginals of the 3 new positions at T = 1; the 4 likeliest tokens form the draft vocabulary
    plain = exact_joint(target, prompt, warpers(temperature=1.0))
    drafter.set_draft_vocab(sum(plain.sum(dim=dims) for dims in ((1, 2), (0, 2), (0, 1))), 4)
    marginals = torch.stack([exact.sum(dim=dims) for dims in ((1, 2), (0, 2), (0, 1))])
    outside_mass = float(marginals[:, ~drafter.t2d].sum(-1).mean())
    assert outside_mass > 0.02, outside_mass  # the target really puts mass outside the draft vocabulary
    torch.manual_seed(2468)
    counts, tau = sample_counts(target, prompt, drafter, tree_depth=3, tree_top_k=3, tree_total_tokens=6, **warp)
    assert chi_square_pvalue(counts, exact) > P_VALUE_FLOOR, tau
    assert tau > 1.2  # drafts are accepted


# -- checkpoints and errors ---------------------------------------------------------------------
def test_checkpoint_round_trip_keeps_the_map(tmp_path):
    from transformers import AutoModel

    target, drafter = vocab_pair(size=40)
    drafter.save_pretrained(tmp_path)
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "model.safetensors"))
    assert torch.equal(saved["d2t"], drafter.d2t) and torch.equal(saved["t2d"], drafter.t2d)
    assert not any("lm_head" in k or "embed" in k for k in saved)  # still no target weights
    hidden = torch.randn(3, target.config.hidden_size)
    for loaded in (hf_spec.EagleDrafter.from_pretrained(tmp_path), AutoModel.from_pretrained(tmp_path)):
        loaded.bind(target)
        assert loaded.config.draft_vocab_size == 40
        assert torch.equal(loaded.d2t, drafter.d2t) and torch.equal(loaded.t2d, drafter.t2d)
        torch.testing.assert_close(loaded.draft_log_probs(hidden), drafter.draft_log_probs(hidden))


def test_a_drafter_without_a_draft_vocabulary_is_unchanged(tmp_path):
    target, drafter = oracle_pair("llama")
    assert drafter.config.draft_vocab_size is None and not drafter.has_draft_vocab
    drafter.save_pretrained(tmp_path)
    loaded = hf_spec.EagleDrafter.from_pretrained(tmp_path).bind(target)
    assert "d2t" not in loaded.state_dict() and not loaded.has_draft_vocab


def test_a_map_for_another_vocabulary_size_is_a_clear_error():
    target, drafter = vocab_pair(size=40)
    drafter = copy.deepcopy(drafter)
    drafter.register_buffer("t2d", torch.zeros(100, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"100 ids, but the target has 128.*Fix"):
        drafter.bind(target)
    with pytest.raises(ValueError, match=r"128 ids.*shape \(100,\)"):
        drafter.set_draft_vocab(torch.ones(100), 10)


def test_training_with_a_draft_vocabulary_lowers_the_loss():
    """EAGLE loss against the target restricted to the draft ids; positions whose target argmax is
    outside them leave the classification term only."""
    target, _ = oracle_pair("llama")
    drafter = hf_spec.EagleDrafter.from_target(target)
    torch.manual_seed(0)
    data = plain_generate(target, torch.randint(1, 128, (16, 4)), max_new_tokens=20, min_new_tokens=20, do_sample=False)
    drafter.set_draft_vocab(torch.bincount(data[:, 4:].reshape(-1), minlength=128), 32)
    with torch.no_grad():
        features = target.base_model(input_ids=data).last_hidden_state
    ids, feats_in, feats_target = data[:, 1:], features[:, :-1], features[:, 1:]
    target_logits, cls_mask = drafter.training_targets(feats_target)
    assert target_logits.shape[-1] == 32 and 0 < int(cls_mask.sum()) < cls_mask.numel()

    def loss():
        predicted = drafter(input_ids=ids, hidden_states=feats_in).last_hidden_state
        return hf_spec.training.losses.eagle_loss(predicted, feats_target, drafter.draft_logits(predicted),
                                                  target_logits, None, cls_mask=cls_mask)["loss"]  # fmt: skip

    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    with torch.no_grad():
        before = loss().item()
    drafter.train()
    for _ in range(30):
        optimizer.zero_grad()
        loss().backward()
        optimizer.step()
    drafter.eval()
    with torch.no_grad():
        after = loss().item()
    assert after < 0.8 * before, (before, after)


@pytest.mark.parametrize("kind", ["eagle", "hass", "coral", "parallelspec"])
def test_trainers_with_a_draft_vocabulary_lower_the_loss(kind, tmp_path_factory, capsys):
    """Every Trainer trains over the draft ids only (the pipeline's map: most frequent assistant tokens)."""
    from test_training import TRAINER_SETUPS, _feature_cache, _trainer

    from hf_spec.training.pipeline import attach_draft_vocab

    target, path = _feature_cache(str(tmp_path_factory.mktemp("cache")))
    trainer_class, args_class, extra, ratio = TRAINER_SETUPS[kind]
    trainer = _trainer(trainer_class, args_class, target, path, tmp_path_factory.mktemp("out"), max_steps=25, **extra)
    drafter = trainer.model
    share = attach_draft_vocab(drafter, trainer.train_dataset, 24)
    assert drafter.config.draft_vocab_size == 24 and 0 < share < 1
    assert "cover" in capsys.readouterr().out
    assert attach_draft_vocab(copy.deepcopy(drafter), trainer.train_dataset, 0) is None
    calls = []
    real_linear = F.linear

    def recording_linear(x, weight, bias=None):
        calls.append(tuple(weight.shape))
        return real_linear(x, weight, bias)

    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(0)
        torch.nn.functional.linear = recording_linear
        try:
            before = trainer.compute_loss(trainer.model.eval(), batch).item()
        finally:
            torch.nn.functional.linear = real_linear
    assert (24, 64) in calls  # the drafter's logits come from the draft rows
    trainer.train()
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(0)
        after = trainer.compute_loss(trainer.model.eval(), batch).item()
    assert after < ratio * before, (before, after)


def test_remote_code_loads_the_map_without_hf_spec(tmp_path):
    """trust_remote_code users (no hf-spec installed) get the same map and draft distribution."""
    import json
    import os
    import subprocess
    import sys
    import textwrap

    from safetensors.torch import load_file, save_file

    target, drafter = vocab_pair(size=40)
    drafter.save_pretrained(tmp_path / "drafter")
    target.save_pretrained(tmp_path / "target")
    hidden = torch.randn(3, target.config.hidden_size)
    save_file({"hidden": hidden}, str(tmp_path / "hidden.safetensors"))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(hf_spec.__file__)))
    script = textwrap.dedent(f"""
        import json, sys
        sys.modules["hf_spec"] = None
        sys.path[:] = [p for p in sys.path if not p.startswith({repo!r})]
        import torch
        from safetensors.torch import load_file, save_file
        from transformers import AutoModel, AutoModelForCausalLM
        drafter = AutoModel.from_pretrained({str(tmp_path / "drafter")!r}, trust_remote_code=True)
        drafter.bind(AutoModelForCausalLM.from_pretrained({str(tmp_path / "target")!r}))
        hidden = load_file({str(tmp_path / "hidden.safetensors")!r})["hidden"]
        save_file({{"logq": drafter.draft_log_probs(hidden), "d2t": drafter.d2t}}, {str(tmp_path / "out.safetensors")!r})
        print("REPORT" + json.dumps(type(drafter).__module__))
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               TRANSFORMERS_VERBOSITY="error")  # fmt: skip
    result = subprocess.run([sys.executable, "-I", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.split("REPORT", 1)[1]).startswith("transformers_modules.")
    out = load_file(str(tmp_path / "out.safetensors"))
    assert torch.equal(out["d2t"], drafter.d2t)
    torch.testing.assert_close(out["logq"], drafter.draft_log_probs(hidden))  # same math in another process


# -- the other drafter families -------------------------------------------------------------------
def _outside_count(expected, prompt_length, t2d):
    return int((~t2d[expected[:, prompt_length:]]).sum())


def test_coral_router_groups_partition_the_draft_vocabulary(monkeypatch):
    from hf_spec.drafters.eagle import router as router_module
    from hf_spec.drafters.eagle.router import frequency_order, group_slices

    target, drafter = vocab_pair("qwen2", size=40)
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="permutation of the 40 draft vocabulary indices"):
        drafter.add_router(torch.arange(128), num_groups=8)
    drafter.add_router(frequency_order(torch.randint(0, 50, (40,), generator=g)), num_groups=8, top_n=2)
    with pytest.raises(ValueError, match="attach the draft vocabulary first"):
        copy.deepcopy(drafter).set_draft_vocab(torch.ones(128), 20)
    hidden = torch.randn(6, target.config.hidden_size)
    logq = drafter.draft_log_probs(hidden, temperature=0.7, use_router=True)
    torch.testing.assert_close(logq.exp().sum(-1), torch.ones(6))
    top = drafter.router(hidden).topk(2, dim=-1).indices
    for row in range(6):
        allowed = torch.cat([drafter.router_token_order[group_slices(40, 8)[grp]] for grp in top[row].tolist()])
        assert sorted(torch.isfinite(logq[row]).nonzero().view(-1).tolist()) == sorted(drafter.draft_ids[allowed].tolist())
    rows = []
    real_linear = F.linear
    monkeypatch.setattr(router_module.F, "linear", lambda x, w, b=None: rows.append(w) or real_linear(x, w, b))
    drafter.draft_log_probs(hidden[:1], use_router=True)
    monkeypatch.undo()
    group_ptrs = {w.data_ptr() for w in drafter._grouped_head[1].weights}
    head_ptr = target.get_output_embeddings().weight.data_ptr()
    assert sum(w.shape[0] for w in rows if w.data_ptr() in group_ptrs) == 2 * 40 // 8  # top-2 of 8 groups of 40 rows
    assert not any(w.data_ptr() == head_ptr for w in rows)
    for seed in (1, 2):
        prompt = random_prompt(10, seed=seed)
        expected = plain_generate(target, prompt, max_new_tokens=30, do_sample=False)
        assert torch.equal(target.generate(prompt, assistant_model=drafter, max_new_tokens=30, do_sample=False), expected)
        assert _outside_count(expected, 10, drafter.t2d) > 0


def test_parallelspec_with_a_draft_vocabulary_equals_plain_generate():
    target, _ = oracle_pair("llama")
    _, with_vocab = vocab_pair("llama", size=40)
    torch.manual_seed(0)
    drafter = hf_spec.ParallelDrafter.from_target(target, num_mask_tokens=3)
    drafter.set_draft_vocab(with_vocab.draft_ids)  # exact ids (size=None)
    assert drafter.config.draft_vocab_size == 40
    for seed in (1, 2):
        prompt = random_prompt(10, seed=seed)
        expected = plain_generate(target, prompt, max_new_tokens=30, do_sample=False)
        assert torch.equal(target.generate(prompt, assistant_model=drafter, max_new_tokens=30, do_sample=False), expected)
        assert _outside_count(expected, 10, drafter.t2d) > 0
    session = drafter.new_drafting_session(target, drafter.tree_shape(), False)
    logq = session.draft_distributions(torch.randn(2, 64), torch.tensor([5, 7]))
    assert logq.shape == (4, 128) and torch.isinf(logq[:, ~drafter.t2d]).all()
    assert torch.isfinite(logq[:, drafter.t2d]).all()


def test_sorted_drafter_exits_score_only_the_draft_vocabulary(tmp_path):
    from test_s2d import sorted_pair

    target, drafter = sorted_pair("llama", thresholds=(0.9, 0.9, 0.0))  # a D-way softmax is more confident
    prompts = torch.cat([random_prompt(6, seed=100 + s) for s in range(8)])
    counts = torch.bincount(plain_generate(target, prompts, max_new_tokens=16, do_sample=False)[:, 6:].reshape(-1),
                            minlength=128)  # fmt: skip
    drafter.set_draft_vocab(counts, 40)
    for family_seed in (1, 2):
        prompt = random_prompt(10, seed=family_seed)
        expected = plain_generate(target, prompt, max_new_tokens=24, do_sample=False)
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=24, do_sample=False, tree_depth=4)
        assert torch.equal(out, expected)
        assert _outside_count(expected, 10, drafter.t2d) > 0
    assert sum(c > 0 for c in drafter.last_generation_stats.early_exits.exit_counts) >= 2, drafter.last_generation_stats.early_exits.exit_counts  # early exits stay live
    ids = random_prompt(12, seed=9)
    out = drafter(ids, labels=ids)
    assert all(logits.shape[-1] == 40 for logits in out.logits_per_exit)
    labels = drafter.exit_labels(ids)
    inside = drafter.t2d[ids]
    assert torch.equal(drafter.draft_ids[labels[inside]], ids[inside]) and (labels[~inside] == -100).all()
    drafter.save_pretrained(tmp_path)
    loaded = SortedDrafter.from_pretrained(tmp_path).bind(target)
    assert torch.equal(loaded.d2t, drafter.d2t)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits_per_exit[-1], drafter(ids).logits_per_exit[-1])


from hf_spec.drafters.s2d import SortedDrafter  # noqa: E402
