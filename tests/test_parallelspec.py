"""ParallelSpec drafter: group-wise training layout, train/inference agreement, lossless
greedy and sampling decoding through the static tree, training steps, save/load."""

import pytest
import torch
from transformers import AutoConfig, AutoModel

import hf_spec
from conftest import make_target, plain_generate, random_prompt
from test_sampling import (P_VALUE_FLOOR, VOCAB, chi_square_pvalue, exact_joint, rejects_colder_law, sample_counts,
                           warpers)  # fmt: skip
from hf_spec.training.parallelspec import (
    ParallelTrainer,
    ParallelTrainingArguments,
    build_parallel_layout,
    collate_features,
    parallel_eagle_loss,
    parallel_forward,
    sample_anchors,
)
from hf_spec.tree.static import build_static_tree, static_tree_size


def test_two_group_layout_matches_hand_written_tensors():
    # 7 tokens x_0..x_6 -> 6 pairs (f_i, x_{i+1}); k = 2 masks; groups anchored at pairs 1 and 3.
    layout = build_parallel_layout(num_pairs=6, anchors=torch.tensor([[1, 3]]), num_mask_tokens=2)
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 2, 3, 4, 5]]
    assert layout.mask_ids.tolist() == [[0, 0, 0, 0, 0, 0, 1, 2, 1, 2]]
    assert layout.source_index.tolist() == [[0, 1, 2, 3, 4, 5, 1, 1, 3, 3]]
    pair_ids = torch.tensor([[11, 12, 13, 14, 15, 16]])  # x_1..x_6; pair t predicts x_{t+2}
    assert layout.labels(pair_ids).tolist() == [[12, 13, 14, 15, 16, -100, 14, 15, 16, -100]]
    expected = torch.tensor(
        [  # keys: pairs 0..5 | A1.M1 A1.M2 A3.M1 A3.M2
            [1, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 0, 0, 0, 0],  # tokens never see masks
            [1, 1, 0, 0, 0, 0, 1, 0, 0, 0],  # [MASK]_1 of anchor 1: context up to its anchor
            [1, 1, 0, 0, 0, 0, 1, 1, 0, 0],  # [MASK]_2 of anchor 1: + its group's [MASK]_1
            [1, 1, 1, 1, 0, 0, 0, 0, 1, 0],  # anchor 3's group never sees anchor 1's group
            [1, 1, 1, 1, 0, 0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(layout.attention_mask[0], expected)


def test_sampled_anchors_leave_room_for_every_mask():
    anchors = sample_anchors(20, 3, 4, batch_size=5, generator=torch.Generator().manual_seed(0))
    assert anchors.shape == (5, 3)
    assert bool((anchors + 4 + 1 < 20).all())
    assert all(len(set(row.tolist())) == 3 for row in anchors)


def _features(target, ids):
    with torch.no_grad():
        return target.base_model(input_ids=ids).last_hidden_state


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_training_and_inference_logits_agree(family):
    target = make_target(family)
    drafter = hf_spec.ParallelDrafter.from_target(target).eval()
    with torch.no_grad():
        drafter.mask_embedding.weight.normal_(0, 1.0)  # make the masks matter
    ids = random_prompt(length=16, seed=4)
    feats = _features(target, ids)
    anchors = (4, 9)
    layout = build_parallel_layout(ids.shape[1] - 1, torch.tensor([anchors]), drafter.num_mask_tokens)
    with torch.no_grad():
        train_logq = torch.log_softmax(parallel_forward(drafter, ids, feats, layout).logits[0].float(), -1)
    k, p = drafter.num_mask_tokens, ids.shape[1] - 1
    shape = drafter.tree_shape()
    session = drafter.new_drafting_session(target, shape, do_sample=False, temperature=1.0)
    start = 0
    for g, anchor in enumerate(anchors):  # two cycles: the second reuses the cache with the masks cropped
        with torch.no_grad():
            infer_logq = session.draft_distributions(feats[0, start : anchor + 1], ids[0, start + 1 : anchor + 2])
        assert session.cache.get_seq_length() == anchor + 1  # masks' KV cropped
        rows = torch.tensor([anchor] + [p + g * k + j for j in range(k)])
        torch.testing.assert_close(infer_logq, train_logq[rows], atol=2e-5, rtol=1e-4)
        start = anchor + 1


def test_shallow_tree_runs_only_the_masks_it_uses():
    target = make_target("llama")
    drafter = hf_spec.ParallelDrafter.from_target(target).eval()
    with torch.no_grad():
        drafter.mask_embedding.weight.normal_(0, 1.0)
    ids = random_prompt(length=12, seed=5)
    feats = _features(target, ids)
    lengths = []
    drafter.register_forward_hook(lambda module, args, kwargs, out: lengths.append(kwargs["input_ids"].shape[1]),
                                  with_kwargs=True)  # fmt: skip
    logq = {}
    for depth in (5, 3):
        session = drafter.new_drafting_session(target, drafter.tree_shape(depth=depth), do_sample=False)
        with torch.no_grad():
            logq[depth] = session.draft_distributions(feats[0, :8], ids[0, 1:9])
        assert session.cache.get_seq_length() == 8
    assert lengths == [8 + 4, 8 + 2]  # depth 3 needs [MASK]_1, [MASK]_2 only
    assert logq[3].shape[0] == 3
    torch.testing.assert_close(logq[3], logq[5][:3], atol=2e-5, rtol=1e-4)


def test_static_tree_shape_and_candidates():
    logq = torch.log_softmax(torch.randn(5, 32), -1)
    tree = build_static_tree(7, logq, (4, 2, 2, 1, 1), sample=False)
    assert len(tree) - 1 == static_tree_size((4, 2, 2, 1, 1))[0] == 60
    assert torch.bincount(tree.depths).tolist() == [1, 4, 8, 16, 16, 16]
    # greedy: every parent at depth d-1 gets the top-w tokens of q_d
    for slot, node in enumerate(tree.expanded.tolist()):
        d = int(tree.depths[node]) + 1
        width = (4, 2, 2, 1, 1)[d - 1]
        assert tree.candidate_tokens[slot, :width].tolist() == logq[d - 1].topk(width).indices.tolist()
    sampled = build_static_tree(7, logq, (3, 2), sample=True, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampled.draft_probs, logq.exp()[sampled.depths[sampled.expanded]])
    # each parent draws without replacement: no repeated child token under one parent
    for row in sampled.candidate_tokens:
        kept = row[row >= 0]
        assert kept.unique().numel() == kept.numel()
    # zero-probability draws keep the full shape but are no candidates: no row leads to them or below them
    narrow = torch.full((2, 8), float("-inf"))
    narrow[:, :2] = 0.0
    small = build_static_tree(7, torch.log_softmax(narrow, -1), (4, 3), sample=True)
    assert len(small) == 1 + 4 + 4 * 3 and small.expanded.tolist() == [0, 1, 2, 3, 4]
    assert bool((small.candidate_tokens[:, 2:] == -1).all())
    reachable = small.candidate_nodes[small.candidate_nodes >= 0]
    assert sorted(reachable.tolist()) == torch.isfinite(small.scores).nonzero().view(-1)[1:].tolist()
    assert reachable.numel() == 2 + 2 * 2


WIDTHS = [(4, 2, 2, 1, 1), (1,), (1, 1, 1, 1, 1), (3, 3), (2, 1, 2)]


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral"])
def test_greedy_equals_plain_generate(family):
    target = make_target(family)
    drafter = hf_spec.ParallelDrafter.from_target(target)
    for seed, widths in enumerate(WIDTHS):
        drafter.generation_config.tree_widths = list(widths)
        prompt = random_prompt(seed=seed)
        expected = plain_generate(target, prompt, max_new_tokens=30, do_sample=False)
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=30, do_sample=False)
        assert torch.equal(out, expected), widths
    # the generate() keywords: depth cuts the widths, top_k makes them uniform, total prunes
    drafter.generation_config.tree_widths = [4, 2, 2, 1, 1]
    prompt = random_prompt(seed=9)
    expected = plain_generate(target, prompt, max_new_tokens=30, do_sample=False)
    for kwargs in (dict(tree_depth=2), dict(tree_top_k=3, tree_depth=3), dict(tree_total_tokens=6)):
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=30, do_sample=False, **kwargs)
        assert torch.equal(out, expected), kwargs


def test_too_deep_tree_names_the_fix():
    target = make_target("llama")
    drafter = hf_spec.ParallelDrafter.from_target(target, num_mask_tokens=2)
    with pytest.raises(ValueError, match="tree_depth <= 3"):
        target.generate(random_prompt(), assistant_model=drafter, max_new_tokens=4, tree_depth=4)


def test_configured_total_tokens_caps_the_static_tree():
    """A config's tree_total_tokens smaller than the static tree prunes it by default (a shipped shape);
    a larger one keeps the whole tree; an explicit tree_total_tokens wins."""
    target = make_target("llama")
    drafter = hf_spec.ParallelDrafter.from_target(target, num_mask_tokens=2, tree_widths=[2, 1], tree_total_tokens=3)
    assert drafter.tree_shape().total_tokens == 3 and drafter.tree_shape(total_tokens=4).total_tokens == 4
    drafter.generation_config.tree_total_tokens = 60
    assert drafter.tree_shape().total_tokens == 4  # widths [2, 1]: 2 + 2 nodes
    prompt = random_prompt()
    assert torch.equal(target.generate(prompt, assistant_model=drafter, max_new_tokens=12, do_sample=False,
                                       tree_total_tokens=3), plain_generate(target, prompt, max_new_tokens=12))  # fmt: skip


def _target_outputs(target, num_sequences, length, do_sample, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, target.config.vocab_size, (num_sequences, 4), generator=g)
    torch.manual_seed(seed)
    data = plain_generate(target, prompts, max_new_tokens=length, min_new_tokens=length, do_sample=do_sample)
    return data, _features(target, data)


def _fit(drafter, data, feats, steps, lr=3e-3, batch=16, seed=0):
    """A short group-wise fit of ``drafter`` on the target's own outputs (test helper)."""
    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=lr)
    drafter.train()
    for _ in range(steps):
        rows = torch.randint(0, data.shape[0], (batch,), generator=g)
        anchors = sample_anchors(data.shape[1] - 1, 6, drafter.num_mask_tokens, batch, generator=g)
        layout = build_parallel_layout(data.shape[1] - 1, anchors, drafter.num_mask_tokens)
        loss = parallel_eagle_loss(drafter, data[rows], feats[rows], layout)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return drafter.eval()


_SAMPLING_PAIR = {}


def _sampling_pair():
    if not _SAMPLING_PAIR:
        target = make_target("llama", vocab_size=VOCAB, logit_scale=8.0, seed=3)
        drafter = hf_spec.ParallelDrafter.from_target(target, num_mask_tokens=2)
        data, feats = _target_outputs(target, 64, 24, do_sample=True)
        _SAMPLING_PAIR["pair"] = (target, _fit(drafter, data, feats, steps=150))
    return _SAMPLING_PAIR["pair"]


SAMPLING_CASES = [((3, 2, 2), dict(temperature=1.0)), ((4, 1, 1), dict(temperature=0.7, top_p=0.9))]


@pytest.mark.parametrize("widths,warp", SAMPLING_CASES)
def test_sampling_is_lossless(widths, warp):
    target, drafter = _sampling_pair()
    drafter.generation_config.tree_widths = list(widths)
    prompt = random_prompt(length=6, vocab_size=VOCAB, seed=11)
    exact = exact_joint(target, prompt, warpers(**warp))
    torch.manual_seed(1234)
    counts, tau = sample_counts(target, prompt, drafter, 1200, **warp)  # in batches of rows
    assert chi_square_pvalue(counts, exact) > P_VALUE_FLOOR, tau
    assert rejects_colder_law(counts, target, prompt, warp)  # the test can fail
    assert tau > 1.3  # drafts are accepted, so the accept path (and deeper depths) is exercised


def test_parallel_trainer_lowers_the_loss(tmp_path):
    target = make_target("llama", seed=2)
    drafter = hf_spec.ParallelDrafter.from_target(target)
    data, feats = _target_outputs(target, 32, 20, do_sample=False, seed=2)
    rows = [{"input_ids": data[i], "hidden_states": feats[i]} for i in range(data.shape[0])]
    fixed = collate_features(rows[:16])
    g = torch.Generator().manual_seed(0)
    anchors = sample_anchors(data.shape[1] - 1, 4, drafter.num_mask_tokens, 16, generator=g)
    layout = build_parallel_layout(data.shape[1] - 1, anchors, drafter.num_mask_tokens)

    def evaluate():
        with torch.no_grad():
            return float(parallel_eagle_loss(drafter, fixed["input_ids"], fixed["hidden_states"], layout,
                                             fixed["loss_mask"])["loss"])  # fmt: skip

    before = evaluate()
    args = ParallelTrainingArguments(output_dir=str(tmp_path), max_steps=80, learning_rate=3e-3,
                                     per_device_train_batch_size=8, gradient_accumulation_steps=1, use_cpu=True,
                                     report_to=[], save_strategy="no", logging_strategy="no",
                                     dataloader_num_workers=0, seed=0)  # fmt: skip
    assert (args.adam_beta2, args.weight_decay) == (0.95, 0.0)
    ParallelTrainer(model=drafter, args=args, train_dataset=rows, data_collator=collate_features).train()
    drafter.eval()
    after = evaluate()
    assert after < 0.85 * before, (before, after)


def test_save_load_round_trip_through_auto_classes(tmp_path):
    target = make_target("qwen2")
    drafter = hf_spec.ParallelDrafter.from_target(target, num_mask_tokens=3, tree_widths=[3, 2, 1])
    with torch.no_grad():
        drafter.mask_embedding.weight.normal_()
    drafter.save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, hf_spec.ParallelDrafterConfig)
    assert (config.num_mask_tokens, config.tree_widths) == (3, [3, 2, 1])
    assert config.resolved_training_method == "parallelspec"
    loaded = AutoModel.from_pretrained(tmp_path)
    assert isinstance(loaded, hf_spec.ParallelDrafter)
    state, reloaded = drafter.state_dict(), loaded.state_dict()
    assert state.keys() == reloaded.keys()
    assert all(torch.equal(state[name], reloaded[name]) for name in state)
    prompt = random_prompt(seed=3)
    expected = target.generate(prompt, assistant_model=drafter, max_new_tokens=12, do_sample=False)
    assert torch.equal(target.generate(prompt, assistant_model=loaded, max_new_tokens=12, do_sample=False), expected)
    assert list(loaded.generation_config.tree_widths) == [3, 2, 1]
