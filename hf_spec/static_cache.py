"""Tree verification on a preallocated static cache, with forward shapes from a few fixed sizes (opt-in).

``generate(..., assistant_model=drafter, cache_implementation="static")`` selects this layout for one unpadded
prompt, as the same option selects transformers' :class:`~transformers.StaticCache` for plain decoding. The target
verifies every tree in a :class:`~transformers.StaticCache` of ``max_length`` (rounded up) + the largest bucket
positions: the tree is padded to a power-of-two size (a *bucket*), the 4D mask spans the whole preallocated cache
and is built on the device, and after the walk the accepted nodes' keys and values move down in place to follow
the prefix (the padding's and rejected nodes' slots are masked out and overwritten by the next forward). So each
verification forward has one of a handful of shapes, and its tensors keep their addresses: what ``torch.compile``
needs to compile it once per bucket and, on CUDA with ``mode="reduce-overhead"``, to replay it as a CUDA graph.

Compilation follows transformers' own rule for static caches: the verification forward is compiled
(:meth:`~transformers.PreTrainedModel.get_compiled_call` with the generation config's ``compile_config``) on CUDA,
or anywhere a ``compile_config`` is passed, unless ``disable_compile=True``. The prefill runs eagerly. Where the
compiled call exists, each verification forward runs on the engine (eager or compiled) that the process's
:class:`~hf_spec.controller.EngineChooser` for this target measured faster for its bucket: both give the same logits,
and compiled is not always faster (on a CPU it often is not).

Lossless as the dynamic layout: the logits of a padded tree's real nodes are those of the unpadded tree (the
padding rows come after them and no real node attends to them), and the cache after a commit holds exactly the
prefix and the accepted path.
"""

from __future__ import annotations

import weakref

import torch
from transformers import CompileConfig, StaticCache

from . import compat, timing
from .cache import move_slots
from .controller import EngineChooser
from .tree.tree import DraftTree, additive_mask

__all__ = ["MAX_BUCKET", "StaticTreeCache", "bucket_size", "cache_length", "static_layout", "wants_static_cache"]

MAX_BUCKET = 256
"""The largest forward a static layout verifies (a tree of up to this many nodes, the root included); the cache
holds this many positions beyond the call's ``max_length``."""
LENGTH_STEP = 256
"""The cache's length is the call's ``max_length`` rounded up to a multiple of this (plus :data:`MAX_BUCKET`): the
mask's width is a compiled graph's shape, so calls of nearby lengths reuse one graph per bucket instead of
compiling again (and running into ``torch._dynamo``'s recompile limit)."""


def cache_length(max_length: int) -> int:
    """Positions a static layout preallocates for a call of ``max_length`` positions."""
    return -(-max_length // LENGTH_STEP) * LENGTH_STEP + MAX_BUCKET


def bucket_size(nodes: int) -> int:
    """The forward size a tree of ``nodes`` nodes is padded to: the next power of two (1, 2, 4, 8, ...)."""
    return 1 << max(nodes - 1, 0).bit_length()


def wants_static_cache(generation_config) -> bool:
    """Whether this call asked for a static cache (``cache_implementation="static"``)."""
    return getattr(generation_config, "cache_implementation", None) == "static"


def static_layout(model, generation_config, max_length: int | None, one_row: bool) -> StaticTreeCache:
    """The static layout for this call (``cache_implementation="static"``), compiled by transformers' rule; a
    ValueError naming the fix for what it cannot do."""
    if not one_row:
        raise ValueError("cache_implementation='static' with an hf-spec drafter supports one unpadded prompt. Fix: "
                         "call generate() once per prompt, or drop cache_implementation for batches.")
    if max_length is None:
        raise ValueError("cache_implementation='static' needs a length to preallocate. Fix: pass max_new_tokens.")
    compile_config = None
    if should_compile(generation_config, model.device):
        compile_config = getattr(generation_config, "compile_config", None) or CompileConfig()
    return StaticTreeCache(model, max_length, compile_config)


_compiled: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""base model -> (compile options, its compiled call, its engine choosers by (device, dtype, threads)): one
compilation per target and options for the process, and one choice of engine per machine setting."""


def compiled_call(base_model, compile_config) -> tuple[object, EngineChooser]:
    """``torch.compile`` of the base model's call with a transformers ``CompileConfig``'s options, kept for later
    calls with the same options (its compiled graphs, one per bucket, are reused across ``generate()`` calls), and
    the engine chooser of that call on the model's device, dtype and this process's thread count."""
    options = compile_config.to_dict()
    known = _compiled.get(base_model)
    if known is None or known[0] != options:
        known = _compiled[base_model] = (options, torch.compile(base_model.__call__, **options), {})
    choosers = known[2]
    setting = (str(base_model.device), base_model.dtype, torch.get_num_threads())
    if setting not in choosers:
        choosers[setting] = EngineChooser()
    return known[1], choosers[setting]


def should_compile(generation_config, device: torch.device) -> bool:
    """transformers' rule for a static cache: compile on CUDA, or wherever a ``compile_config`` was given, unless
    ``disable_compile``."""
    if getattr(generation_config, "disable_compile", False):
        return False
    return torch.device(device).type == "cuda" or getattr(generation_config, "compile_config", None) is not None


class StaticTreeCache:
    """The one-prompt cache layout on a :class:`~transformers.StaticCache` (see the module docstring).

    ``max_length``: the most positions the call can commit (prompt + new tokens); ``compile_config``: a
    transformers :class:`~transformers.CompileConfig` to compile the verification forward with (each forward then
    runs eagerly or compiled, as :attr:`engines` chooses), None to run it eagerly."""

    def __init__(self, model, max_length: int, compile_config=None):
        if compat.target_sliding_window(model.config) is not None:
            raise ValueError(
                "cache_implementation='static' with an hf-spec drafter does not support targets with a sliding "
                "attention window. Fix: drop cache_implementation (the default dynamic cache supports them)."
            )
        self.length = cache_length(max_length)
        self.cache = StaticCache(config=model.config, max_cache_len=self.length)
        self.past = 0
        self.device = model.device
        self.dtype = model.base_model.dtype
        self.eager_call = model.base_model.__call__
        self.call, self.engines = None, None
        """The compiled verification call, and the :class:`~hf_spec.controller.EngineChooser` that decides, per
        bucket, between it and :attr:`eager_call` (the same call, not compiled); None, None: always eager."""
        if compile_config is not None:
            self.call, self.engines = compiled_call(model.base_model, compile_config)
        self.slots = torch.arange(self.length, device=self.device)

    def prefill(self, target, input_ids: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[1]
        allowed = self.slots.view(1, -1) <= torch.arange(n, device=self.device).view(-1, 1)
        mask = additive_mask(allowed, self.dtype).view(1, 1, n, self.length)
        positions = torch.arange(n, device=self.device).view(1, -1)
        features = target.forward(input_ids, self.cache, attention_mask=mask, position_ids=positions)
        self.past = n
        return features

    def prompt_start(self, row: int) -> int:
        return 0

    def keep_rows(self, keep: list[int]) -> None:
        """Nothing to do: the one row stays until the call ends."""

    def verify(self, target, trees: list[DraftTree]) -> list[torch.Tensor]:
        (tree,) = trees
        n, past = len(tree), self.past
        size = bucket_size(n)
        if size > MAX_BUCKET:
            raise ValueError(f"A draft tree of {n} nodes exceeds the static layout's largest forward ({MAX_BUCKET}). "
                             "Fix: lower tree_total_tokens / ngram_nodes, or drop cache_implementation='static'.")
        # past <= max_length and size <= MAX_BUCKET: the forward always fits in cache_length(max_length) slots
        device = self.device
        tokens = torch.zeros(1, size, dtype=tree.tokens.dtype, device=device)
        tokens[0, :n] = tree.tokens
        positions = torch.full((1, size), past, dtype=torch.long, device=device)
        positions[0, :n] = tree.position_ids(past)[0]
        # Every row sees the prefix; a node its ancestors and itself; a padding row itself (so it stays finite).
        allowed = (self.slots < past).view(1, -1).repeat(size, 1)
        block = torch.eye(size, dtype=torch.bool, device=device)
        block[:n, :n] = tree.ancestor_matrix()
        allowed[:, past : past + size] = block
        mask = additive_mask(allowed, self.dtype).view(1, 1, size, self.length)
        compat.set_static_cache_length(self.cache, past)
        features = self._forward(target, size, tokens, mask, positions)
        return [target.logits(features[0, :n])]

    def _forward(self, target, size: int, tokens, mask, positions) -> torch.Tensor:
        """The verification forward of bucket ``size``: eager when nothing is compiled; else on the engine that
        :attr:`engines` chooses, timed (``timing.clock``: a host sync on CUDA) only when it asks."""
        if self.engines is None:
            return target.forward(tokens, self.cache, attention_mask=mask, position_ids=positions)
        engine, timed = self.engines.choose(size)
        call = self.call if engine == "compiled" else self.eager_call
        start = timing.clock(self.device) if timed else None
        features = target.forward(tokens, self.cache, attention_mask=mask, position_ids=positions, call=call)
        self.engines.record(size, engine, timing.clock(self.device) - start if timed else None)
        return features

    def commit(self, accepted: list[torch.Tensor], walks) -> None:
        nodes = accepted[0].to(torch.long)
        if not walks[0].accepted_contiguously:
            move_slots(self.cache, nodes + self.past, self.past)
        self.past += nodes.numel()

    def sequences(self, rows, prompt_length: int, horizon: int, pad_token) -> torch.Tensor:
        return rows[0].sequence[:, : prompt_length + horizon]

    def final_cache(self, length: int):
        compat.set_static_cache_length(self.cache, length - 1)
        return self.cache
