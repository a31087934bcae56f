"""Host syncs and LM-head calls per speculative cycle: a constant, whatever the tree size.

On a GPU every read of a tensor's value by the host (``.item()``, ``.tolist()``, ``bool()``,
``int()``...) waits for the queued kernels, and so does every op whose output shape depends on
tensor values (boolean-mask indexing, ``nonzero``...: an implicit sync). The greedy loop reads one
packed tensor per cycle for the verification walk and one for the stopping criteria, runs the
target's LM head once per cycle over all tree nodes (one read of its weights), and no op of a
greedy cycle has a data-dependent shape: drafted trees have fixed sizes.
"""

from __future__ import annotations

import pytest
import torch

import hf_spec
from conftest import count_host_syncs, make_target, oracle_pair, plain_generate, random_prompt

NO_SHAPE_OPS = {"loop": 0, "drafter": 0}

@pytest.mark.parametrize("shape", [dict(tree_depth=6, tree_top_k=8, tree_total_tokens=60),
                                   dict(tree_depth=4, tree_top_k=1, tree_total_tokens=3)])  # fmt: skip
def test_greedy_cycle_has_constant_host_syncs_and_one_head_call(shape):
    target, drafter = oracle_pair("llama")
    prompt = random_prompt()
    expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    with count_host_syncs() as counts:
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=40, do_sample=False, **shape)
    assert torch.equal(out, expected)
    cycles = drafter.last_generation_stats.cycles
    assert cycles >= 5
    assert counts["head"] == cycles + 1  # prefill + one matmul over the whole tree per cycle
    # Loop proper: per cycle the walk's packed result and the stopping flags; once: the first
    # token, the last stopping check and 2 in transformers' generate() preparation.
    assert counts["loop"] <= 2 * cycles + 4, counts
    # Drafting: no host read inside the depth loop or the re-ranking.
    assert counts["drafter"] == 0, counts
    # No implicit sync either: the tree is grown and re-ranked in fixed shapes, and verified in them.
    assert counts["shape_ops"] == NO_SHAPE_OPS, counts["shape_op_names"]


def test_batched_greedy_cycle_has_constant_host_syncs():
    target, drafter = oracle_pair("llama")
    prompts = torch.cat([random_prompt(seed=1), random_prompt(seed=2)])
    expected = plain_generate(target, prompts, max_new_tokens=30, do_sample=False)
    with count_host_syncs() as counts:
        out = target.generate(prompts, assistant_model=drafter, max_new_tokens=30, do_sample=False)
    assert torch.equal(out, expected)
    forwards = drafter.last_generation_stats.verify_forwards
    assert counts["head"] == forwards + 1  # one matmul over every row's tree per verification
    assert counts["loop"] <= 4 * forwards + 6, counts  # walks, stopping flags, the re-pack check per cycle
    assert counts["drafter"] == 0, counts
    assert counts["shape_ops"] == NO_SHAPE_OPS, counts["shape_op_names"]


def test_parallelspec_static_tree_drafts_without_syncs():
    """ParallelSpec's static tree has the full product shape whatever the draws: no host read and no implicit
    sync while drafting, as the dynamic tree."""
    target = make_target("llama")
    drafter = hf_spec.ParallelDrafter.from_target(target).eval()
    prompt = random_prompt()
    expected = plain_generate(target, prompt, max_new_tokens=20, do_sample=False)
    with count_host_syncs() as counts:
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=20, do_sample=False)
    assert torch.equal(out, expected)
    assert drafter.last_generation_stats.cycles >= 5
    assert counts["drafter"] == 0, counts
    assert counts["shape_ops"] == NO_SHAPE_OPS, counts["shape_op_names"]


def test_shape_op_counter_sees_implicit_syncs():
    """The counter itself: data-dependent shapes count (per phase), fixed-shape look-alikes do not."""
    x, mask = torch.arange(6.0), torch.arange(6) > 2
    with count_host_syncs() as counts:
        x[mask], x.nonzero(), torch.where(mask), x.masked_select(mask), x.unique()
        x.repeat_interleave(torch.ones(6, dtype=torch.long))
        y = x.clone()
        y[mask] = x[:3]
        # fixed shapes: scalar fill through a mask, integer repeats, given output size, long indices
        y[mask] = 0.0
        x.repeat_interleave(2), x.repeat_interleave(torch.ones(6, dtype=torch.long), output_size=6), x[mask.long()]
    assert counts["shape_ops"] == {"loop": 7, "drafter": 0}, counts["shape_op_names"]
