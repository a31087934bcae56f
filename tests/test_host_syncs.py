"""Host syncs and LM-head calls per speculative cycle: a constant, whatever the tree size.

On a GPU every read of a tensor's value by the host (``.item()``, ``.tolist()``, ``bool()``,
``int()``...) waits for the queued kernels. The greedy loop reads one packed tensor per cycle
for the verification walk and one for the stopping criteria, and runs the target's LM head
once per cycle over all tree nodes (one read of its weights).
"""

from __future__ import annotations

import pytest
import torch

from conftest import count_host_syncs, oracle_pair, plain_generate, random_prompt

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
