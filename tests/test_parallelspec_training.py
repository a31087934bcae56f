"""ParallelSpec trained as the paper (Fig. 3): a parallel group after every position, the group-wise
mask, the anchor density option, and teacher-forced top-1 per [MASK] depth."""

import math

import pytest
import torch

import hf_spec
from conftest import make_target, plain_generate, random_prompt
from hf_spec.training.losses import eagle_loss
from hf_spec.training.parallelspec import (
    ParallelTrainer,
    ParallelTrainingArguments,
    anchor_candidates,
    build_parallel_layout,
    collate_features,
    depth_top1,
    group_anchors,
    num_group_anchors,
    parallel_depth_accuracy,
    parallel_eagle_loss,
    parallel_forward,
)


def test_every_position_layout_matches_hand_written_tensors():
    # 6 tokens x_0..x_5 -> 5 pairs (f_i, x_{i+1}); k = 2 masks; a group after every pair (Fig. 3).
    layout = build_parallel_layout(num_pairs=5, anchors=torch.tensor([[0, 1, 2, 3, 4]]), num_mask_tokens=2)
    #                                    pairs 0..4     | A0    A1    A2    A3    A4
    assert layout.source_index.tolist() == [[0, 1, 2, 3, 4, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4]]
    assert layout.mask_ids.tolist() == [[0, 0, 0, 0, 0, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2]]
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 4, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6]]
    assert layout.target_index.tolist() == [[0, 1, 2, 3, -100, 1, 2, 2, 3, 3, -100, -100, -100, -100, -100]]
    pair_ids = torch.tensor([[11, 12, 13, 14, 15]])  # x_1..x_5; pair t (and [MASK]_j of anchor t - j) -> x_{t+2}
    assert layout.labels(pair_ids).tolist() == [[12, 13, 14, 15, -100, 13, 14, 14, 15, 15, -100, -100, -100, -100,
                                                 -100]]  # fmt: skip
    expected = torch.tensor(
        [  # keys: pairs 0..4 | A0.M1 A0.M2 | A1.M1 A1.M2 | A2.M1 A2.M2 | A3.M1 A3.M2 | A4.M1 A4.M2
            [1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # pairs: causal among pairs, never a mask
            [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # A0.M1: pairs up to its anchor, itself
            [1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0],  # A0.M2: + its group's M1
            [1, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0],  # A1.M1: never another group's masks
            [1, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0],
            [1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(layout.attention_mask[0], expected)


def test_default_anchors_are_every_position_whose_group_has_a_label():
    # all tokens are labels: the groups of pairs 3 and 4 would only predict past the row's end (-100 above)
    assert group_anchors(5, 2, loss_mask=torch.ones(1, 6, dtype=torch.long)).tolist() == [[0, 1, 2]]
    assert group_anchors(5, 2).tolist() == [[0, 1, 2]]
    # an assistant span x_6, x_7 inside a longer row: counted targets t = 4, 5 (x_{t+2}); their groups' anchors
    # are t - 1 and t - 2 for k = 2
    loss_mask = torch.tensor([[0, 0, 0, 0, 0, 0, 1, 1, 0, 0]])
    assert anchor_candidates(9, 2, loss_mask).nonzero()[:, 1].tolist() == [2, 3, 4]
    assert group_anchors(9, 2, loss_mask).tolist() == [[2, 3, 4]]
    # k = 4: anchors t - 4 .. t - 1
    assert group_anchors(9, 4, loss_mask).tolist() == [[0, 1, 2, 3, 4]]
    # right padding (lengths: usable pairs) and rows with fewer groups: -1 slots
    two = torch.tensor([[1] * 10, [1] * 6 + [0] * 4])
    anchors = group_anchors(9, 2, two, lengths=torch.tensor([9, 5]))
    assert anchors.tolist() == [[0, 1, 2, 3, 4, 5, 6], [0, 1, 2, -1, -1, -1, -1]]


def test_empty_group_slots_are_inert():
    layout = build_parallel_layout(6, torch.tensor([[0, 2], [1, -1]]), num_mask_tokens=2)
    p = 6
    assert layout.target_index[1, p + 2 :].tolist() == [-100, -100]  # the empty slot of row 1 has no targets
    assert not bool(layout.attention_mask[1, :, p + 2 :][: p + 2].any())  # nothing real attends to it
    with pytest.raises(ValueError, match="anchors must lie"):
        build_parallel_layout(6, torch.tensor([[0, -2]]), num_mask_tokens=2)


def test_density_picks_the_right_number_of_anchors():
    assert num_group_anchors(10, 1.0) == 10
    assert num_group_anchors(10, 0.25) == 3  # 2.5 rounds half up
    assert num_group_anchors(10, 0.3) == 3
    assert num_group_anchors(7, 0.5) == 4
    assert num_group_anchors(10, 0.01) == 1  # a row with a candidate keeps at least one group
    assert num_group_anchors(0, 0.5) == 0
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="parallel_group_density"):
            num_group_anchors(10, bad)
    # rows of 40 and 20 loss tokens (k = 4): 38 and 18 counted targets (t + 1 < usable pairs), 37 and 17 anchors
    loss_mask = torch.tensor([[1] * 40, [1] * 20 + [0] * 20])
    lengths = torch.tensor([39, 19])
    full = anchor_candidates(39, 4, loss_mask, lengths)
    assert full.sum(1).tolist() == [37, 17]
    g = torch.Generator().manual_seed(0)
    anchors = group_anchors(39, 4, loss_mask, lengths, density=0.5, generator=g)
    assert anchors.shape == (2, 19)
    for row, n in zip(anchors, (19, 9)):
        kept = row[row >= 0]
        assert kept.numel() == n and bool((row[n:] == -1).all())
        assert kept.tolist() == sorted(set(kept.tolist()))  # distinct, ascending
    assert bool(full[0, anchors[0]].all()) and bool(full[1, anchors[1, :9]].all())  # only candidates
    again = group_anchors(39, 4, loss_mask, lengths, density=0.5, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(again, anchors)  # drawn afresh
    assert group_anchors(39, 4, loss_mask, lengths, density=1.0).shape == (2, 37)


def test_depth_top1_on_a_hand_made_case():
    mask_ids = torch.tensor([[0, 0, 0, 1, 2, 1, 2]])
    labels = torch.tensor([[5, 6, -100, 7, 8, 9, -100]])
    predicted = torch.tensor([[5, 0, 3, 7, 1, 9, 4]])
    correct, counted = depth_top1(predicted, labels, mask_ids, num_depths=3)
    assert correct.tolist() == [1, 2, 0] and counted.tolist() == [2, 2, 1]
    correct, counted = depth_top1(predicted, labels, mask_ids, num_depths=4)  # a depth without positions
    assert correct.tolist() == [1, 2, 0, 0] and counted.tolist() == [2, 2, 1, 0]


def _features(target, ids):
    with torch.no_grad():
        return target.base_model(input_ids=ids).last_hidden_state


def _reference_loss(drafter, ids, feats, layout, loss_mask):
    """The loss computed the plain way: per depth, the target's logits of that depth's own positions."""
    out = parallel_forward(drafter, ids, feats, layout, output_logits=False)
    valid = layout.target_index >= 0
    index = layout.target_index.clamp(min=0)
    valid = valid & loss_mask[:, 2:].bool().gather(1, index.clamp(max=loss_mask.shape[1] - 3))
    total = 0.0
    for depth in range(drafter.num_mask_tokens + 1):
        sel = valid & (layout.mask_ids == depth)
        if sel.any():
            predicted = out.last_hidden_state[sel]
            target_feats = feats[:, 1:][sel.nonzero(as_tuple=True)[0], index[sel]]
            target_logits, cls_mask = drafter.training_targets(target_feats)
            total = total + eagle_loss(predicted, target_feats, drafter.draft_logits(predicted), target_logits, None,
                                       1.0, 0.1, cls_mask)["loss"]  # fmt: skip
    return total


def test_loss_is_finite_and_dropped_groups_change_nothing():
    target = make_target("llama")
    drafter = hf_spec.ParallelDrafter.from_target(target, num_mask_tokens=2)
    with torch.no_grad():
        drafter.mask_embedding.weight.normal_(0, 1.0)
    ids = torch.cat([random_prompt(length=12, seed=3), random_prompt(length=12, seed=4)])
    feats = _features(target, ids)
    loss_mask = torch.ones_like(ids)
    loss_mask[1, :5] = 0  # a "user turn" at the start of row 1
    anchors = group_anchors(11, 2, loss_mask)
    assert anchors.tolist() == [list(range(9)), [1, 2, 3, 4, 5, 6, 7, 8, -1]]
    layout = build_parallel_layout(11, anchors, 2)
    result = parallel_eagle_loss(drafter, ids, feats, layout, loss_mask)
    assert math.isfinite(float(result["loss"].detach()))
    result["loss"].backward()
    grad = drafter.mask_embedding.weight.grad
    assert grad is not None and bool(torch.isfinite(grad).all()) and bool((grad.abs().sum(-1) > 0).all())
    # the paper's layout literally (a group after every pair, label-less ones included) gives the same loss
    everything = build_parallel_layout(11, torch.arange(11).expand(2, 11), 2)
    with torch.no_grad():
        literal = parallel_eagle_loss(drafter, ids, feats, everything, loss_mask)
        reference = _reference_loss(drafter, ids, feats, layout, loss_mask)
    torch.testing.assert_close(literal["loss"], result["loss"].detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(reference, result["loss"].detach(), atol=1e-5, rtol=1e-5)  # shared target logits
    for d in range(3):
        assert int(literal[f"count_{d}"]) == int(result[f"count_{d}"])
    assert [int(result[f"count_{d}"]) for d in range(3)] == [10 + 7, 9 + 7, 8 + 7]


def test_every_group_sees_what_inference_sees():
    target = make_target("llama")
    drafter = hf_spec.ParallelDrafter.from_target(target, num_mask_tokens=2).eval()
    with torch.no_grad():
        drafter.mask_embedding.weight.normal_(0, 1.0)
    ids = random_prompt(length=10, seed=6)
    feats = _features(target, ids)
    p, k = ids.shape[1] - 1, 2
    layout = build_parallel_layout(p, torch.arange(p).view(1, -1), k)
    with torch.no_grad():
        train_logq = torch.log_softmax(parallel_forward(drafter, ids, feats, layout).logits[0].float(), -1)
    for anchor in range(p):
        session = drafter.new_drafting_session(target, drafter.tree_shape(depth=k + 1), do_sample=False)
        with torch.no_grad():
            infer_logq = session.draft_distributions(feats[0, : anchor + 1], ids[0, 1 : anchor + 2])
        rows = torch.tensor([anchor] + [p + anchor * k + j for j in range(k)])
        torch.testing.assert_close(infer_logq, train_logq[rows], atol=2e-5, rtol=1e-4)


def test_greedy_labels_with_a_draft_vocabulary_and_depth_accuracy():
    target = make_target("llama", seed=1)
    drafter = hf_spec.ParallelDrafter.from_target(target, num_mask_tokens=2)
    prompts = torch.randint(1, 128, (3, 4), generator=torch.Generator().manual_seed(0))
    data = plain_generate(target, prompts, max_new_tokens=12, min_new_tokens=12, do_sample=False)
    feats = _features(target, data)
    loss_mask = torch.zeros_like(data)
    loss_mask[:, 4:] = 1  # the target's own greedy answer tokens
    drafter.set_draft_vocab(torch.bincount(data[:, 4:].flatten(), minlength=128), 16)
    layout = build_parallel_layout(data.shape[1] - 1, group_anchors(data.shape[1] - 1, 2, loss_mask), 2)
    with torch.no_grad():
        plain = parallel_eagle_loss(drafter, data, feats, layout, loss_mask)
        greedy = parallel_eagle_loss(drafter, data, feats, layout, loss_mask, greedy_labels=True)
        accuracy = parallel_depth_accuracy(drafter, data, feats, layout, loss_mask)
    torch.testing.assert_close(greedy["loss"], plain["loss"], atol=1e-5, rtol=1e-5)
    for d in range(3):
        correct, counted = accuracy[d]
        assert counted == int(plain[f"count_{d}"]) > 0
        assert correct == round(float(plain[f"top1_{d}"]) * counted)


def test_trainer_logs_top1_per_depth(tmp_path):
    target = make_target("llama", seed=2)
    drafter = hf_spec.ParallelDrafter.from_target(target, num_mask_tokens=2)
    ids = torch.randint(1, 128, (8, 14), generator=torch.Generator().manual_seed(0))
    feats = _features(target, ids)
    rows = [{"input_ids": ids[i], "hidden_states": feats[i]} for i in range(ids.shape[0])]
    args = ParallelTrainingArguments(output_dir=str(tmp_path), max_steps=3, learning_rate=1e-3,
                                     per_device_train_batch_size=4, gradient_accumulation_steps=1, use_cpu=True,
                                     report_to=[], save_strategy="no", logging_steps=1, disable_tqdm=True,
                                     dataloader_num_workers=0, seed=0)  # fmt: skip
    assert (args.parallel_group_density, args.num_parallel_groups) == (1.0, 0)
    trainer = ParallelTrainer(model=drafter, args=args, train_dataset=rows, data_collator=collate_features)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 3
    for entry in logged:
        assert all(0.0 <= entry[f"top1_d{d}"] <= 1.0 for d in range(3)), entry
    # the old sparse setting still runs
    sparse = ParallelTrainingArguments(output_dir=str(tmp_path), max_steps=1, num_parallel_groups=2, use_cpu=True,
                                       gradient_accumulation_steps=1,
                                       report_to=[], save_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    ParallelTrainer(model=drafter, args=sparse, train_dataset=rows, data_collator=collate_features).train()
