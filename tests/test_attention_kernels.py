"""Few-query attention (:mod:`hf_spec.attention_kernels`): every kernel computes transformers' SDPA attention on tree
masks, one query and a left-padded batch; the choice is measured in place and kept per (query count, length
bucket); calls the kernels do not cover run SDPA; the block restores the attention interface; and hf-spec's greedy
output stays plain ``generate()``'s with each kernel forced, one prompt and a left-padded batch."""

from __future__ import annotations

import pytest
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from conftest import assert_greedy_is_plain_generate, make_target, random_prompt
from hf_spec import attention_kernels, compat
from hf_spec.attention_kernels import KERNELS, attention_choices, few_query_attention, forced_attention, length_bucket
from hf_spec.tree.tree import additive_mask
from test_batched import assert_batched_greedy_is_plain_generate


pytestmark = pytest.mark.usefixtures("fresh_kernel_choices")  # each test measures from scratch


@pytest.fixture
def kernels_run(monkeypatch) -> list[str]:
    """The kernel of every call the few-query attention ran (so a test sees that its forwards went through it)."""
    ran, run = [], attention_kernels._run

    def recording(kernel, *args):
        ran.append(kernel)
        return run(kernel, *args)

    monkeypatch.setattr(attention_kernels, "_run", recording)
    return ran


PARENTS = [-1, 0, 0, 1, 1]
"""A branching draft tree: the root, two children, two grandchildren under the first."""


def _tree_logits(target, prompt, parents: list[int] | None):
    """Logits of a verification forward over a tree of ``parents`` (None: one plain step) on the prompt's cache."""
    cache = compat.full_dynamic_cache()
    with torch.no_grad(), compat.tree_attention(target.device):
        target(input_ids=prompt, past_key_values=cache, use_cache=True)
        past = prompt.shape[1]
        if parents is None:
            return target(input_ids=torch.tensor([[5]]), past_key_values=cache, use_cache=True).logits
        n = len(parents)
        ancestors, depths = torch.eye(n, dtype=torch.bool), [0] * n
        for node in range(1, n):
            ancestors[node] |= ancestors[parents[node]]
            depths[node] = depths[parents[node]] + 1
        allowed = torch.cat([torch.ones(n, past, dtype=torch.bool), ancestors], dim=1)
        return target(input_ids=torch.arange(3, 3 + n).view(1, -1), past_key_values=cache, use_cache=True,
                      attention_mask=additive_mask(allowed, target.dtype).view(1, 1, n, past + n),
                      position_ids=(past + torch.tensor(depths)).view(1, -1)).logits  # fmt: skip


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_kernel_computes_sdpa_attention(kernel, dtype, kernels_run):
    target = make_target("llama").to(dtype)  # 4 query heads over 2 key/value heads
    prompt = random_prompt(12)
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    for shape in (PARENTS, None):
        expected = _tree_logits(target, prompt, shape)
        with few_query_attention(), forced_attention(kernel):
            got = _tree_logits(target, prompt, shape)
        torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance * 30)
    assert set(kernels_run) == {kernel} and len(kernels_run) == 2 * target.config.num_hidden_layers
    with pytest.raises(ValueError, match="kernel must be one of"):
        with forced_attention("flash"):
            pass


def test_the_choice_is_measured_per_query_count_and_length_then_kept_and_the_block_restores_the_interface():
    target = make_target("llama")
    before = ALL_ATTENTION_FUNCTIONS["sdpa"]
    with few_query_attention():
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is not before
        calls = attention_kernels.WARMUP_CALLS + attention_kernels.TRIAL_CALLS
        for _ in range(calls // target.config.num_hidden_layers + 1):  # each forward calls every layer once
            _tree_logits(target, random_prompt(20), [-1, 0, 1])
        choices = attention_choices()
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is before
    assert "float32 1 threads 4/2 heads x 16, 3 queries, <= 128 keys" in choices  # prompt 20 + 3 tree tokens
    assert set(choices.values()) <= set(KERNELS) and not attention_kernels._trials
    assert length_bucket(23) == 128 and length_bucket(129) == 256 and length_bucket(256) == 256


def test_calls_with_autograd_run_sdpa_untimed():
    target = make_target("llama")
    with few_query_attention():
        target(input_ids=random_prompt(6)).logits.sum().backward()
    assert not attention_kernels._trials and not attention_kernels._warmups


@pytest.mark.parametrize("kernel", KERNELS)
def test_greedy_stays_plain_generate_with_each_kernel(family, kernel, kernels_run):
    assert_greedy_is_plain_generate(family, forced_attention(kernel))
    assert set(kernels_run) == {kernel}  # every verification forward went through it


@pytest.mark.parametrize("kernel", KERNELS)
def test_batched_greedy_stays_plain_generate_with_each_kernel(kernel, kernels_run):
    assert_batched_greedy_is_plain_generate(forced_attention(kernel))
    assert set(kernels_run) == {kernel}
