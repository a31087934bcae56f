"""Tiny random targets and drafters built from configs, shared by the unit tests."""

from __future__ import annotations

import collections
import contextlib
import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.generation.streamers import BaseStreamer

import hf_spec
from hf_spec import attention_kernels, linear_kernels
from hf_spec.decoding import _Target
from hf_spec.drafters.session import DraftingSession
from hf_spec.training.losses import eagle_loss

FAMILIES = ("llama", "qwen2", "mistral")

# Tiny models: thread hand-offs cost more than the matmuls (30x slower with 2 threads on a busy CI box).
torch.set_num_threads(1)

_COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    bos_token_id=0,
    eos_token_id=None,
    pad_token_id=0,
)


def make_target(family: str = "llama", vocab_size: int = 128, seed: int = 0, logit_scale: float = 30.0, **overrides):
    """A tiny random causal LM of ``family`` in fp32, eval mode, with peaked next-token distributions."""
    torch.manual_seed(seed)
    kwargs = {**_COMMON, "vocab_size": vocab_size, **overrides}
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**kwargs))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**kwargs))
    elif family == "mistral":
        model = MistralForCausalLM(MistralConfig(**{"sliding_window": None, **kwargs}))
    else:
        raise ValueError(family)
    with torch.no_grad():  # random init gives near-uniform next-token distributions; sharpen them
        model.get_output_embeddings().weight.mul_(logit_scale)
    model.generation_config.pad_token_id = 0
    return model.eval()


def random_prompt(length: int = 10, vocab_size: int = 128, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab_size, (1, length), generator=g)


def train_drafter_on_outputs(target, drafter, steps: int = 400, num_sequences: int = 128, length: int = 40,
                             batch_size: int = 32, do_sample: bool = False, seed: int = 0, lr: float = 3e-3):  # fmt: skip
    """Fit ``drafter`` to ``target``'s own generations with the EAGLE loss (a near-oracle drafter)."""
    vocab = target.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(1, vocab, (num_sequences, 4), generator=g)
    with torch.no_grad():
        torch.manual_seed(seed)
        hf_spec.uninstall()
        try:
            data = target.generate(prompts, max_new_tokens=length, do_sample=do_sample, min_new_tokens=length)
        finally:
            hf_spec.install()
        features = target.base_model(input_ids=data).last_hidden_state
        logits = target.get_output_embeddings()(features)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=lr)
    drafter.train()
    for _ in range(steps):
        rows = torch.randint(0, num_sequences, (batch_size,), generator=g)
        ids, feats, target_logits = data[rows], features[rows], logits[rows]
        out = drafter(input_ids=ids[:, 1:], hidden_states=feats[:, :-1], output_logits=True)
        loss = eagle_loss(out.last_hidden_state[:, :-1], feats[:, 1:-1], out.logits[:, :-1], target_logits[:, 1:-1])
        loss = loss["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    drafter.eval()
    return drafter


@functools.lru_cache(maxsize=None)
def _cached_oracle(family: str, vocab_size: int, do_sample: bool, overrides: tuple):
    target = make_target(family, vocab_size=vocab_size, **dict(overrides))
    drafter = hf_spec.EagleDrafter.from_target(target)
    train_drafter_on_outputs(target, drafter, do_sample=do_sample)
    return target, drafter


def oracle_pair(family: str = "llama", vocab_size: int = 128, do_sample: bool = False, **overrides):
    """(target, drafter trained on the target's outputs), cached for the session."""
    return _cached_oracle(family, vocab_size, do_sample, tuple(sorted(overrides.items())))


def sorted_loss_before_after_training(drafter, rows, output_dir, max_steps: int, learning_rate: float):
    """(loss before, loss after) ``max_steps`` bf16 SortedTrainer steps of a sorted drafter on ``rows``
    (one batch of 8), both measured in eval mode on the same batch."""
    from hf_spec.training.s2d_trainer import SortedTrainer, SortedTrainingConfig, pad_collator

    batch = pad_collator(0)(rows)
    with torch.no_grad():
        before = float(drafter(batch["input_ids"], labels=batch["labels"]).loss)
    args = SortedTrainingConfig(output_dir=str(output_dir), max_steps=max_steps, per_device_train_batch_size=8,
                                gradient_accumulation_steps=1, learning_rate=learning_rate, warmup_ratio=0.0, bf16=True,
                                save_strategy="no", logging_strategy="no", use_cpu=True, dataloader_num_workers=0)  # fmt: skip
    SortedTrainer(model=drafter.train(), args=args, train_dataset=rows, data_collator=pad_collator(0)).train()
    drafter.eval()
    with torch.no_grad():
        after = float(drafter(batch["input_ids"], labels=batch["labels"]).loss)
    return before, after


def save_and_read_keys(drafter, ids, path):
    """Each exit's logits on ``ids`` before saving, then ``drafter.save_pretrained(path)``; returns (logits, saved keys)."""
    from safetensors import safe_open

    with torch.no_grad():
        reference = [t.clone() for t in drafter(ids).logits_per_exit]
    drafter.save_pretrained(path)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        return reference, set(f.keys())


def plain_generate(target, input_ids, **kwargs):
    """transformers' own generate(), bypassing hf-spec's routing entirely."""
    hf_spec.uninstall()
    try:
        return target.generate(input_ids, **kwargs)
    finally:
        hf_spec.install()


def assert_greedy_is_plain_generate(family: str, block) -> None:
    """Greedy hf-spec decoding of one prompt inside ``block`` (a context manager: a forced kernel) equals plain
    ``generate()``'s, with the drafts verified (not skipped)."""
    target, drafter = oracle_pair(family)
    prompt = random_prompt(12)
    expected = plain_generate(target, prompt, max_new_tokens=40, do_sample=False)
    with block:
        out = target.generate(prompt, assistant_model=drafter, max_new_tokens=40, do_sample=False)
    assert torch.equal(out, expected)
    assert drafter.last_generation_stats.tau > 1.5


@pytest.fixture
def fresh_kernel_choices(monkeypatch):
    """The CPU kernels measure from scratch: the process's linear and attention kernel choices, trials, evidence,
    warm-up counts and packed weights are emptied for the test (they would otherwise carry over between tests)."""
    for module in (linear_kernels, attention_kernels):
        for name in ("_tables", "_trials", "_made", "_evidence"):
            monkeypatch.setattr(module, name, {})
    monkeypatch.setattr(attention_kernels, "_warmups", {})
    monkeypatch.setattr(linear_kernels, "_warmups", linear_kernels.weakref.WeakKeyDictionary())
    monkeypatch.setattr(linear_kernels, "_packed", linear_kernels.weakref.WeakKeyDictionary())


@pytest.fixture(autouse=True)
def drafting_every_cycle_unless_asked(monkeypatch):
    """Tests exercise what they name: the speed controller (whose choices follow the machine's timings) only where
    a test passes ``speed_controller`` itself; elsewhere the configured shape drafts every cycle."""
    monkeypatch.setattr(hf_spec.generation, "SPEED_CONTROL_BY_DEFAULT", False)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``cuda`` skip on machines without a CUDA GPU."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is false)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the packaged SmolLM2-135M-Instruct in float32, loaded once for the whole session and
    shared by every integration test and the README session (tests must not change them: the README session gets
    its own tokenizer); skips when its package is missing, with the pip command."""
    from hf_spec.demo import DEFAULT_TARGET
    from hf_spec.resources import MissingPackageError, install_command, package_dir

    entry = hf_spec.PACKAGED_MODELS[DEFAULT_TARGET]
    try:
        package_dir(entry.packages[0])
    except MissingPackageError:
        pytest.skip(f"SmolLM2 package missing: {install_command(entry.packages)}")
    return hf_spec.load_packaged_model(DEFAULT_TARGET, dtype=torch.float32)


class CallCountingStreamer(BaseStreamer):
    """A streamer that counts put()/end() calls (tests that rejected calls stream nothing)."""

    def __init__(self):
        self.calls = 0

    def put(self, value):
        self.calls += 1

    def end(self):
        self.calls += 1


SYNC_METHODS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")
"""Tensor methods through which Python reads a value back to the host (a device sync on a GPU)."""

_SHAPE_OPS = {"nonzero", "argwhere", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive",
              "unique_dim_consecutive", "bincount"}  # fmt: skip
"""aten ops whose output shape depends on tensor values: on a GPU each waits for the device (an implicit sync)."""


def _is_mask(index) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def shape_op_name(func, args, kwargs) -> str | None:
    """The name of aten op ``func`` when its output shape depends on tensor values (an implicit host sync on a
    GPU: boolean-mask indexing, ``nonzero``, ``where(cond)``, ``masked_select``, ``repeat_interleave`` by a
    tensor without ``output_size``, ``unique``, ``bincount``), else None. ``x[mask] = v`` counts unless ``v``
    is 0-dim (a Python scalar: torch runs ``masked_fill_``; a 0-dim device tensor, which syncs, is not told
    apart)."""
    name = func.overloadpacket.__name__.rstrip("_")
    if name in _SHAPE_OPS or (name == "where" and len(args) == 1):
        return name
    if name == "repeat_interleave" and func._overloadname in ("Tensor", "self_Tensor") \
            and kwargs.get("output_size") is None:
        return name
    if name in ("index", "index_put") and any(_is_mask(index) for index in args[1]):
        if name == "index_put" and args[2].dim() == 0:
            return None
        return "bool-mask " + ("indexing" if name == "index" else "assignment")
    return None


class _ShapeOpCounter(TorchDispatchMode):
    """Counts :func:`shape_op_name` ops per phase into ``counts["shape_ops"]`` (and by name into
    ``counts["shape_op_names"]``), reading the phase from ``phase()``."""

    def __init__(self, counts, phase):
        super().__init__()
        self.counts, self.phase = counts, phase

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = shape_op_name(func, args, kwargs)
        if name is not None:
            phase = self.phase()
            self.counts["shape_ops"][phase] += 1
            self.counts["shape_op_names"][f"{phase}: {name}"] += 1
        return func(*args, **kwargs)


def _session_classes(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _session_classes(sub)


@contextlib.contextmanager
def count_host_syncs():
    """Count, while active, host reads of tensor values (``SYNC_METHODS``) split into those inside a drafting
    session's ``propose`` (any :class:`~hf_spec.drafters.session.DraftingSession` subclass: "drafter") and the
    rest ("loop"), and the target's LM-head calls (``_Target.logits``, "head"). Ops whose output shape depends
    on data (boolean indexing, ``nonzero``..., :func:`shape_op_name`) sync inside C++: they are counted per
    phase in ``counts["shape_ops"]`` ({"drafter": n, "loop": n}), by name in ``counts["shape_op_names"]``.
    Yields the dict of counts; restores everything on exit."""
    counts = {"loop": 0, "drafter": 0, "head": 0, "shape_ops": {"loop": 0, "drafter": 0},
              "shape_op_names": collections.Counter()}  # fmt: skip
    depth = [0]  # nesting of propose calls (a hybrid session calls its family's)
    saved = [(torch.Tensor, name, getattr(torch.Tensor, name)) for name in SYNC_METHODS]
    sessions = [(cls, "propose", cls.__dict__["propose"]) for cls in _session_classes(DraftingSession)
                if "propose" in cls.__dict__]  # fmt: skip
    original_logits = _Target.logits

    def phase() -> str:
        return "drafter" if depth[0] else "loop"

    def counting(original):
        def wrapper(self, *args, **kwargs):
            counts[phase()] += 1
            return original(self, *args, **kwargs)

        return wrapper

    def drafting(original):
        def propose(self, *args, **kwargs):
            depth[0] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                depth[0] -= 1

        return propose

    def counting_logits(self, features):
        counts["head"] += 1
        return original_logits(self, features)

    try:
        for owner, name, original in saved:
            setattr(owner, name, counting(original))
        for owner, name, original in sessions:
            setattr(owner, name, drafting(original))
        _Target.logits = counting_logits
        with _ShapeOpCounter(counts, phase):
            yield counts
    finally:
        for owner, name, original in saved + sessions:
            setattr(owner, name, original)
        _Target.logits = original_logits
