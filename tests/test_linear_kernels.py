"""Few-row linear layers (:mod:`hf_spec.linear_kernels`): both kernels compute ``F.linear``; the choice is measured
in place and kept per row count; the block restores every layer; and hf-spec's greedy output stays plain
``generate()``'s with either kernel forced, one prompt and a left-padded batch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hf_spec
from conftest import make_target, oracle_pair, plain_generate, random_prompt
from hf_spec import linear_kernels
from hf_spec.linear_kernels import few_row_linears, forced_kernel, kernel_choices
from test_batched import pad_left, per_row_expected, prompts_of


@pytest.fixture(autouse=True)
def fresh_choices(monkeypatch):
    """Each test measures from scratch (the process's tables would otherwise carry choices across tests)."""
    monkeypatch.setattr(linear_kernels, "_tables", {})
    monkeypatch.setattr(linear_kernels, "_trials", {})


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("shape", [(1, 48), (3, 48), (2, 5, 48), (1, 1, 48)])
def test_both_kernels_compute_f_linear(transposed, shape):
    torch.manual_seed(0)
    layer = nn.Linear(48, 80, bias=True)
    x = torch.randn(*shape)
    with torch.no_grad(), few_row_linears(layer), forced_kernel(transposed):
        out = layer(x)
    assert out.shape == (*shape[:-1], 80) and out.is_contiguous()
    torch.testing.assert_close(out, nn.functional.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_the_choice_is_measured_per_row_count_then_kept_and_the_block_restores_every_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64, bias=False), nn.Linear(64, 32, bias=False))
    with torch.no_grad(), few_row_linears(model):
        assert all("forward" in layer.__dict__ for layer in model)
        for _ in range(linear_kernels.WARMUP_CALLS + linear_kernels.TRIAL_CALLS):  # every call feeds both layers' trials
            model(torch.randn(1, 32))
        model(torch.randn(40, 32))  # above MAX_ROWS: F.linear, nothing measured
        choices = kernel_choices()
    assert set(choices) == {"64x32 float32 1 threads 1 rows", "32x64 float32 1 threads 1 rows"}
    assert set(choices.values()) <= {"transposed", "F.linear"} and not linear_kernels._trials
    assert not any("forward" in layer.__dict__ for layer in model)


def test_calls_with_autograd_and_layers_patched_by_someone_else_keep_f_linear():
    torch.manual_seed(0)
    hooked, plain = nn.Linear(16, 16), nn.Linear(16, 16)
    own_forward = hooked.forward
    hooked.forward = own_forward  # e.g. an accelerate hook's replacement
    x = torch.randn(1, 16, requires_grad=True)
    with few_row_linears(hooked, plain):
        assert hooked.__dict__["forward"] is own_forward
        out = plain(x)
        out.sum().backward()
    assert x.grad is not None and not linear_kernels._trials  # a training call is never timed nor rerouted
    assert hooked.__dict__["forward"] is own_forward and "forward" not in plain.__dict__


@pytest.mark.parametrize("transposed", [False, True])
def test_greedy_stays_plain_generate_with_either_kernel(family, transposed):
    target, drafter = oracle_pair(family)
    prompt = random_prompt(12)
    expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    with forced_kernel(transposed):
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=40, do_sample=False)
    assert torch.equal(out, expected)
    assert drafter.last_generation_stats.tau > 1.5  # the drafts were verified, not skipped


@pytest.mark.parametrize("transposed", [False, True])
def test_batched_greedy_stays_plain_generate_with_either_kernel(transposed):
    target, drafter = oracle_pair("llama")
    prompts = prompts_of()
    input_ids, attention_mask = pad_left(prompts)
    with forced_kernel(transposed):
        out = target.generate(input_ids, attention_mask=attention_mask, assistant_model=drafter, max_new_tokens=24,
                              do_sample=False)  # fmt: skip
    assert torch.equal(out, per_row_expected(target, prompts, max_new_tokens=24, do_sample=False))


def test_plain_generate_inside_the_block_gives_the_same_text():
    target = make_target("qwen2")  # q/k/v biases
    prompt = random_prompt(10)
    expected = plain_generate(target, prompt, max_new_tokens=30, do_sample=False)
    with few_row_linears(target), forced_kernel(True):
        assert "forward" in target.lm_head.__dict__
        out = plain_generate(target, prompt, max_new_tokens=30, do_sample=False)
    assert torch.equal(out, expected)
    assert hf_spec.few_row_linears is few_row_linears
