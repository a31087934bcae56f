"""One test per transformers internal that hf_spec.compat touches (see its module docstring).

Each exercises the real attribute on a tiny real model or cache, not a mock, and fails with a
message naming the transformers attribute, so a transformers upgrade that changes one is caught
here first (and fixed in hf_spec/compat.py only).
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from transformers import DynamicCache, LogitsProcessorList
from transformers.generation.logits_process import (
    PrefixConstrainedLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
)

import hf_spec
from conftest import make_target, plain_generate, random_prompt
from hf_spec import compat, timing


def _filled_cache(length: int = 10):
    target = make_target("llama")
    cache = DynamicCache()
    with torch.no_grad():
        target(input_ids=random_prompt(length), past_key_values=cache, use_cache=True)
    return target, cache


def test_dynamic_cache_layers_keys_values():
    _, cache = _filled_cache(10)
    assert hasattr(cache, "layers"), "transformers changed DynamicCache: no `.layers` (compat.cache_layers_kv)"
    found = list(compat.cache_layers_kv(cache))
    assert len(found) == 2, "DynamicCache.layers[i].keys/.values/.is_initialized changed (compat.cache_layers_kv)"
    for layer, keys, values in found:
        assert keys.shape[-2] == 10 and values.shape[-2] == 10, (
            "DynamicCache.layers[i].keys/.values are no longer (batch, heads, positions, head_dim)"
        )
        compat.set_layer_kv(layer, keys[..., :7, :], values[..., :7, :])
    assert cache.get_seq_length() == 7, (
        "Reassigning DynamicCache.layers[i].keys/.values no longer changes the cache (compat.set_layer_kv)"
    )


def test_dynamic_cache_crop_negative_count():
    _, cache = _filled_cache(10)
    compat.crop_cache(cache, 6)
    assert cache.get_seq_length() == 6, "DynamicCache.crop(-n) no longer removes n positions (compat.crop_cache)"
    assert all(k.shape[-2] == 6 for _, k, _ in compat.cache_layers_kv(cache))
    compat.crop_cache(cache, 8)  # longer than the cache: nothing to do
    assert cache.get_seq_length() == 6


def _same_layers(a, b):
    for (_, ka, va), (_, kb, vb) in zip(compat.cache_layers_kv(a), compat.cache_layers_kv(b), strict=True):
        torch.testing.assert_close(ka, kb, rtol=0, atol=0)
        torch.testing.assert_close(va, vb, rtol=0, atol=0)


def test_preallocated_cache_holds_what_a_dynamic_cache_holds_and_appends_in_place():
    """The target's cache (full_dynamic_cache: DynamicCache.layer_class_to_replicate set to PreallocatedLayer)
    holds, after every forward, crop and compaction the decoding loop makes, exactly what transformers' own
    DynamicCache holds; and a forward within the buffer's room appends without moving the layer."""
    from hf_spec.cache import gather_positions, keep_accepted, select_rows

    target = make_target("llama")
    ours, theirs = compat.full_dynamic_cache(capacity=64), DynamicCache()
    assert all(isinstance(layer, compat.PreallocatedLayer) for layer in ours.layers) and not ours.layers

    def forward(ids):
        with torch.no_grad():
            for cache in (ours, theirs):
                target(input_ids=ids, past_key_values=cache, use_cache=True,
                       position_ids=torch.arange(cache.get_seq_length(), cache.get_seq_length() + ids.shape[1])
                       .expand(ids.shape[0], -1))  # fmt: skip
        _same_layers(ours, theirs)

    forward(random_prompt(10).repeat(2, 1))
    assert all(isinstance(layer, compat.PreallocatedLayer) for layer in ours.layers), (
        "DynamicCache.update no longer appends layer_class_to_replicate() (compat.full_dynamic_cache)")
    addresses = [keys.data_ptr() for _, keys, _ in compat.cache_layers_kv(ours)]
    forward(random_prompt(4).repeat(2, 1))
    for cache in (ours, theirs):
        keep_accepted(cache, 10, torch.tensor([0, 2, 3]))  # a non-contiguous path: moved down in place
    _same_layers(ours, theirs)
    forward(random_prompt(1).repeat(2, 1))
    for cache in (ours, theirs):
        compat.crop_cache(cache, 12)
    forward(random_prompt(3).repeat(2, 1))
    assert [keys.data_ptr() for _, keys, _ in compat.cache_layers_kv(ours)] == addresses, "appending moved a layer"
    for cache in (ours, theirs):
        gather_positions(cache, 5, torch.tensor([[7, 9], [6, 11]]))
    forward(random_prompt(2).repeat(2, 1))
    for cache in (ours, theirs):
        select_rows(cache, torch.tensor([1]))  # new tensors: the next forward copies them into a new buffer
    forward(random_prompt(60))  # beyond the capacity hint: the buffer grows
    assert ours.get_seq_length() == theirs.get_seq_length() == 69


def test_keeping_every_verified_node_leaves_the_cache_untouched():
    """A plain step or a wholly accepted chain: keep_accepted has nothing to drop and touches no layer; one node
    fewer is cropped."""
    from hf_spec.cache import keep_accepted

    cache = compat.full_dynamic_cache(capacity=64)
    with torch.no_grad():
        make_target("llama")(input_ids=random_prompt(10), past_key_values=cache, use_cache=True)
    before = [(keys, values) for _, keys, values in compat.cache_layers_kv(cache)]
    keep_accepted(cache, 7, torch.tensor([0, 1, 2]), contiguous=True)
    assert cache.get_seq_length() == 10
    assert all(keys is k and values is v for (_, keys, values), (k, v) in zip(compat.cache_layers_kv(cache), before))
    keep_accepted(cache, 7, torch.tensor([0, 1]), contiguous=True)
    assert cache.get_seq_length() == 9


def test_preallocated_layer_allocates_ahead_at_most_its_capacity():
    layer = compat.PreallocatedLayer(capacity=40)
    keys = torch.randn(1, 2, 16, 8)
    layer.update(keys, keys.clone())
    assert layer._key_buffer.shape[-2] == 32  # twice what it needs, within the capacity
    layer.update(torch.randn(1, 2, 20, 8), torch.randn(1, 2, 20, 8))
    assert layer._key_buffer.shape[-2] == 40 and layer.get_seq_length() == 36
    layer.update(torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8))  # past the capacity: doubles
    assert layer._key_buffer.shape[-2] == 92 and torch.equal(layer.keys[..., :16, :], keys)


def test_crop_cache_layers_crops_only_the_given_layers():
    _, cache = _filled_cache(10)
    compat.crop_cache_layers(cache, [1, 5], 4)  # layer 5 does not exist: skipped
    lengths = [k.shape[-2] for _, k, _ in compat.cache_layers_kv(cache)]
    assert lengths == [10, 4], f"DynamicCache.layers[i] per-layer crop changed (compat.crop_cache_layers): {lengths}"


def test_attn_implementation_is_read_and_set_on_the_config():
    target = make_target("llama")
    implementation = compat.attn_implementation(target.config)
    assert implementation in ("sdpa", "eager"), (
        f"config._attn_implementation of a default tiny model is {implementation!r} (compat.attn_implementation)"
    )
    prompt = random_prompt()
    with torch.no_grad():
        before = target(prompt).logits
        compat.set_attn_implementation(target.config, "eager")
        assert target.model.layers[0].self_attn.config._attn_implementation == "eager", (
            "Setting config._attn_implementation no longer reaches the attention layers (compat.set_attn_implementation)"
        )
        after = target(prompt).logits
    torch.testing.assert_close(before, after, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("implementation", ["flash_attention_2", "flex_attention"])
def test_tree_mask_incapable_attention_is_rejected_before_any_work(implementation):
    target = make_target("llama")
    drafter = hf_spec.EagleDrafter.from_target(target)
    compat.set_attn_implementation(target.config, implementation)
    forwards = []
    hook = target.register_forward_pre_hook(lambda *args: forwards.append(1))
    try:
        with pytest.raises(ValueError, match=r'attn_implementation=.*sdpa.*eager') as info:
            target.generate(random_prompt(), assistant_model=drafter, max_new_tokens=5, do_sample=False)
    finally:
        hook.remove()
    assert implementation in str(info.value)
    assert not forwards, "the attention check must run before any forward"


def test_target_sliding_window_reads_the_config():
    from transformers import MistralConfig, Qwen2Config

    assert compat.target_sliding_window(make_target("llama").config) is None
    assert compat.target_sliding_window(MistralConfig(sliding_window=8)) == 8, (
        "MistralConfig.sliding_window / layer_types changed (compat.target_sliding_window)"
    )
    assert compat.target_sliding_window(MistralConfig(sliding_window=None)) is None
    assert compat.target_sliding_window(Qwen2Config(sliding_window=8, use_sliding_window=False)) is None


def test_name_or_path(tmp_path):
    target = make_target("llama")
    target.save_pretrained(tmp_path)
    loaded = type(target).from_pretrained(tmp_path)
    assert compat.model_name_or_path(loaded.config) == str(tmp_path), (
        "config._name_or_path no longer holds the path a model was loaded from (compat.model_name_or_path)"
    )
    compat.set_model_name_or_path(loaded.config, "packaged-name")
    assert loaded.config.name_or_path == "packaged-name", (
        "config._name_or_path is no longer what config.name_or_path reads (compat.set_model_name_or_path)"
    )


def test_custom_generate_hook_and_pad_token_tensor():
    """``generate(custom_generate=callable)`` calls it with the prepared arguments, and the generation
    config it passes carries ``_pad_token_tensor`` (compat.pad_token_tensor)."""
    target = make_target("llama")
    seen = {}

    def loop(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
        seen.update(model=model, input_ids=input_ids, processors=logits_processor, criteria=stopping_criteria,
                     pad=compat.pad_token_tensor(generation_config))  # fmt: skip
        return input_ids

    prompt = random_prompt()
    out = plain_generate(target, prompt, max_new_tokens=3, do_sample=False, pad_token_id=5, custom_generate=loop)
    assert seen, "GenerationMixin.generate(custom_generate=callable) no longer calls the callable"
    assert seen["model"] is target and torch.equal(seen["input_ids"], prompt) and torch.equal(out, prompt)
    assert isinstance(seen["processors"], LogitsProcessorList), "custom_generate's logits_processor argument changed"
    assert hasattr(seen["criteria"], "max_length"), "custom_generate's stopping_criteria argument changed"
    assert isinstance(seen["pad"], torch.Tensor) and int(seen["pad"]) == 5, (
        "generation_config._pad_token_tensor is no longer prepared by generate() (compat.pad_token_tensor)"
    )


def test_drop_quantizer_lets_a_gguf_loaded_model_save(tmp_path):
    """A GGUF-loaded model carries a ``GgufHfQuantizer`` as ``model.hf_quantizer`` (and the config a
    ``quantization_config``), which ``save_pretrained`` refuses; compat.drop_quantizer removes them."""
    from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING, AUTO_QUANTIZATION_CONFIG_MAPPING

    target = make_target("llama")
    quant_config = AUTO_QUANTIZATION_CONFIG_MAPPING["gguf"](gguf_file="model.gguf")
    target.hf_quantizer = AUTO_QUANTIZER_MAPPING["gguf"](quant_config)
    target.config.quantization_config = quant_config
    with pytest.raises(ValueError, match="not serializable"):  # else save_pretrained no longer reads hf_quantizer
        target.save_pretrained(tmp_path / "refused")
    compat.drop_quantizer(target)
    assert target.hf_quantizer is None and not hasattr(target.config, "quantization_config")
    target.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "config.json").is_file()


def test_row_logits_processor_reindexes_per_row_state():
    penalty = RepetitionPenaltyLogitsProcessor(1.5, prompt_ignore_length=torch.tensor([2, 3]))
    calls = []
    prefix = PrefixConstrainedLogitsProcessor(lambda batch_id, sent: calls.append(batch_id) or [1, 2], num_beams=1)
    assert hasattr(prefix, "_prefix_allowed_tokens_fn"), (
        "PrefixConstrainedLogitsProcessor._prefix_allowed_tokens_fn is gone (compat.row_logits_processor)"
    )
    assert isinstance(penalty.prompt_ignore_length, torch.Tensor), (
        "RepetitionPenaltyLogitsProcessor.prompt_ignore_length no longer keeps the per-row tensor"
    )
    row = compat.row_logits_processor(LogitsProcessorList([penalty, prefix]), 1)
    assert row[0].prompt_ignore_length == 3 and torch.equal(penalty.prompt_ignore_length, torch.tensor([2, 3]))
    scores = row(torch.tensor([[4, 5, 6, 7]]), torch.zeros(1, 10))
    assert calls == [1], f"PrefixConstrainedLogitsProcessor no longer calls its function per batch id: {calls}"
    assert torch.isinf(scores[0, 3:]).all() and not torch.isinf(scores[0, 1:3]).any()


def test_clock_synchronizes_only_on_cuda(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    timing.clock(torch.device("cpu"))
    timing.clock(None)
    assert synced == []
    timing.clock(torch.device("cuda", 0))
    assert synced == [torch.device("cuda", 0)]


def test_stopwatch_totals_regions_and_syncs_only_when_read_on_cuda(monkeypatch):
    """On a CPU a Stopwatch adds perf_counter durations; on CUDA it records an event pair per region and waits
    once, for the last event, when its total is read (no torch.cuda.synchronize per region)."""
    cpu = timing.Stopwatch(torch.device("cpu"))
    for _ in range(2):
        with cpu():
            time.sleep(0.01)
    assert 0.02 <= cpu.seconds < 0.5

    waited, synced = [], []

    class FakeEvent:
        clock = 0.0

        def __init__(self, enable_timing=False):
            assert enable_timing
            self.at = None

        def record(self):
            FakeEvent.clock += 5.0  # each record is 5 ms after the one before
            self.at = FakeEvent.clock

        def elapsed_time(self, end):
            return end.at - self.at

        def synchronize(self):
            waited.append(self.at)

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    cuda = timing.Stopwatch(torch.device("cuda", 0))
    for _ in range(3):
        with cuda():
            pass
    assert waited == [] and synced == []
    assert cuda.seconds == pytest.approx(3 * 0.005)
    assert waited == [30.0] and synced == []  # one wait, for the last region's end
    assert cuda.seconds == pytest.approx(0.015) and len(waited) == 1  # read again: nothing pending


@pytest.mark.cuda
def test_greedy_equality_on_cuda():
    target = make_target("llama").to("cuda")
    drafter = hf_spec.EagleDrafter.from_target(target).to("cuda")
    prompt = random_prompt().to("cuda")
    expected = plain_generate(target, prompt, max_new_tokens=32, do_sample=False)
    out = target.generate(prompt, assistant_model=drafter, max_new_tokens=32, do_sample=False,
                          tree_depth=4, tree_top_k=4, tree_total_tokens=16)  # fmt: skip
    assert torch.equal(out, expected)
    stats = drafter.last_generation_stats
    assert 0 < stats.target_forward_seconds <= stats.total_seconds


def test_tree_attention_passes_grouped_heads_unrepeated_on_cpu_and_changes_no_result(monkeypatch):
    """transformers' TRANSFORMERS_SDPA_FORCE_GQA switch (read by sdpa_attention.use_gqa_in_sdpa) makes a masked
    SDPA call take grouped key/value heads as they are; a tree verification then gives the same logits."""
    from transformers.integrations import sdpa_attention

    monkeypatch.delenv(compat.SDPA_FORCE_GQA, raising=False)
    keys, mask = torch.zeros(1, 2, 5, 8), torch.zeros(1, 1, 3, 5)
    assert not sdpa_attention.use_gqa_in_sdpa(mask, keys, keys)
    target = make_target("llama")  # 4 heads, 2 key/value heads
    cache = DynamicCache()
    prompt, tree = random_prompt(12), hf_spec.DraftTree.chain(3, torch.tensor([5, 7, 9]))
    with torch.no_grad():
        target(input_ids=prompt, past_key_values=cache, use_cache=True)

        def verify():
            out = target(input_ids=tree.tokens.view(1, -1), attention_mask=tree.attention_mask(12, torch.float32, None),
                         position_ids=tree.position_ids(12), past_key_values=cache, use_cache=True).logits
            compat.crop_cache(cache, 12)
            return out

        repeated = verify()
        with compat.tree_attention(torch.device("cpu")):
            assert sdpa_attention.use_gqa_in_sdpa(mask, keys, keys), (
                "transformers no longer reads TRANSFORMERS_SDPA_FORCE_GQA in use_gqa_in_sdpa (compat.tree_attention)")
            assert torch.backends.cuda.cudnn_sdp_enabled()  # a CUDA-only setting, left alone on a CPU
            grouped = verify()
    assert compat.SDPA_FORCE_GQA not in os.environ  # restored
    torch.testing.assert_close(grouped, repeated, rtol=1e-5, atol=1e-5)
    with compat.tree_attention(torch.device("meta")):  # not a CPU (CUDA would fall back to the math kernel)
        assert compat.SDPA_FORCE_GQA not in os.environ


def test_tree_attention_keeps_cudnn_sdpa_off_on_cuda_and_restores_it():
    """On CUDA, torch's cuDNN SDPA backend builds a plan per new (query, key) length (108 ms per masked call at a
    new length on an H200, torch 2.11): off inside hf-spec's decoding, restored after, left off if the user
    turned it off. The flags are process-wide, so this runs without a GPU."""
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with compat.tree_attention(torch.device("cuda", 0)):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert compat.SDPA_FORCE_GQA not in os.environ  # the CPU switch stays off on CUDA
    assert torch.backends.cuda.cudnn_sdp_enabled()
    with pytest.raises(RuntimeError, match="inside"), compat.tree_attention("cuda"):
        raise RuntimeError("inside")
    assert torch.backends.cuda.cudnn_sdp_enabled()  # restored after an error too
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        with compat.tree_attention(torch.device("cuda")):
            pass
        assert not torch.backends.cuda.cudnn_sdp_enabled()  # the user's choice stands
    finally:
        torch.backends.cuda.enable_cudnn_sdp(True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_computes_f_linear_and_the_version_counts_in_place_changes(dtype):
    """torch's packing of a linear weight (MKL's for float32 where torch has MKL, else oneDNN's) and the product with
    it (private ops torch's compiler uses), for row counts on both sides of MKL's per-call packing (4 rows), and
    ``_version``, which tells the few-row kernels when a packed copy is stale."""
    torch.manual_seed(0)
    weight, bias = torch.randn(24, 16, dtype=dtype), torch.randn(24, dtype=dtype)
    try:
        packed = compat.pack_linear_weight(weight)
    except RuntimeError as error:
        pytest.skip(f"this torch build cannot pack weights: {error}")
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for shape in [(1, 16), (3, 16), (2, 3, 16), (1, 9, 16)]:
        x = torch.randn(*shape, dtype=dtype)
        out = compat.packed_linear(x, packed, weight, bias)
        assert out.shape == (*shape[:-1], 24)
        torch.testing.assert_close(out, torch.nn.functional.linear(x, weight, bias), rtol=tolerance, atol=tolerance)
    version = compat.tensor_version(weight)
    weight.add_(1.0)
    assert compat.tensor_version(weight) > version
    with torch.inference_mode():
        assert compat.tensor_version(torch.ones(2)) == -1  # no counter: not an error
