#!/usr/bin/env python
"""Real-shape engine benchmark of hf-spec on a GPU (issue 41, item 1), with a ``--tiny`` CPU mode for the tests.

What it measures, per target (random weights, real configs: Llama-3.1-8B, Qwen2.5-7B, Llama-3.2-1B, bf16, built
directly on the GPU, nothing downloaded):

- ``plain_eager``: transformers' own greedy ``generate()`` (DynamicCache, eager). Its output is the reference.
- ``plain_compiled_static``: ``generate(cache_implementation="static", compile_config=CompileConfig())``, the
  compiled plain loop a GPU user compares against (transformers compiles the decoding step, mode
  ``reduce-overhead``: CUDA graphs). On a CPU transformers skips the compile and runs the static cache eagerly.
- ``hf_spec_<shape>_tau<t>``: ``generate(assistant_model=OracleDrafter)`` with a fixed tree shape (explicit
  ``tree_depth`` / ``tree_top_k`` / ``tree_total_tokens``, so no run-time shape choice applies) at an acceptance
  set by the oracle (τ ≈ 2, 3, 4).

The oracle drafter (:class:`OracleDrafter`). Each cycle it runs a real-shape EAGLE-3 drafter
(:class:`hf_spec.Eagle3Drafter` built from the target config, random weights, a 32,000-token draft vocabulary as
EAGLE-3's released Llama-3.1-8B drafter has): its whole drafting session (one forward over the committed pairs,
one forward per further tree depth, EAGLE-2 dynamic tree growth and re-ranking), so drafting costs what it would.
Then it rewrites the tree's tokens from the target's known greedy continuation (the ``plain_eager`` output of
the same prompt): it picks the *spine*, the root-to-node path to the tree's deepest node (lowest index among
equals), draws ``D`` Bernoulli(p) successes and marks the spine's first ``a`` nodes correct, ``a`` = the number
of leading successes; every other node gets a token that is *not* the target's next token there. The greedy
walk then accepts ``min(a, spine depth)`` drafts, so τ = 1 + Σ_{i<=D} p^i when the spine reaches depth D; p is
solved from the wanted τ for the shape's depth. Verification stays lossless: the output must equal plain greedy
(``matches_plain``); the oracle only sets how much is accepted. The rewrite runs on the device without any host
read (its cost is timed once per target: ``oracle_rewrite_ms``). The drafter's own LM head is re-drawn with logit
std ``DRAFT_LOGIT_STD`` so its random draft distributions are peaked like a trained drafter's and the dynamic
tree mostly keeps its full depth (with the default init, every level is near-uniform over 32k tokens and
re-ranking keeps a 2-level bush). Where re-ranking keeps no node at depth D, the spine is shorter and τ lands a
little under its target: each row reports its measured ``tau`` and ``spine_depth_mean``.

Shapes (``SHAPES``): ``chain6`` (depth 6, top_k 1, 6 draft nodes: 7 verified tokens) and ``tree60`` (depth 6,
top_k 8, 60 draft nodes: hf-spec's default shape, 61 verified tokens).

"Decisive" targets. A random-weight model's next-token logits are nearly tied (128k random logits), so bf16
rounding differences between a 1-token and a 61-token forward would flip greedy choices, and hf-spec's text
would leave the known continuation (the oracle would then propose wrong tokens: τ collapses). So each target's
attention and MLP output projections are scaled by ``LAYER_OUTPUT_SCALE`` (the residual stream stays the token
embedding) and an untied LM head is set to a permutation of the embedding rows: the greedy continuation is a
walk along a random permutation of the vocabulary, with a logit margin of ~70 in bf16. Every kernel still runs
at full shape on ordinary (non-zero) numbers, so forwards cost what they cost with trained weights. (A tied
head, Llama-3.2-1B, keeps its tie: its continuation repeats the prompt's last token.)

Per hf-spec run: tokens/s (and ratios to both plain loops), τ, per-cycle draft / verify / host-overhead ms in
the steady state (cycles 2..n: from the second ``propose`` to the end of the call; draft = the drafter's
forwards as ``last_generation_stats.drafter_forward_seconds`` counts them; verify = the target's base forward +
LM head, timed by forward hooks; host = the rest: tree building, masks, the walk, commit, emit, and the oracle's
rewrite), peak memory. Per target, once (an extra untimed run at τ≈3 on the first shape): host reads of tensor
values per cycle (``.item()``/``.tolist()``/``bool()``… counted at the Python level), and on CUDA the
synchronizing CUDA calls (``torch.cuda.set_sync_debug_mode``: D2H copies, ``nonzero``…) and explicit
``torch.cuda.synchronize()`` calls (hf-spec's own stats timers: one per drafter and target forward). And the
verification cost curve t(k): one target forward of k tree tokens (4-ary tree mask, ``DraftTree.attention_mask``)
on a cached prompt-length prefix + the LM head over the k rows (``COST_GRID``, median of ``--repeats``+2 rounds).

Order, per target (Llama-3.1-8B, Llama-3.2-1B, then Qwen2.5-7B): plain eager (the reference), compiled plain
(its warm-up call is the compile; then its compiled call and static cache are dropped so later peaks are
hf-spec's own), hf-spec at τ≈3 on every shape, then τ≈2 and τ≈4, the sync count, the oracle's cost, t(k).

Output (``--out``, default ``$OUT`` else ``benchmarks/gpu/results``): ``results.json`` and ``README.md``
(tables), rewritten after every measurement so a run cut by a time limit leaves what it finished, and
``engine_bench.png`` (after every target; ``--replot results.json`` re-renders README and PNG from a JSON).
``--budget-s`` stops starting new measurements in time (default 480 s; the compiled row needs
``--compile-reserve-s`` left, and 45 s are kept for each target still to come).

Usage: ``python benchmarks/gpu/engine_bench.py`` (GPU; ``benchmarks/gpu/run_gpu.sh`` on a bare machine),
``python benchmarks/gpu/engine_bench.py --tiny`` (CPU, tiny configs, float32: ~10 s).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent

# -- configurations -------------------------------------------------------------------------------------------------
_LLAMA31_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
_LLAMA32_ROPE = {**_LLAMA31_ROPE, "factor": 32.0}

REAL_TARGETS = {
    # meta-llama/Llama-3.1-8B-Instruct config.json
    "llama-3.1-8b": ("llama", dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                   num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_act="silu",
                                   max_position_embeddings=131072, rms_norm_eps=1e-5, rope_parameters=_LLAMA31_ROPE,
                                   tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                                   bos_token_id=128000)),
    # meta-llama/Llama-3.2-1B-Instruct config.json
    "llama-3.2-1b": ("llama", dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                   num_attention_heads=32, num_key_value_heads=8, head_dim=64, hidden_act="silu",
                                   max_position_embeddings=131072, rms_norm_eps=1e-5, rope_parameters=_LLAMA32_ROPE,
                                   tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
                                   bos_token_id=128000)),
    # Qwen/Qwen2.5-7B-Instruct config.json (q/k/v biases: Qwen2's own layers)
    "qwen2.5-7b": ("qwen2", dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                 num_attention_heads=28, num_key_value_heads=4, hidden_act="silu",
                                 max_position_embeddings=32768, rms_norm_eps=1e-6,
                                 rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                                 tie_word_embeddings=False, use_sliding_window=False, sliding_window=None,
                                 max_window_layers=28, bos_token_id=151643)),
}  # fmt: skip
"""name -> (model_type, config fields): the real shapes, random weights."""

TINY_TARGETS = {
    "llama-3.1-8b": ("llama", dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   max_position_embeddings=131072, rms_norm_eps=1e-5, rope_parameters=_LLAMA31_ROPE,
                                   tie_word_embeddings=False, bos_token_id=1)),
    "llama-3.2-1b": ("llama", dict(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=7,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=131072, rms_norm_eps=1e-5, rope_parameters=_LLAMA32_ROPE,
                                   tie_word_embeddings=True, bos_token_id=1)),
    "qwen2.5-7b": ("qwen2", dict(vocab_size=512, hidden_size=56, intermediate_size=112, num_hidden_layers=7,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=131072,
                                 rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                                 tie_word_embeddings=False, use_sliding_window=False, sliding_window=None,
                                 max_window_layers=7, bos_token_id=1)),
}  # fmt: skip
"""Tiny configs of the same families (EAGLE-3's default fused layers need >= 7 target layers)."""

SHAPES = {
    "chain6": dict(tree_depth=6, tree_top_k=1, tree_total_tokens=6),
    "tree60": dict(tree_depth=6, tree_top_k=8, tree_total_tokens=60),
}
"""Fixed tree shapes (explicit generate() options: no run-time shape choice)."""

TAUS = (2.0, 3.0, 4.0)
COST_GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
DRAFT_VOCAB = 32000
"""EAGLE-3's draft vocabulary (its released Llama-3.1-8B drafter)."""
TINY_DRAFT_VOCAB = 256
DRAFT_LOGIT_STD = 8.0
"""Std of the random drafter's logits: peaked draft distributions, so the dynamic tree keeps its depth."""
LAYER_OUTPUT_SCALE = 1e-4
"""Factor on every o_proj / down_proj weight of a target (see "Decisive targets" in the module docstring)."""
SYNC_METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")
"""Tensor methods through which Python reads a value back to the host (a device sync on a GPU)."""


def log(start: float, message: str) -> None:
    print(f"[engine_bench {time.perf_counter() - start:7.1f}s] {message}", flush=True)


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def clock(device) -> float:
    sync(device)
    return time.perf_counter()


# -- targets and drafters -------------------------------------------------------------------------------------------
def build_target(model_type: str, fields: dict, device, dtype, seed: int):
    """A random-weight causal LM of the given config, built on ``device`` in ``dtype``, made decisive."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_class, model_class = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[
        model_type
    ]
    # no pad token in the config: a padding_idx would zero one embedding row (a token the continuation could reach,
    # whose logits would then be near-tied); generate() gets pad_token_id 0 from the generation config instead
    config = config_class(**fields, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_class._from_config(config, dtype=dtype)
    model.eval()
    make_decisive(model, seed)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


@torch.no_grad()
def make_decisive(model, seed: int) -> None:
    """Scale the layers' output projections by ``LAYER_OUTPUT_SCALE`` and set an untied LM head to a permutation
    of the embedding rows (see the module docstring): a greedy continuation that bf16 rounding cannot flip."""
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.mul_(LAYER_OUTPUT_SCALE)
        layer.mlp.down_proj.weight.mul_(LAYER_OUTPUT_SCALE)
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    if head.data_ptr() != embedding.data_ptr():
        g = torch.Generator().manual_seed(seed + 1)
        perm = torch.randperm(embedding.shape[0], generator=g).to(embedding.device)
        head.copy_(embedding[perm])


def build_eagle3(target, draft_vocab: int, seed: int):
    """A random EAGLE-3 drafter shaped for ``target`` (``Eagle3Drafter.from_target``), on its device and dtype,
    with a peaked own head (``DRAFT_LOGIT_STD``)."""
    import hf_spec

    torch.manual_seed(seed + 2)
    vocab = target.config.get_text_config().vocab_size
    with torch.device(target.device):
        drafter = hf_spec.Eagle3Drafter.from_target(target, draft_vocab_size=min(draft_vocab, vocab))
    drafter.eval()
    with torch.no_grad():
        drafter.lm_head.weight.normal_(0.0, DRAFT_LOGIT_STD / math.sqrt(drafter.lm_head.in_features))
    return drafter


def p_for_tau(tau: float, depth: int) -> float:
    """p with 1 + sum_{i=1..depth} p^i = tau (a depth-``depth`` spine, i.i.d. acceptance per depth)."""
    if not 1.0 <= tau <= depth + 1:
        raise ValueError(f"tau {tau} is out of reach of a depth-{depth} tree (1..{depth + 1}).")
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if 1.0 + sum(mid**i for i in range(1, depth + 1)) < tau:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def oracle_tree(tree, reference: torch.Tensor, root_pos: int, successes: torch.Tensor, vocab_size: int):
    """``tree`` with its tokens rewritten by the oracle (device ops only, no host read).

    ``reference``: (L,) prompt + the target's greedy continuation; ``root_pos``: the root's index in it;
    ``successes``: (D,) bool draws (D >= the tree's depth). The spine is the path from the root to the deepest
    node (lowest index among equals); its first ``a`` nodes (``a`` = leading successes) get the reference
    tokens, every other node a token that is not the reference token at its position (distinct among
    siblings). Returns (new tree, spine depth as a 0-d tensor)."""
    device = tree.tokens.device
    n = len(tree)
    depths, parents = tree.depths, tree.parents
    index = torch.arange(n, device=device)
    leaf = torch.argmax(depths * n - index).view(1)
    chain = [leaf]
    for _ in range(successes.numel() - 1):
        chain.append(parents[chain[-1]].clamp(min=0))
    on_spine = torch.zeros(n, dtype=torch.bool, device=device).index_fill_(0, torch.cat(chain), True)
    accepted = successes.long().cumprod(0).sum()
    position = root_pos + depths
    truth = reference[position.clamp(max=reference.numel() - 1)]
    correct = on_spine & (depths >= 1) & (depths <= accepted) & (position < reference.numel())
    tokens = torch.where(correct, truth, (truth + 1 + index) % vocab_size)
    tokens = torch.where(depths == 0, tree.tokens, tokens)
    nodes = tree.candidate_nodes
    candidate_tokens = torch.where(nodes >= 0, tokens[nodes.clamp(min=0)], torch.full_like(nodes, -1))
    new = dataclasses.replace(tree, tokens=tokens, candidate_tokens=candidate_tokens, from_ngram=None)
    return new, depths[leaf].squeeze(0)


def _oracle_classes():
    """The oracle drafter's classes (defined on first use: ``import hf_spec`` must come first)."""
    global OracleDrafter, OracleDrafterConfig, OracleSession
    if "OracleDrafter" in globals():
        return OracleDrafter
    import hf_spec
    from hf_spec import DraftingSession

    class OracleDrafterConfig(hf_spec.SpecDrafterConfig):
        model_type = "hf_spec_bench_oracle"

        def __init__(self, **kwargs):  # an explicit __init__: transformers 5 configs are dataclass-like otherwise
            super().__init__(**kwargs)

    class OracleSession(DraftingSession):
        """The EAGLE-3 drafter's own session drafts the tree (its real cost); the oracle rewrites its tokens."""

        def __init__(self, inner, reference, p, depth, generator, vocab_size, mark_time):
            self.inner = inner
            self.reference = reference
            self.p = p
            self.depth = depth
            self.generator = generator
            self.vocab_size = vocab_size
            self.mark_time = mark_time
            self.length = 1  # tokens of the sequence the drafter has seen: the prompt's first token
            self.calls = 0
            self.first_draft_seconds = 0.0
            self.second_start = None
            self.spine_depth_sum = None
            self.last_inner_tree = None

        @property
        def forward_seconds(self) -> float:
            return self.inner.forward_seconds

        def propose(self, features, next_tokens):
            self.calls += 1
            if self.calls == 2 and self.mark_time:
                self.second_start = clock(next_tokens.device)
            tree = self.inner.propose(features, next_tokens)
            if self.calls == 1:
                self.first_draft_seconds = self.inner.forward_seconds
            self.length += int(next_tokens.shape[0])
            draws = torch.rand(self.depth, generator=self.generator, device=self.generator.device)
            new, spine = oracle_tree(tree, self.reference, self.length - 1, draws < self.p, self.vocab_size)
            self.spine_depth_sum = spine if self.spine_depth_sum is None else self.spine_depth_sum + spine
            self.last_inner_tree = tree
            return new

        def record(self, stats) -> None:
            self.inner.record(stats)

    class OracleDrafter(hf_spec.SpecDrafterModel):
        """A test drafter: a real-shape EAGLE-3 drafter's drafting work, the oracle's acceptance (greedy only)."""

        config_class = OracleDrafterConfig

        def __init__(self, eagle3, target_config):
            config = OracleDrafterConfig(**hf_spec.SpecDrafterConfig.target_fields(target_config))
            super().__init__(config)
            self._eagle3 = [eagle3]  # not a submodule: it keeps its own device, dtype and binding
            self.reference, self.p, self.seed, self.mark_time = None, 0.0, 0, False
            self.last_session = None
            self.post_init()

        @property
        def eagle3(self):
            return self._eagle3[0]

        def configure(self, reference: torch.Tensor, p: float, seed: int, mark_time: bool) -> None:
            """The next call's reference (prompt + greedy continuation, (L,)), acceptance p and draw seed."""
            self.reference, self.p, self.seed, self.mark_time = reference.view(-1), float(p), int(seed), mark_time

        def bind(self, target):
            if not self.eagle3.is_bound_to(target):
                self.eagle3.bind(target)
            self._borrowed = (target.get_input_embeddings(), target.get_output_embeddings())
            self._bound_target_config = target.config
            return self

        def target_feature_layers(self):
            return self.eagle3.target_feature_layers()

        def new_drafting_session(self, target, shape, do_sample, temperature=1.0, prompt_ids=None):
            if do_sample:
                raise ValueError("The oracle drafter is greedy only.")
            if self.reference is None:
                raise ValueError("Call configure(reference, p, seed, mark_time) before generate().")
            inner = self.eagle3.new_drafting_session(target, shape, False, 1.0, prompt_ids)
            device = self.reference.device
            generator = torch.Generator(device=device).manual_seed(self.seed)
            vocab = target.config.get_text_config().vocab_size
            self.last_session = OracleSession(inner, self.reference.to(device), self.p, shape.depth, generator, vocab,
                                              self.mark_time)  # fmt: skip
            return self.last_session

    globals().update(OracleDrafter=OracleDrafter, OracleDrafterConfig=OracleDrafterConfig, OracleSession=OracleSession)
    return OracleDrafter


# -- timing helpers -------------------------------------------------------------------------------------------------
class ForwardTimer:
    """Durations of every call of the given modules (forward pre/post hooks, device-synchronized)."""

    def __init__(self, modules: dict, device):
        self.device = device
        self.durations = {name: [] for name in modules}
        self._starts = {}
        self._handles = []
        for name, module in modules.items():
            self._handles.append(module.register_forward_pre_hook(lambda m, a, name=name: self._start(name)))
            self._handles.append(module.register_forward_hook(lambda m, a, o, name=name: self._stop(name)))

    def _start(self, name):
        self._starts[name] = clock(self.device)

    def _stop(self, name):
        self.durations[name].append(clock(self.device) - self._starts.pop(name))

    def remove(self):
        for handle in self._handles:
            handle.remove()


@contextlib.contextmanager
def count_syncs(cuda: bool):
    """Count host reads of tensor values (``SYNC_METHODS``), and on CUDA explicit ``torch.cuda.synchronize``
    calls and synchronizing CUDA operations (``torch.cuda.set_sync_debug_mode('warn')``), while active."""
    counts = {"host_reads": 0, "explicit_synchronize": None, "cuda_synchronizing_ops": None}
    saved = [(name, getattr(torch.Tensor, name)) for name in SYNC_METHODS]

    def counting(original):
        def wrapper(self, *args, **kwargs):
            counts["host_reads"] += 1
            return original(self, *args, **kwargs)

        return wrapper

    record = None
    original_sync = torch.cuda.synchronize
    previous_mode = torch.cuda.get_sync_debug_mode() if cuda else None
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        try:
            for name, original in saved:
                setattr(torch.Tensor, name, counting(original))
            if cuda:
                counts["explicit_synchronize"] = 0

                def counting_sync(*args, **kwargs):
                    counts["explicit_synchronize"] += 1
                    return original_sync(*args, **kwargs)

                torch.cuda.synchronize = counting_sync
                torch.cuda.set_sync_debug_mode("warn")
            yield counts
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(previous_mode)
                torch.cuda.synchronize = original_sync
            for name, original in saved:
                setattr(torch.Tensor, name, original)
    if cuda:
        counts["cuda_synchronizing_ops"] = sum("synchroniz" in str(w.message) for w in record)


def common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
    a, b = a.view(-1).tolist(), b.view(-1).tolist()
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def peak_gib(device):
    if torch.device(device).type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 3)


def reset_peak(device):
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def median(values):
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return statistics.median(values) if values else None


def rounded(value, digits=3):
    return None if value is None else round(float(value), digits)


# -- measurements ---------------------------------------------------------------------------------------------------
def plain_generate(model, prompt, new_tokens, **kwargs):
    return model.generate(prompt, max_new_tokens=new_tokens, do_sample=False, **kwargs)


def measure_plain(model, prompts, new_tokens, repeats, device, compiled: bool, references=None):
    """Greedy plain generate() over the prompts: warm-up (the compile, when compiled), then ``repeats`` timed
    rounds. Returns (result dict, outputs of the last round)."""
    from transformers import CompileConfig

    kwargs = dict(cache_implementation="static", compile_config=CompileConfig()) if compiled else {}
    repeats = repeats + 1 if compiled else repeats  # fast once compiled; CUDA graphs may still record on call 2
    reset_peak(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # on a CPU transformers warns that it will not compile
        start = clock(device)
        for prompt in prompts:
            plain_generate(model, prompt, new_tokens, **kwargs)
        warmup = clock(device) - start
        seconds, outputs = [], []
        for _ in range(repeats):
            outputs = []
            start = clock(device)
            for prompt in prompts:
                outputs.append(plain_generate(model, prompt, new_tokens, **kwargs))
            seconds.append(clock(device) - start)
    total = sum(out.shape[1] - prompt.shape[1] for out, prompt in zip(outputs, prompts))
    result = {
        "tokens_per_s": rounded(total / median(seconds), 2),
        "tokens_per_s_runs": [round(total / s, 2) for s in seconds],
        "ms_per_token": rounded(1000 * median(seconds) / total),
        "new_tokens": total,
        "warmup_seconds": rounded(warmup, 2),
        "peak_memory_gib": peak_gib(device),
    }
    if compiled:
        result["compiled"] = getattr(model, "_compiled_call", None) is not None and torch.device(device).type != "cpu"
    if references is not None:
        prefix = [common_prefix(out, ref) for out, ref in zip(outputs, references)]
        result["matches_plain"] = all(p == ref.numel() for p, ref in zip(prefix, references))
        result["common_prefix"] = prefix
    return result, outputs


def release_compiled(model, device) -> None:
    """Drop what a compiled static-cache generate() left on ``model`` (compiled call, static cache) and reset
    dynamo, so the later rows' peak memory is their own."""
    for attr in ("_compiled_call", "_cache"):
        if hasattr(model, attr):
            with contextlib.suppress(Exception):
                delattr(model, attr)
    gc.collect()
    if torch.device(device).type == "cuda":  # (on a CPU transformers compiled nothing)
        torch._dynamo.reset()
        torch.cuda.empty_cache()


def hf_spec_run(target, drafter, prompt, reference, shape, p, seed, new_tokens, device, instrument, extra,
                around=contextlib.nullcontext):  # fmt: skip
    """One hf-spec generate() with the oracle; returns (per-run record, the oracle session). ``instrument``: time
    the target's forwards and the second propose (the per-cycle split); ``around``: a context entered around the
    generate() call alone (the sync counter)."""
    drafter.configure(reference, p, seed, mark_time=instrument)
    modules = {"base": target.base_model, "head": target.get_output_embeddings()}
    timer = ForwardTimer(modules, device) if instrument else None
    try:
        start = clock(device)
        with around():
            out = target.generate(prompt, assistant_model=drafter, max_new_tokens=new_tokens, do_sample=False,
                                  **shape, **extra)  # fmt: skip
        end = clock(device)
    finally:
        if timer is not None:
            timer.remove()
    stats = drafter.last_generation_stats
    session = drafter.last_session
    cycles = stats.cycles
    record = {
        "seconds": end - start,
        "new_tokens": out.shape[1] - prompt.shape[1],
        "accepted": sum(stats.accepted_lengths),
        "cycles": cycles,
        "tree_nodes": sum(stats.tree_sizes),
        "spine_depth_sum": int(session.spine_depth_sum) if session.spine_depth_sum is not None else 0,
        "stats_total_s": stats.total_seconds,
        "stats_target_s": stats.target_forward_seconds,
        "stats_drafter_s": stats.drafter_forward_seconds,
        "verify_forwards": stats.verify_forwards,
        "common_prefix": common_prefix(out, reference),
        "matches_plain": common_prefix(out, reference) == reference.numel() and out.numel() == reference.numel(),
        "engines": stats.engines,  # static rows with a compiled call: eager or compiled per bucket, as measured
    }
    if instrument and cycles >= 2 and session.second_start is not None:
        steady = cycles - 1
        base, head = timer.durations["base"], timer.durations["head"]
        record["cycle_ms"] = 1000 * (end - session.second_start) / steady
        record["draft_ms"] = 1000 * (stats.drafter_forward_seconds - session.first_draft_seconds) / steady
        record["verify_ms"] = 1000 * (sum(base[2:]) + sum(head[2:])) / steady
        record["host_ms"] = record["cycle_ms"] - record["draft_ms"] - record["verify_ms"]
        record["prefill_ms"] = 1000 * (base[0] + head[0]) if base and head else None
    return record, session


def aggregate_spec(runs_per_repeat: list[list[dict]]) -> dict:
    """One method's result from its repeats (each a list of per-prompt records)."""

    def per_repeat(key):
        return [sum(r[key] for r in runs) for runs in runs_per_repeat]

    seconds = per_repeat("seconds")
    new_tokens = per_repeat("new_tokens")[0]
    last = runs_per_repeat[-1]
    cycles = sum(r["cycles"] for r in last)
    split = {}  # the per-cycle split: mean over prompts, median over repeats
    for key, name in (("cycle_ms", "cycle_ms"), ("draft_ms", "draft_ms_per_cycle"),
                      ("verify_ms", "verify_ms_per_cycle"), ("host_ms", "host_ms_per_cycle"),
                      ("prefill_ms", "prefill_ms")):  # fmt: skip
        values = [statistics.fmean([r[key] for r in runs if r.get(key) is not None] or [float("nan")])
                  for runs in runs_per_repeat]  # fmt: skip
        split[name] = rounded(median(values))
    cycle, host = split["cycle_ms"], split["host_ms_per_cycle"]
    return {
        "tokens_per_s": rounded(new_tokens / median(seconds), 2),
        "tokens_per_s_runs": [round(new_tokens / s, 2) for s in seconds],
        "ms_per_token": rounded(1000 * median(seconds) / new_tokens),
        "new_tokens": new_tokens,
        "tau": rounded(1 + sum(r["accepted"] for r in last) / cycles) if cycles else None,
        "cycles": cycles,
        "tree_nodes_mean": rounded(sum(r["tree_nodes"] for r in last) / cycles, 2) if cycles else None,
        "spine_depth_mean": rounded(sum(r["spine_depth_sum"] for r in last) / cycles, 2) if cycles else None,
        **split,
        "host_share": rounded(host / cycle) if cycle and host is not None else None,
        "stats_overhead_share": rounded(median([1 - (r["stats_target_s"] + r["stats_drafter_s"]) / r["stats_total_s"]
                                                for r in last if r["stats_total_s"] > 0])),
        "matches_plain": all(r["matches_plain"] for runs in runs_per_repeat for r in runs),
        "common_prefix": [r["common_prefix"] for r in last],
    }  # fmt: skip


def verify_cost_curve(model, prefix, grid, repeats, device) -> dict:
    """{k: median ms of one base forward of k tree tokens (4-ary tree mask) on the cached ``prefix`` + the LM head
    over the k rows}: transformers' DynamicCache, 4D additive mask, explicit positions. (On CUDA this is the
    forward hf-spec verifies with; on a CPU hf-spec also turns on transformers' masked-GQA SDPA switch.)"""
    from transformers import DynamicCache

    from hf_spec import DraftTree

    base, head = model.base_model, model.get_output_embeddings()
    vocab = model.config.get_text_config().vocab_size
    past = prefix.shape[1]
    g = torch.Generator().manual_seed(0)
    cache = DynamicCache()
    trees = {}
    for k in grid:
        parents = [-1] + [(i - 1) // 4 for i in range(1, k)]
        depths = [0] * k
        for i in range(1, k):
            depths[i] = depths[parents[i]] + 1
        tokens = torch.randint(0, vocab, (k,), generator=g)
        empty = torch.zeros(0, 1, dtype=torch.long, device=device)
        tree = DraftTree(tokens=tokens.to(device), parents=torch.tensor(parents, device=device),
                         depths=torch.tensor(depths, device=device), scores=torch.zeros(k, device=device),
                         expanded=torch.zeros(0, dtype=torch.long, device=device), candidate_tokens=empty,
                         candidate_nodes=empty)  # fmt: skip
        trees[k] = (tree.tokens.view(1, -1), tree.attention_mask(past, model.dtype), tree.position_ids(past))
    samples = {k: [] for k in grid}
    with torch.inference_mode():
        base(input_ids=prefix, past_key_values=cache, use_cache=True)
        for round_ in range(repeats + 1):  # round 0 warms up
            for k in grid:
                ids, mask, positions = trees[k]
                start = clock(device)
                out = base(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                           use_cache=True)  # fmt: skip
                head(out.last_hidden_state[0]).float()
                ms = 1000 * (clock(device) - start)
                cache.crop(-k)
                if round_:
                    samples[k].append(ms)
    return {str(k): round(statistics.median(v), 4) for k, v in samples.items()}


def time_oracle_rewrite(session, repeats, device) -> float | None:
    """Median ms of one oracle rewrite of the session's last drafted tree (device ops, synchronized)."""
    tree = session.last_inner_tree if session is not None else None
    if tree is None:
        return None
    times = []
    draws = torch.rand(session.depth, device=device) < 0.5
    for _ in range(repeats + 1):
        start = clock(device)
        oracle_tree(tree, session.reference, 0, draws, session.vocab_size)
        times.append(1000 * (clock(device) - start))
    return round(statistics.median(times[1:]), 4)


# -- output ---------------------------------------------------------------------------------------------------------
def write_json(results: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(out / "results.json")


def _fmt(value, digits=2):
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _count(n) -> str:
    if n is None:
        return "?"
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def ordered_methods(results: dict, methods: dict) -> list[str]:
    """The methods of one target in the run's order (plain loops, then hf-spec by variant, shape and τ)."""
    order = results["meta"].get("methods", [])
    return [m for m in order if m in methods] + [m for m in methods if m not in order]


def write_readme(results: dict, out: Path) -> None:
    meta = results["meta"]
    commit = f" (commit {meta['commit']})" if meta.get("commit") else ""
    mode = "TINY configs (CPU test mode)" if meta["tiny"] else "real shapes, random weights"
    lines = [
        "# hf-spec engine benchmark (`benchmarks/gpu/engine_bench.py`)",
        "",
        f"Device: **{meta['device_name']}**; {meta['dtype']}; torch {meta['torch']}, transformers "
        f"{meta['transformers']}, hf-spec {meta['hf_spec']}{commit}; {mode}; {meta['prompts']} prompt(s) x "
        f"{meta['prompt_len']} tokens, {meta['new_tokens']} new tokens, greedy; {meta['repeats']} timed repeat(s), "
        f"median; run took {_fmt(meta.get('elapsed_s'), 0)} s ({meta['date']}).",
        "",
        "hf-spec rows: the oracle drafter (real-shape EAGLE-3 drafting work, acceptance set by the oracle), tree "
        "shape fixed per row. Per-cycle columns are the steady state (cycles 2..n): draft = drafter forwards, "
        "verify = target forward + LM head, host = the rest of the cycle (tree building, masks, walk, commit, emit, "
        "oracle rewrite). `= plain`: output identical to plain eager greedy. `runs`: each timed repeat in order (a "
        "repeat replays the shapes of the one before it, so a slow first repeat is a per-shape cost).",
        "",
    ]
    header = ("| method | tok/s | runs tok/s | × eager | × compiled | τ | p | cycle ms | draft ms | verify ms | host ms (share) "
              "| nodes | peak GiB | = plain |")  # fmt: skip
    for name, target in results["targets"].items():
        methods = target.get("methods", {})
        eager = methods.get("plain_eager", {}).get("tokens_per_s")
        compiled = methods.get("plain_compiled_static", {}).get("tokens_per_s")
        lines += [f"## {name} ({target.get('status', '?')})", ""]
        for key in ("skipped", "error"):
            if target.get(key):
                lines += [f"{key.capitalize()}: {target[key]}", ""]
        lines += [header, "|---" * 14 + "|"]
        for method in ordered_methods(results, methods):
            r = methods[method]
            if "skipped" in r:
                lines.append(f"| {method} | skipped: {r['skipped']} |" + " |" * 12)
                continue
            tps = r.get("tokens_per_s")
            share = r.get("host_share")
            same = "ref" if r.get("reference") else _fmt(r.get("matches_plain"))
            runs = " / ".join(_fmt(x, 1) for x in r.get("tokens_per_s_runs") or [])
            cells = [method, _fmt(tps, 1), runs or "–", _fmt(tps / eager if tps and eager else None),
                     _fmt(tps / compiled if tps and compiled else None), _fmt(r.get("tau")), _fmt(r.get("p")),
                     _fmt(r.get("cycle_ms")), _fmt(r.get("draft_ms_per_cycle")), _fmt(r.get("verify_ms_per_cycle")),
                     _fmt(r.get("host_ms_per_cycle")) + (f" ({share:.0%})" if share is not None else ""),
                     _fmt(r.get("tree_nodes_mean"), 1), _fmt(r.get("peak_memory_gib")), same]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
        notes = []
        row = methods.get("plain_compiled_static", {})
        if "compiled" in row:
            done = "yes" if row["compiled"] else "NO"
            if not row["compiled"] and meta["tiny"]:
                done = "no (transformers skips the compile on a CPU)"
            notes.append(f"Compiled plain: first call (the compile) {_fmt(row.get('warmup_seconds'), 1)} s; "
                         f"compiled by transformers: {done}.")  # fmt: skip
        tau3 = [(m, r) for m, r in methods.items() if m.startswith("hf_spec_") and r.get("tau_target") == 3.0
                and r.get("speedup_vs_plain_compiled_static") is not None]  # fmt: skip
        if tau3:
            m, r = max(tau3, key=lambda item: item[1]["speedup_vs_plain_compiled_static"])
            share = r.get("host_share")
            notes.append(f"Issue 41's goal (8B shape, τ=3: ≥ 1.5x compiled plain, host ≤ 10% of a cycle): best "
                         f"τ≈3 row here {m}: {r['speedup_vs_plain_compiled_static']:.2f}x compiled plain, host "
                         f"{'–' if share is None else f'{share:.0%}'} of a cycle.")  # fmt: skip
        syncs = target.get("host_syncs")
        if syncs:
            notes.append(f"Host syncs per cycle ({syncs['method']}, {syncs['cycles']} cycles, untimed run): host "
                         f"reads of tensor values {_fmt(syncs.get('host_reads_per_cycle'))}, synchronizing CUDA ops "
                         f"{_fmt(syncs.get('cuda_synchronizing_ops_per_cycle'))}, explicit torch.cuda.synchronize "
                         f"{_fmt(syncs.get('explicit_synchronize_per_cycle'))}.")  # fmt: skip
        if target.get("oracle_rewrite_ms") is not None:
            notes.append(f"Oracle rewrite (in host ms above; a real drafter has none): "
                         f"{target['oracle_rewrite_ms']:.3f} ms per cycle.")  # fmt: skip
        if target.get("build_seconds") is not None:
            notes.append(f"Target {_count(target.get('parameters'))} parameters, EAGLE-3 drafter "
                         f"{_count(target.get('drafter_parameters'))} (fuses layers "
                         f"{target.get('eagle3_fused_layers')}); "
                         f"built in {target['build_seconds']} s; the target's rows took "
                         f"{_fmt(target.get('seconds'), 0)} s.")  # fmt: skip
        for note in notes:
            lines += ["", note]
        lines.append("")
    curves = {name: t["verify_cost_ms"] for name, t in results["targets"].items() if t.get("verify_cost_ms")}
    if curves:
        names = list(curves)
        lines += ["## Verification cost t(k), ms (one target forward of k tree tokens on a cached prompt + LM head)",
                  "", "| k | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]  # fmt: skip
        for k in meta["cost_grid"]:
            lines.append(f"| {k} | " + " | ".join(_fmt(curves[n].get(str(k)), 3) for n in names) + " |")
        lines.append("")
    (out / "README.md").write_text("\n".join(lines))


def write_plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = results["targets"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
    methods = [m for m in results["meta"].get("methods", [])
               if any(t.get("methods", {}).get(m, {}).get("tokens_per_s") for t in targets.values())]  # fmt: skip
    width = 0.8 / max(len(methods), 1)
    for i, method in enumerate(methods):
        values = [t.get("methods", {}).get(method, {}).get("tokens_per_s") or 0.0 for t in targets.values()]
        left.bar([x + i * width for x in range(len(targets))], values, width, label=method)
    left.set_xticks([x + 0.4 - width / 2 for x in range(len(targets))], list(targets))
    left.set_ylabel("tokens/s")
    left.set_title("Greedy decoding speed (batch 1)")
    if methods:
        left.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.08))
    for name, t in targets.items():
        curve = t.get("verify_cost_ms")
        if curve:
            ks = sorted(int(k) for k in curve)
            right.plot(ks, [curve[str(k)] for k in ks], marker="o", label=name)
    right.set_xscale("log", base=2)
    right.set_xlabel("tree tokens verified k")
    right.set_ylabel("ms (forward + LM head)")
    right.set_title("Verification cost t(k)")
    if any(t.get("verify_cost_ms") for t in targets.values()):
        right.legend(fontsize=8)
    fig.suptitle(f"hf-spec engine benchmark — {results['meta']['device_name']}")
    fig.tight_layout()
    fig.savefig(out / "engine_bench.png", dpi=110)
    plt.close(fig)


def write_all(results: dict, out: Path) -> None:
    write_json(results, out)
    write_readme(results, out)
    write_plot(results, out)


# -- the run --------------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="tiny configs on the CPU in float32 (the test mode)")
    parser.add_argument("--out", default=None, help="output folder (default: $OUT, else benchmarks/gpu/results)")
    parser.add_argument("--targets", default=None, help="comma-separated subset of " + ",".join(REAL_TARGETS))
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset of " + ",".join(SHAPES))
    parser.add_argument("--taus", default=",".join(f"{t:g}" for t in TAUS), help="oracle acceptance targets")
    parser.add_argument("--prompts", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=None, help="default 128 (tiny: 16)")
    parser.add_argument("--new-tokens", type=int, default=None, help="default 128 (tiny: 48)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per method (default 2, tiny 1)")
    parser.add_argument("--cost-grid", default=",".join(map(str, COST_GRID)))
    parser.add_argument("--budget-s", type=float, default=480.0, help="no new measurement starts after this")
    parser.add_argument("--compile-reserve-s", type=float, default=None,
                        help="time the compiled plain run needs (warm-up compile included); skipped when less is "
                             "left (default 120 on CUDA, 0 on CPU)")  # fmt: skip
    parser.add_argument("--no-compiled", action="store_true", help="skip transformers' compiled static-cache plain")
    parser.add_argument("--device", default=None, help="default cuda (tiny: cpu)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replot", default=None, metavar="RESULTS_JSON",
                        help="only re-render README.md and engine_bench.png from a results.json (into its folder, or "
                             "--out), e.g. after a run was cut by a time limit")  # fmt: skip
    parser.add_argument("--no-static", action="store_true",
                        help="skip hf-spec's static-cache rows (cache_implementation='static': tree verification "
                             "in a preallocated cache at bucketed sizes, compiled on CUDA)")  # fmt: skip
    parser.add_argument("--spec-variant", action="append", default=[], metavar="NAME=JSON",
                        help="extra hf-spec rows with these generate() kwargs (e.g. a compiled verification path "
                             "once it exists); the plain 'eager' variant always runs")  # fmt: skip
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    args.prompt_len = args.prompt_len or (16 if args.tiny else 128)
    args.new_tokens = args.new_tokens or (48 if args.tiny else 128)
    args.repeats = args.repeats or (1 if args.tiny else 2)
    args.device = args.device or ("cpu" if args.tiny else "cuda")
    if args.compile_reserve_s is None:
        args.compile_reserve_s = 120.0 if torch.device(args.device).type == "cuda" else 0.0
    table = TINY_TARGETS if args.tiny else REAL_TARGETS
    args.target_names = args.targets.split(",") if args.targets else list(table)
    unknown = [t for t in args.target_names if t not in table]
    if unknown:
        parser.error(f"unknown targets {unknown}; choose from {list(table)}")
    args.shape_names = [s for s in args.shapes.split(",") if s]
    if any(s not in SHAPES for s in args.shape_names):
        parser.error(f"unknown shapes in {args.shapes}; choose from {list(SHAPES)}")
    args.tau_values = [float(t) for t in args.taus.split(",") if t]
    args.grid = [int(k) for k in args.cost_grid.split(",") if k]
    args.variants = {"eager": {}} if args.no_static else {"eager": {}, "static": {"cache_implementation": "static"}}
    for spec in args.spec_variant:
        name, _, kwargs = spec.partition("=")
        args.variants[name] = json.loads(kwargs or "{}")
    for kwargs in args.variants.values():  # JSON gives a dict; generate() takes a CompileConfig
        if isinstance(kwargs.get("compile_config"), dict):
            from transformers import CompileConfig

            kwargs["compile_config"] = CompileConfig(**kwargs["compile_config"])
    out = args.out or os.environ.get("OUT") or str(HERE / "results")
    args.out_dir = Path(out)
    return args


def spec_method_name(shape: str, tau: float, variant: str) -> str:
    return f"hf_spec_{shape}_tau{tau:g}" + ("" if variant == "eager" else f"_{variant}")


def expected_methods(shape_names, taus, variants=("eager",)) -> list[str]:
    return ["plain_eager", "plain_compiled_static"] + [spec_method_name(s, t, v) for v in variants for s in shape_names
                                                        for t in taus]  # fmt: skip


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None  # fmt: skip
    except Exception:
        return None


def run_target(name, args, results, deadline, start, targets_left):
    model_type, fields = (TINY_TARGETS if args.tiny else REAL_TARGETS)[name]
    device = torch.device(args.device)
    dtype = torch.float32 if args.tiny else torch.bfloat16
    entry = results["targets"][name] = {"model_type": model_type, "config": fields, "status": "running", "methods": {}}
    methods = entry["methods"]
    reserve = targets_left * (5.0 if args.tiny else 45.0)  # kept for the targets after this one

    def left() -> float:
        return deadline - time.perf_counter() - reserve

    def save():  # after every measurement: a run cut by a time limit keeps what it finished (the PNG: per target)
        results["meta"]["elapsed_s"] = round(time.perf_counter() - start, 1)
        write_json(results, args.out_dir)
        write_readme(results, args.out_dir)

    t0 = time.perf_counter()
    target = build_target(model_type, fields, device, dtype, args.seed)
    eagle3 = build_eagle3(target, TINY_DRAFT_VOCAB if args.tiny else DRAFT_VOCAB, args.seed)
    drafter = _oracle_classes()(eagle3, target.config)
    entry["build_seconds"] = round(time.perf_counter() - t0, 2)
    entry["parameters"] = sum(p.numel() for p in target.parameters())
    entry["drafter_parameters"] = sum(p.numel() for p in eagle3.parameters())
    entry["eagle3_fused_layers"] = list(eagle3.target_feature_layers())
    log(start, f"{name}: built in {entry['build_seconds']} s ({_count(entry['parameters'])} parameters, drafter "
        f"{_count(entry['drafter_parameters'])})")  # fmt: skip

    vocab = fields["vocab_size"]
    g = torch.Generator().manual_seed(args.seed + 10)
    low = 1000 if vocab > 10000 else 1
    prompts = [torch.randint(low, vocab, (1, args.prompt_len), generator=g).to(device) for _ in range(args.prompts)]

    # 1. plain eager: the reference continuation of every prompt
    result, references = measure_plain(target, prompts, args.new_tokens, args.repeats, device, compiled=False)
    methods["plain_eager"] = {**result, "reference": True}
    references = [ref.view(-1) for ref in references]
    log(start, f"{name}: plain_eager {result['tokens_per_s']} tok/s")
    save()

    # 2. transformers' compiled static-cache plain
    if args.no_compiled:
        methods["plain_compiled_static"] = {"skipped": "--no-compiled"}
    elif left() < args.compile_reserve_s:
        methods["plain_compiled_static"] = {"skipped": f"time budget ({left():.0f} s left)"}
    else:
        try:
            result, outputs = measure_plain(target, prompts, args.new_tokens, args.repeats, device, compiled=True,
                                            references=references)  # fmt: skip
            methods["plain_compiled_static"] = result
            log(start, f"{name}: plain_compiled_static {result['tokens_per_s']} tok/s (warm-up/compile "
                f"{result['warmup_seconds']} s, compiled={result['compiled']})")  # fmt: skip
        except Exception as error:  # a compile failure must not cost the other rows
            methods["plain_compiled_static"] = {"skipped": f"error: {type(error).__name__}: {error}"[:500]}
            log(start, f"{name}: plain_compiled_static failed: {error!r}"[:300])
        release_compiled(target, device)  # its CUDA graph pools and static cache would count in later peaks
    save()

    # 3. hf-spec with the oracle at each τ and shape (τ≈3 first: the goal)
    warm_shape = SHAPES[args.shape_names[0]] if args.shape_names else SHAPES["chain6"]
    try:
        hf_spec_run(target, drafter, prompts[0], references[0], warm_shape, 0.5, args.seed, min(16, args.new_tokens),
                    device, True, {})  # fmt: skip
        spec_error = None
    except Exception as error:  # hf-spec itself fails here: record it on every row, keep the other measurements
        spec_error = f"error: {type(error).__name__}: {error}"[:500]
        log(start, f"{name}: hf-spec warm-up failed: {error!r}"[:300])
    order = sorted(args.tau_values, key=lambda t: (t != 3.0, t))
    for tau in order:  # τ≈3 first, eager and static side by side
        for variant, extra in args.variants.items():
            for shape_name in args.shape_names:
                shape = SHAPES[shape_name]
                method = spec_method_name(shape_name, tau, variant)
                p = p_for_tau(tau, shape["tree_depth"])
                estimate = 2.0 * args.repeats * (methods["plain_eager"]["ms_per_token"] or 0) * args.new_tokens / 1000
                if spec_error is not None:
                    methods[method] = {"skipped": spec_error}
                    continue
                if left() < estimate:
                    methods[method] = {"skipped": f"time budget ({left():.0f} s left)"}
                    continue
                try:
                    warmup = None
                    if variant != "eager":  # a compiled variant compiles here (once per bucket), not in a timed run
                        warmup = clock(device)
                        hf_spec_run(target, drafter, prompts[0], references[0], shape, p, args.seed, args.new_tokens,
                                    device, False, extra)  # fmt: skip
                        warmup = clock(device) - warmup
                    reset_peak(device)
                    repeats = []
                    for r in range(args.repeats):
                        runs = []
                        for i, (prompt, reference) in enumerate(zip(prompts, references)):
                            record, _ = hf_spec_run(target, drafter, prompt, reference, shape, p,
                                                    args.seed + 100 * i, args.new_tokens, device, True, extra)
                            runs.append(record)
                        repeats.append(runs)
                    result = {"shape": shape, "variant": variant, "tau_target": tau, "p": round(p, 4),
                              **aggregate_spec(repeats), "peak_memory_gib": peak_gib(device),
                              "warmup_seconds": rounded(warmup, 2) if warmup is not None else None}  # fmt: skip
                    for plain in ("plain_eager", "plain_compiled_static"):
                        base = methods.get(plain, {}).get("tokens_per_s")
                        result[f"speedup_vs_{plain}"] = rounded(result["tokens_per_s"] / base) if base else None
                    methods[method] = result
                    log(start, f"{name}: {method} {result['tokens_per_s']} tok/s, tau {result['tau']}, "
                        f"x{result['speedup_vs_plain_eager']} eager, x{result['speedup_vs_plain_compiled_static']} "
                        f"compiled, cycle {result['cycle_ms']} ms (draft {result['draft_ms_per_cycle']}, verify "
                        f"{result['verify_ms_per_cycle']}, host {result['host_ms_per_cycle']}), "
                        f"= plain: {result['matches_plain']}")  # fmt: skip
                except Exception as error:
                    methods[method] = {"skipped": f"error: {type(error).__name__}: {error}"[:500]}
                    log(start, f"{name}: {method} failed: {error!r}"[:300])
                save()

    # 4. host syncs per cycle (one untimed run, τ≈3 on the first shape), the oracle's own cost
    try:
        if args.shape_names and spec_error is None and left() > 0:
            count_host_syncs(entry, target, drafter, prompts[0], references[0], args, device, start, name)
    except Exception as error:
        entry["host_syncs_error"] = f"{type(error).__name__}: {error}"[:500]
        log(start, f"{name}: sync count failed: {error!r}"[:300])
    save()

    # 5. verification cost curve t(k)
    if left() > 0:
        try:
            entry["verify_cost_ms"] = verify_cost_curve(target, prompts[0], args.grid, max(args.repeats, 1) + 2,
                                                        device)  # fmt: skip
            log(start, f"{name}: t(k) {entry['verify_cost_ms']}")
        except Exception as error:
            entry["verify_cost_error"] = f"{type(error).__name__}: {error}"[:500]
            log(start, f"{name}: t(k) failed: {error!r}"[:300])

    entry["status"] = "done"
    entry["seconds"] = round(time.perf_counter() - t0, 1)
    save()


def count_host_syncs(entry, target, drafter, prompt, reference, args, device, start, name) -> None:
    """One untimed hf-spec run at τ≈3 on the first shape with :func:`count_syncs` around its generate() call
    alone; sets ``entry["host_syncs"]`` and ``entry["oracle_rewrite_ms"]``."""
    cuda = torch.device(device).type == "cuda"
    shape_name = args.shape_names[0]
    shape = SHAPES[shape_name]
    holder = {}

    @contextlib.contextmanager
    def counting():
        with count_syncs(cuda) as counts:
            holder["counts"] = counts
            yield

    record, session = hf_spec_run(target, drafter, prompt, reference, shape, p_for_tau(3.0, shape["tree_depth"]),
                                  args.seed, args.new_tokens, device, False, {}, around=counting)  # fmt: skip
    counts = holder["counts"]
    cycles = max(record["cycles"], 1)
    entry["host_syncs"] = {
        "method": spec_method_name(shape_name, 3.0, "eager"),
        "cycles": record["cycles"],
        **counts,
        **{f"{key}_per_cycle": rounded(value / cycles, 2) for key, value in counts.items() if value is not None},
        "note": "whole call (prefill and first token included) / cycles; host_reads counts Python-level "
        "item/tolist/bool/int/float/index calls on tensors (on CUDA each a sync, CPU tensors too); "
        "cuda_synchronizing_ops: torch.cuda.set_sync_debug_mode warnings (D2H copies, nonzero, item...); "
        "explicit_synchronize: torch.cuda.synchronize() calls (hf-spec's stats timers: hf_spec.timing.clock)",
    }
    entry["oracle_rewrite_ms"] = time_oracle_rewrite(session, 10, device)
    syncs = entry["host_syncs"]
    log(start, f"{name}: per cycle: host reads {syncs.get('host_reads_per_cycle')}, synchronizing CUDA ops "
        f"{syncs.get('cuda_synchronizing_ops_per_cycle')}, explicit synchronize "
        f"{syncs.get('explicit_synchronize_per_cycle')}; oracle rewrite {entry['oracle_rewrite_ms']} ms")


def replot(path, out=None) -> dict:
    """README.md and engine_bench.png re-rendered from a results.json (into ``out``, default its folder)."""
    path = Path(path)
    results = json.loads(path.read_text())
    out = Path(out) if out else path.parent
    out.mkdir(parents=True, exist_ok=True)
    write_readme(results, out)
    write_plot(results, out)
    return results


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.replot:
        return replot(args.replot, args.out)
    start = time.perf_counter()
    deadline = start + args.budget_s
    threads = torch.get_num_threads()
    if args.tiny:
        torch.set_num_threads(1)  # tiny models: thread hand-offs cost more than the matmuls
    try:
        return _run(args, start, deadline)
    finally:
        torch.set_num_threads(threads)


def _run(args, start, deadline) -> dict:
    import transformers

    import hf_spec

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("No CUDA device: run with --tiny (CPU) or on a GPU machine.")
    results = {
        "meta": {
            "tiny": args.tiny,
            "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
            else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)",
            "dtype": "float32" if args.tiny else "bfloat16",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "transformers": transformers.__version__,
            "hf_spec": hf_spec.__version__,
            "commit": git_commit(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "prompts": args.prompts,
            "prompt_len": args.prompt_len,
            "new_tokens": args.new_tokens,
            "repeats": args.repeats,
            "shapes": {name: SHAPES[name] for name in args.shape_names},
            "taus": args.tau_values,
            "variants": {name: {key: value.to_dict() if hasattr(value, "to_dict") else value for key, value in kw.items()}
                         for name, kw in args.variants.items()},  # fmt: skip
            "methods": expected_methods(args.shape_names, args.tau_values, list(args.variants)),
            "cost_grid": args.grid,
            "draft_logit_std": DRAFT_LOGIT_STD,
            "layer_output_scale": LAYER_OUTPUT_SCALE,
            "budget_s": args.budget_s,
            "argv": args.argv,
        },
        "targets": {},
    }  # fmt: skip
    log(start, f"{results['meta']['device_name']}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"out {args.out_dir}")  # fmt: skip
    for i, name in enumerate(args.target_names):
        remaining = len(args.target_names) - i - 1
        if deadline - time.perf_counter() < (5.0 if args.tiny else 45.0):
            results["targets"][name] = {"status": "skipped", "skipped": "time budget", "methods": {}}
            continue
        try:
            run_target(name, args, results, deadline, start, remaining)
        except Exception as error:  # one target's failure must not cost the others their rows
            entry = results["targets"].setdefault(name, {"methods": {}})
            entry["status"] = "failed"
            entry["error"] = f"{type(error).__name__}: {error}"[:1000]
            log(start, f"{name} failed: {error!r}"[:500])
        gc.collect()  # the target, its drafter and sessions were locals of run_target
        if device.type == "cuda":
            torch._dynamo.reset()
            torch.cuda.empty_cache()
        results["meta"]["elapsed_s"] = round(time.perf_counter() - start, 1)
        write_all(results, args.out_dir)
    results["meta"]["elapsed_s"] = round(time.perf_counter() - start, 1)
    write_all(results, args.out_dir)
    log(start, f"done: {args.out_dir}/results.json, README.md, engine_bench.png")
    return results


if __name__ == "__main__":
    main()
