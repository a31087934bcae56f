"""Every touch of transformers internals lives here (tested against transformers>=5.23,<5.24).

Each private or version-sensitive access is one small named function below, and each has a test
in ``tests/test_compat.py`` that exercises the real attribute on a tiny real model or cache and
fails with a message naming the attribute when a transformers upgrade changes it:

- ``DynamicCache.layers[i].keys/.values`` (and ``.is_initialized``) are read and reassigned to
  compact the cache (:func:`cache_layers_kv`, :func:`set_layer_kv`, :func:`crop_cache_layers`).
- A ``DynamicCache``'s ``layer_class_to_replicate`` (the layer its ``update`` appends) is set to
  :class:`PreallocatedLayer`, a ``DynamicLayer`` that keeps ``keys``/``values`` as views into buffers with room
  to grow (:func:`full_dynamic_cache`).
- ``DynamicCache.crop(n)`` with a negative ``n`` removes ``-n`` positions (:func:`crop_cache`).
- ``StaticCache`` layers' private ``cumulative_length`` counter is set, for tree verification on a static cache
  (:func:`set_static_cache_length`); their ``keys``/``values`` are read through :func:`cache_layers_kv`.
- ``config._attn_implementation`` is read (the tree path needs an implementation that takes an
  arbitrary 4D mask, :func:`check_tree_mask_attention`) and set on drafter layer configs
  (:func:`attn_implementation`, :func:`set_attn_implementation`).
- A target's attention window is read from its config's ``sliding_window``, ``layer_types`` and Qwen2's
  ``use_sliding_window`` (:func:`target_sliding_window`).
- ``config._name_or_path`` is read as a model's name and set on packaged models
  (:func:`model_name_or_path`, :func:`set_model_name_or_path`).
- ``generation_config._pad_token_tensor``, the pad token ``generate()`` prepared
  (:func:`pad_token_tensor`).
- A GGUF-loaded model's ``hf_quantizer`` / ``is_quantized`` are cleared before saving its
  dequantized weights (:func:`drop_quantizer`).
- Two logits processors' per-row state (``RepetitionPenaltyLogitsProcessor.prompt_ignore_length``,
  ``PrefixConstrainedLogitsProcessor._prefix_allowed_tokens_fn``) is re-indexed for one batch row
  (:func:`row_logits_processor`).
- transformers' SDPA attention repeats grouped key/value heads whenever a mask is passed, unless its
  ``TRANSFORMERS_SDPA_FORCE_GQA`` environment switch is set; hf-spec sets it on CPUs for the duration of its
  own decoding (:func:`tree_attention`, which also keeps torch's cuDNN SDPA backend off on CUDA).
- ``GenerationMixin.generate`` is wrapped in :mod:`hf_spec.generation` (``install``/``uninstall``;
  public names only), and its ``custom_generate=callable`` hook runs our decoding loop inside
  transformers' own argument preparation: the loop is called as
  ``loop(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs)``.

Private torch CPU operators live here too, the ones torch's own compiler uses for frozen linear layers
(:func:`pack_linear_weight`, :func:`packed_linear`): a weight packed once (float32 with MKL: MKL's packed sgemm; else
oneDNN's blocked layout), then multiplied without the packing ``F.linear`` repeats on every call.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

SUPPORTED_TRANSFORMERS = ">=5.23,<5.24"


class PreallocatedLayer(DynamicLayer):
    """A ``DynamicLayer`` that appends in place instead of concatenating.

    ``keys`` and ``values`` are views of the first positions of two buffers with room to grow, so a step copies
    only its new positions: ``DynamicLayer.update`` copies the whole layer (``torch.cat``) on every forward, a cost
    that grows with the context (on a 2-core Xeon, SmolLM2-135M, a forward of 1-8 tokens on 1,500 cached positions
    gained 4-6 ms of 48-78 in float32 and 2-3 ms of 35-48 in bf16; on a few hundred, about 1 ms or less). A
    buffer holds twice the positions it needs when it is (re)allocated, at most ``capacity`` (when given, and
    enough), so a call that knows its ``max_length`` allocates once or twice. Whatever replaces ``keys``/``values``
    with other tensors (a batch row selection, a re-packing) is copied into a new buffer at the next update; cropping
    and in-place compaction keep the buffer.
    """

    def __init__(self, capacity: int | None = None):
        super().__init__()
        self.capacity = capacity
        self._key_buffer = self._value_buffer = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        if not (self._in_buffer(self.keys, self._key_buffer, key_states, length, end)
                and self._in_buffer(self.values, self._value_buffer, value_states, length, end)):  # fmt: skip
            self._reallocate(length, end, key_states, value_states)
        self._key_buffer[..., length:end, :] = key_states
        self._value_buffer[..., length:end, :] = value_states
        self.keys = self._key_buffer[..., :end, :]
        self.values = self._value_buffer[..., :end, :]
        return self.keys, self.values

    @staticmethod
    def _in_buffer(held, buffer, new, length: int, end: int) -> bool:
        """Whether ``held`` is the first ``length`` positions of ``buffer``, which has room up to ``end`` for
        ``new``."""
        if buffer is None or end > buffer.shape[-2]:
            return False
        if buffer.shape[:2] != new.shape[:2] or buffer.shape[-1] != new.shape[-1]:
            return False
        if buffer.dtype != new.dtype or buffer.device != new.device:
            return False
        return length == 0 or (held.data_ptr() == buffer.data_ptr() and held.stride() == buffer.stride())

    def _reallocate(self, length: int, end: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        size = 2 * end if self.capacity is None or self.capacity < end else min(2 * end, self.capacity)
        buffers = []
        for held, new in ((self.keys, key_states), (self.values, value_states)):
            buffer = new.new_empty((*new.shape[:-2], size, new.shape[-1]))
            if length:
                buffer[..., :length, :] = held
            buffers.append(buffer)
        self._key_buffer, self._value_buffer = buffers

    def reset(self) -> None:
        super().reset()
        self._key_buffer = self._value_buffer = None


def full_dynamic_cache(capacity: int | None = None) -> DynamicCache:
    """A DynamicCache whose layers keep every position, appended in place (:class:`PreallocatedLayer`).

    ``capacity``: the positions a layer will hold at most (the call's ``max_length`` and a tree's nodes), a bound
    on what its buffers allocate ahead; ``None``: they double as needed. Built without a config on purpose:
    sliding-window layers drop old positions, while the tree path indexes the cache by absolute position and
    applies any sliding window in its attention masks instead.
    """
    cache = DynamicCache()
    cache.layer_class_to_replicate = functools.partial(PreallocatedLayer, capacity)
    return cache


def cache_layers_kv(cache: DynamicCache):
    """Yield (layer, keys, values) for every initialised layer of a DynamicCache (or a StaticCache)."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", True) and layer.keys is not None and layer.keys.numel():
            yield layer, layer.keys, layer.values


def set_layer_kv(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
    layer.keys = keys
    layer.values = values


def crop_cache_layers(cache: DynamicCache, layer_indices, length: int) -> None:
    """Keep the first ``length`` positions of the given layers only (layers may differ in length)."""
    for index in layer_indices:
        if index >= len(cache.layers):
            continue
        layer = cache.layers[index]
        if not getattr(layer, "is_initialized", True) or layer.keys is None or layer.keys.numel() == 0:
            continue
        if layer.keys.shape[-2] > length:
            set_layer_kv(layer, layer.keys[..., :length, :], layer.values[..., :length, :])


def set_static_cache_length(cache, length: int) -> None:
    """Set how many positions every layer of a transformers ``StaticCache`` holds: the next forward writes its
    keys and values from slot ``length`` on. Writes the layers' private ``cumulative_length`` counters in place
    (a tensor on the cache's device, so a compiled forward keeps its address and no host sync happens)."""
    for layer in cache.layers:
        layer.cumulative_length.fill_(length)


def attn_implementation(config) -> str | None:
    """The attention implementation a model (config) runs with: transformers' private ``config._attn_implementation``."""
    return getattr(config, "_attn_implementation", None)


def set_attn_implementation(config, implementation: str) -> None:
    """Set ``config._attn_implementation`` (the private attribute a model's attention layers read at call time)."""
    config._attn_implementation = implementation


TREE_MASK_ATTENTION = ("sdpa", "eager")
"""Attention implementations that take an arbitrary additive 4D mask (the draft tree's)."""


def check_tree_mask_attention(model) -> None:
    """ValueError unless ``model`` attends with an implementation that takes a 4D tree mask.

    flash-attention (and the other kernels transformers dispatches to by name) only know causal
    or sliding-window masks, so a verified tree would silently attend to the wrong tokens.
    """
    config = getattr(model, "config", model)
    configs = [config]
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is not config:
        configs.append(text)
    for cfg in configs:
        implementation = attn_implementation(cfg)
        if implementation is not None and implementation not in TREE_MASK_ATTENTION:
            raise ValueError(
                f"The target attends with attn_implementation={implementation!r}, which cannot take the draft "
                "tree's 4D attention mask, so tree verification would be wrong. Fix: load the target with "
                'attn_implementation="sdpa" (or "eager"), e.g. AutoModelForCausalLM.from_pretrained(name, '
                'attn_implementation="sdpa"), or call model.set_attn_implementation("sdpa").'
            )


def target_sliding_window(config) -> int | None:
    """The target's attention window if all its layers use one, None if none do (reads the config's
    ``sliding_window``, ``layer_types`` and Qwen2's ``use_sliding_window``)."""
    config = config.get_text_config()
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    if layer_types is not None and any(t != "sliding_attention" for t in layer_types):
        raise ValueError(
            "Targets that mix sliding-window and full-attention layers are not supported by tree verification yet. "
            "Fix: use plain generate() or transformers' assisted decoding for this model."
        )
    if getattr(config, "model_type", None) == "qwen2" and not getattr(config, "use_sliding_window", False):
        return None
    return int(window)


def model_name_or_path(config) -> str | None:
    """The name or path a model (config) was loaded from: transformers' private ``config._name_or_path``."""
    return getattr(config, "_name_or_path", None)


def set_model_name_or_path(config, name: str) -> None:
    """Record ``name`` as the model's name (``config._name_or_path``), e.g. a packaged name instead of a cache path."""
    config._name_or_path = name


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Drop every cached position from ``length`` on (``DynamicCache.crop``: a negative count removes that many)."""
    excess = cache.get_seq_length() - length
    if excess > 0:
        cache.crop(-excess)


def drop_quantizer(model) -> None:
    """Forget a GGUF-loaded model's quantizer (``model.hf_quantizer``, which ``save_pretrained`` refuses,
    and ``config.quantization_config``) so it saves its already dequantized weights. (``is_quantized``
    is not a model attribute in transformers 5.23; it is still cleared as older versions had it.)"""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def pad_token_tensor(generation_config):
    """The pad token ``generate()`` prepared (it falls back to the first EOS id), or None."""
    return getattr(generation_config, "_pad_token_tensor", None)


def row_logits_processor(processors, row: int):
    """A copy of a batch's ``LogitsProcessorList`` for batch row ``row`` called with that row alone.

    Processors are row-wise, but two of transformers' own carry per-row state indexed by the
    row's place in the batch: ``RepetitionPenaltyLogitsProcessor.prompt_ignore_length`` (a
    tensor of left-padding lengths) and ``PrefixConstrainedLogitsProcessor`` (calls its
    function with the batch id). Those are copied with the row's entry; the rest are shared.
    """
    from transformers import LogitsProcessorList
    from transformers.generation.logits_process import (
        PrefixConstrainedLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
    )

    out = LogitsProcessorList()
    for processor in processors:
        if isinstance(processor, RepetitionPenaltyLogitsProcessor) and isinstance(
            processor.prompt_ignore_length, torch.Tensor
        ):
            processor = copy.copy(processor)
            processor.prompt_ignore_length = int(processor.prompt_ignore_length[row])
        elif isinstance(processor, PrefixConstrainedLogitsProcessor):
            processor = copy.copy(processor)
            allowed = processor._prefix_allowed_tokens_fn
            processor._prefix_allowed_tokens_fn = lambda batch_id, sent, allowed=allowed: allowed(row, sent)
        out.append(processor)
    return out


SDPA_FORCE_GQA = "TRANSFORMERS_SDPA_FORCE_GQA"
"""transformers' switch (read by ``transformers.integrations.sdpa_attention.use_gqa_in_sdpa`` at every attention
call) that passes grouped key/value heads to torch's SDPA with ``enable_gqa`` even when a mask is given."""


@contextlib.contextmanager
def tree_attention(device: torch.device):
    """The attention settings hf-spec's decoding runs its target and drafter forwards in (process-wide for the
    block's duration, restored after); they change speed only, never a result.

    - On a CPU, transformers' SDPA attention hands grouped-query key/value heads to torch unrepeated even with an
      attention mask. Tree verification always passes a 4D mask, and with a mask transformers first repeats the
      key/value heads (``repeat_kv``): a copy of the whole cache, twice per layer per forward, which on a CPU costs
      more than the attention itself (SmolLM2-135M bf16, 1,024 cached tokens: 7 of 47 ms per 2-token
      verification), while torch's CPU flash kernel takes masked GQA directly. Not where the user set the switch.
    - On CUDA, torch's cuDNN SDPA backend is switched off: it builds an execution plan for every new (query,
      key) length, and a tree loop's lengths are new almost every forward. Measured on an H200 (torch 2.11, an
      8B layer's shape, 7 tree tokens, masked): 108 ms per call at a new key length against 0.07 ms repeated,
      while the memory-efficient kernel took 0.075 ms either way; Llama-3.2-1B's hf-spec decoding on fresh
      shapes ran 10.6 tok/s with it, 106 without.
    """
    device = torch.device(device)
    with contextlib.ExitStack() as stack:
        if device.type == "cpu" and SDPA_FORCE_GQA not in os.environ:
            os.environ[SDPA_FORCE_GQA] = "1"
            stack.callback(os.environ.pop, SDPA_FORCE_GQA, None)
        if device.type == "cuda" and torch.backends.cuda.cudnn_sdp_enabled():
            torch.backends.cuda.enable_cudnn_sdp(False)
            stack.callback(torch.backends.cuda.enable_cudnn_sdp, True)
        yield


@functools.cache
def _mkl_packs(dtype: torch.dtype) -> bool:
    """Whether :func:`pack_linear_weight` packs weights of ``dtype`` for MKL's packed sgemm (float32, where this torch
    has MKL: what torch's inductor does when it freezes a float32 linear layer) rather than for oneDNN."""
    if dtype != torch.float32 or not torch._C.has_mkl:
        return False
    try:
        return torch.ops.mkl._mkl_linear is not None and torch.ops.mkl._mkl_reorder_linear_weight is not None
    except (AttributeError, RuntimeError):
        return False


MKL_PACK_ROWS = 4
"""The row count MKL's packing is told to expect (the packed layout is the same for any; the product passes its own)."""


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (N, K) of a CPU linear layer packed once, as torch's inductor freezes linear layers: a copy, for
    :func:`packed_linear`. float32 where this torch has MKL: MKL's packed sgemm layout
    (``torch.ops.mkl._mkl_reorder_linear_weight``; ``F.linear`` of 4 or more rows packs the weight on every call);
    else oneDNN's blocked layout (``torch.ops.mkldnn._reorder_linear_weight``; in bf16 ``F.linear`` reorders on every
    call). Raises RuntimeError where this torch build or dtype has neither."""
    if _mkl_packs(weight.dtype):
        return torch.ops.mkl._mkl_reorder_linear_weight(weight.detach(), MKL_PACK_ROWS)
    try:
        reorder = torch.ops.mkldnn._reorder_linear_weight
    except (AttributeError, RuntimeError) as error:
        raise RuntimeError(f"this torch build has no oneDNN weight reorder ({error})") from error
    return reorder(weight.detach(), 1)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor,
                  bias: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
    """``F.linear(x, weight, bias)`` with ``packed`` = :func:`pack_linear_weight` (``weight``) (any leading dims of a
    contiguous ``x``): ``torch.ops.mkl._mkl_linear`` or ``torch.ops.mkldnn._linear_pointwise``, as it was packed."""
    if not _mkl_packs(weight.dtype):
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    rows = x.numel() // x.shape[-1]  # MKL's packed product runs when told the real row count (else F.linear)
    out = torch.ops.mkl._mkl_linear(x.reshape(rows, x.shape[-1]), packed, weight, bias, rows)
    return out.view(*x.shape[:-1], weight.shape[0])


def tensor_version(tensor: torch.Tensor) -> int:
    """torch's in-place modification counter of ``tensor`` (``_version``): a cached copy made from it is stale once
    this moved. -1 for a tensor made under ``torch.inference_mode()``, which keeps no counter (outside that mode it
    cannot be changed in place)."""
    return -1 if tensor.is_inference() else tensor._version
