"""Few-row linear layers (:mod:`hf_spec.linear_kernels`): every kernel computes ``F.linear``; the choice is measured
in place and kept per row count; the block restores every layer; packed weight copies follow their weight, respect
the memory share and are dropped where no choice uses them; and hf-spec's greedy output stays plain
``generate()``'s with each kernel forced, one prompt and a left-padded batch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import hf_spec
from conftest import assert_greedy_is_plain_generate, make_target, plain_generate, random_prompt
from hf_spec import linear_kernels
from hf_spec.linear_kernels import KERNELS, chosen_kernel, few_row_linears, forced_kernel, kernel_choices
from test_batched import assert_batched_greedy_is_plain_generate


pytestmark = pytest.mark.usefixtures("fresh_kernel_choices")  # each test measures from scratch


def packs() -> bool:
    """Whether this torch build packs float32 weights (oneDNN); the ``packed`` kernel's own tests need it."""
    try:
        hf_spec.compat.pack_linear_weight(torch.ones(2, 2))
    except RuntimeError:
        return False
    return True


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", [(1, 48), (3, 48), (2, 5, 48), (1, 1, 48)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_kernel_computes_f_linear(kernel, shape, dtype):
    torch.manual_seed(0)
    layer = nn.Linear(48, 80, bias=True).to(dtype)
    x = torch.randn(*shape, dtype=dtype)
    with torch.no_grad(), few_row_linears(layer), forced_kernel(kernel):
        out = layer(x)
        strided = layer(torch.randn(*shape[:-1], 96, dtype=dtype)[..., ::2])  # a non-contiguous input
    assert out.shape == (*shape[:-1], 80) and out.is_contiguous() and out.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out, nn.functional.linear(x, layer.weight, layer.bias), rtol=tolerance, atol=tolerance)
    assert strided.shape == out.shape
    with pytest.raises(ValueError, match="kernel must be one of"):
        with forced_kernel(True):
            pass


@pytest.mark.skipif(not packs(), reason="this torch build cannot pack weights (no oneDNN)")
def test_a_packed_weight_follows_its_weight_and_is_dropped_where_no_choice_uses_it():
    torch.manual_seed(0)
    layer = nn.Linear(32, 64, bias=False)
    x = torch.randn(2, 32)
    with torch.no_grad(), few_row_linears(layer), forced_kernel("packed"):
        before = linear_kernels.weights_packed()
        first = layer(x)
        packed = linear_kernels._packed[layer][1]
        assert layer(x) is not None and linear_kernels._packed[layer][1] is packed  # made once, reused
        assert linear_kernels.weights_packed() == before + 1  # counted: decoding leaves such a forward's time out
        layer.weight.mul_(2.0)  # changed in place: the packed copy is stale
        torch.testing.assert_close(layer(x), 2.0 * first, rtol=1e-5, atol=1e-5)
        layer.weight = nn.Parameter(torch.randn(64, 32))  # replaced
        torch.testing.assert_close(layer(x), nn.functional.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
        assert linear_kernels.weights_packed() == before + 3  # packed again after each change
    assert layer not in linear_kernels._packed  # no shape chose `packed` (it was forced): the copy is released
    linear_kernels._tables[((64, 32), torch.float32, torch.get_num_threads())] = {2: "packed"}
    with torch.no_grad(), few_row_linears(layer):
        layer(x)
    assert linear_kernels._packed[layer][1] is not None  # chosen: kept for the next block


def test_calls_under_autocast_run_f_linear():
    torch.manual_seed(0)
    layer = nn.Linear(32, 48)
    x = torch.randn(2, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), few_row_linears(layer):
        expected = nn.functional.linear(x, layer.weight, layer.bias)
        for kernel in KERNELS:
            with forced_kernel(kernel):
                out = layer(x)
            assert out.dtype == expected.dtype == torch.bfloat16
            torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)


@pytest.mark.skipif(not packs(), reason="this torch build cannot pack weights (no oneDNN)")
def test_the_call_that_packs_a_weight_is_not_timed():
    """Packing reads the weight into a cache: the kernel timed right after would measure less than its cost."""
    layer = nn.Linear(32, 64, bias=False)
    key = (((64, 32), torch.float32, torch.get_num_threads()), 1)
    with torch.no_grad(), few_row_linears(layer):
        for _ in range(linear_kernels.WARMUP_CALLS + 1):
            layer(torch.randn(1, 32))
        assert linear_kernels._packed[layer][1] is not None and not any(linear_kernels._trials.get(key, {}).values())
        layer(torch.randn(1, 32))
        assert sum(map(len, linear_kernels._trials[key].values())) == 1


def test_a_row_count_warms_up_once_per_process_through_the_nearest_row_counts_choice(monkeypatch):
    """A large weight called once per forward (an LM head) would otherwise run its slowest kernel in the first calls of
    every block, for every row count not yet chosen."""
    torch.manual_seed(0)
    layer = nn.Linear(32, 64, bias=False)
    base = ((64, 32), torch.float32, torch.get_num_threads())
    linear_kernels._tables[base] = {1: "F.linear", 4: "transposed"}
    ran = []
    transposed = linear_kernels._transposed
    monkeypatch.setattr(linear_kernels, "_transposed", lambda x2, *rest: ran.append(len(x2)) or transposed(x2, *rest))
    x = torch.randn(3, 32)
    with torch.no_grad(), few_row_linears(layer):
        for _ in range(linear_kernels.WARMUP_CALLS):
            torch.testing.assert_close(layer(x), x @ layer.weight.t())
    assert ran == [3] * linear_kernels.WARMUP_CALLS and not linear_kernels._trials  # warm-ups on 4 rows' choice
    with torch.no_grad(), few_row_linears(layer):
        layer(x)
    assert (base, 3) in linear_kernels._trials  # the next block goes on with the trial: no second warm-up


def test_the_padded_product_pads_to_the_next_power_of_two_and_runs_only_where_it_pads(monkeypatch):
    """A BLAS works in blocks of rows: 3 rows can cost more than 4 (module docstring). The padded product multiplies
    the rows and zero rows up to the next power of two, and joins the trials of row counts it pads."""
    torch.manual_seed(0)
    layer = nn.Linear(32, 64, bias=True)
    multiplied = []
    monkeypatch.setattr(linear_kernels.torch, "mm", lambda a, b: multiplied.append(b.shape[1]) or a @ b)
    with torch.no_grad(), few_row_linears(layer):
        with forced_kernel("padded"):
            for rows in (1, 3, 4, 5, 9):
                x = torch.randn(rows, 32)
                torch.testing.assert_close(layer(x), nn.functional.linear(x, layer.weight, layer.bias))
        assert multiplied == [2, 4, 4, 8, 16]
        for _ in range(linear_kernels.WARMUP_CALLS + 2):
            layer(torch.randn(3, 32))
            layer(torch.randn(4, 32))
    base = ((64, 32), torch.float32, torch.get_num_threads())
    assert "padded" in linear_kernels._trials[(base, 3)] and "padded" not in linear_kernels._trials[(base, 4)]


def test_packing_stops_at_the_memory_share(monkeypatch):
    torch.manual_seed(0)
    small, large = nn.Linear(16, 16, bias=False), nn.Linear(16, 4096, bias=False)
    monkeypatch.setattr(linear_kernels, "_free_memory", lambda: 3 * 16 * 16 * 4)  # room for the small one only
    x = torch.randn(1, 16)
    with torch.no_grad(), few_row_linears(small, large), forced_kernel("packed"):
        torch.testing.assert_close(large(x), nn.functional.linear(x, large.weight), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(small(x), nn.functional.linear(x, small.weight), rtol=1e-5, atol=1e-5)
        assert linear_kernels._packed[large][1] is None  # refused, and not asked again while the weight is the same
        assert (linear_kernels._packed[small][1] is not None) == packs()


def test_the_choice_is_measured_per_row_count_then_kept_and_the_block_restores_every_layer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64, bias=False), nn.Linear(64, 32, bias=False))
    with torch.no_grad(), few_row_linears(model):
        assert all("forward" in layer.__dict__ for layer in model)
        for _ in range(linear_kernels.WARMUP_CALLS + 1 + linear_kernels.TRIAL_CALLS):  # + the untimed call that packs
            model(torch.randn(1, 32))
        model(torch.randn(40, 32))  # above MAX_ROWS: F.linear, nothing measured
        choices = kernel_choices()
    assert set(choices) == {"64x32 float32 1 threads 1 rows", "32x64 float32 1 threads 1 rows"}
    assert chosen_kernel(model[0], 1) == choices["64x32 float32 1 threads 1 rows"]
    assert chosen_kernel(model[0], 2) is None and chosen_kernel(model[0], 40) is None  # never on trial
    assert chosen_kernel(model, 1) is None  # not a linear layer
    assert set(choices.values()) <= set(KERNELS) and not linear_kernels._trials
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


@pytest.mark.parametrize("kernel", KERNELS)
def test_greedy_stays_plain_generate_with_each_kernel(family, kernel):
    assert_greedy_is_plain_generate(family, forced_kernel(kernel))


@pytest.mark.parametrize("kernel", KERNELS)
def test_batched_greedy_stays_plain_generate_with_each_kernel(kernel):
    assert_batched_greedy_is_plain_generate(forced_kernel(kernel))


def test_plain_generate_inside_the_block_gives_the_same_text():
    target = make_target("qwen2")  # q/k/v biases
    prompt = random_prompt(10)
    expected = plain_generate(target, prompt, max_new_tokens=30, do_sample=False)
    with few_row_linears(target), forced_kernel("packed"):
        assert "forward" in target.lm_head.__dict__
        out = plain_generate(target, prompt, max_new_tokens=30, do_sample=False)
    assert torch.equal(out, expected)
    assert hf_spec.few_row_linears is few_row_linears
