"""What the machine at hand computes natively, and the dtype that follows from it.

Speculative decoding pays only where one target forward over k tree tokens costs much less than k
single-token forwards. On a CPU without native bfloat16 arithmetic (no AVX512-BF16 or AMX on x86, no
BF16 on Arm) PyTorch emulates bf16 matrix products: a one-token step is still fast (it is bound by
reading the weights, and bf16 weights are half the bytes), but a k-token forward costs about k steps,
so no draft tree can pay. Measured on a 2-core AMD EPYC (Zen 3, AVX2 only), SmolLM2-135M, 2 threads,
one forward after a 200-token prefix: bf16 38 ms for 1 token, 249 ms for 16, 481 ms for 32; float32
66 / 135 / 185 ms. There float32 is the dtype for speculative
decoding; ``dtype="auto"`` (the CLI default) picks it.

float32 products go to MKL, whose default dispatch on AMD CPUs takes a slow path for the few-row
products of tree verification: there the same 30-layer SmolLM2 forward over 2/4/8/16 tokens took
129/113/121/132 ms by default and 80/88/92/111 ms with ``MKL_CBWR=AUTO`` (one token: 73 vs 69 ms).
:func:`configure_mkl` sets that when ``hf_spec`` is imported on an AMD CPU, unless ``MKL_CBWR`` is
already set (MKL reads it at its first call: import hf_spec before any float32 matrix product, or
export it yourself).
"""

from __future__ import annotations

import os
import platform
import warnings
from functools import lru_cache

import torch

NATIVE_BF16_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
"""/proc/cpuinfo flags that mean bf16 matrix products run natively (x86: AVX512-BF16, AMX; Arm: BF16)."""

DTYPE_NAMES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def _cpuinfo_field(*keys: str) -> str | None:
    """The first /proc/cpuinfo line named one of ``keys``, its value; None where there is none (not Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in keys:
                    return value.strip()
    except OSError:
        pass
    return None


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags from /proc/cpuinfo (``flags`` on x86, ``Features`` on Arm); None where
    they cannot be read (not Linux)."""
    value = _cpuinfo_field("flags", "Features")
    return None if value is None else frozenset(value.split())


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo's ``model name``), else what :mod:`platform` knows: for results files."""
    return _cpuinfo_field("model name") or platform.processor() or platform.machine()


def cpu_vendor() -> str | None:
    """/proc/cpuinfo's ``vendor_id`` (``AuthenticAMD``, ``GenuineIntel``), None where it cannot be read."""
    return _cpuinfo_field("vendor_id")


def configure_mkl() -> str | None:
    """Set ``MKL_CBWR=AUTO`` on an AMD CPU when PyTorch uses MKL and the variable is unset (see the module
    docstring for the measurement); returns the value set, or None when nothing was changed."""
    if "MKL_CBWR" in os.environ or cpu_vendor() != "AuthenticAMD" or not torch.backends.mkl.is_available():
        return None
    os.environ["MKL_CBWR"] = "AUTO"
    return "AUTO"


def native_bf16(device: torch.device | str = "cpu") -> bool:
    """Whether ``device`` multiplies bf16 matrices natively: CUDA devices that support bf16; CPUs whose
    flags say so (:data:`NATIVE_BF16_CPU_FLAGS`). A CPU whose flags cannot be read counts as native on
    Apple silicon and as not native elsewhere."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return True
    flags = cpu_flags()
    if flags is None:
        return platform.system() == "Darwin" and platform.machine() == "arm64"
    return bool(flags & NATIVE_BF16_CPU_FLAGS)


def resolve_dtype(name: str, device: torch.device | str = "cpu") -> torch.dtype:
    """``"auto"``: bfloat16 where ``device`` computes it natively, else float32; otherwise the named
    dtype (``bfloat16``, ``float32``, ``float16``)."""
    if name == "auto":
        return torch.bfloat16 if native_bf16(device) else torch.float32
    if name not in DTYPE_NAMES:
        raise ValueError(f"Unknown dtype {name!r}. Fix: use one of 'auto', {', '.join(map(repr, DTYPE_NAMES))}.")
    return DTYPE_NAMES[name]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: the name every ``--dtype`` option and record uses."""
    return str(dtype).removeprefix("torch.")


def machine_info(dtype: torch.dtype, device=None) -> dict:
    """CPU model, core count, library versions, dtype and the device (its GPU's name on CUDA), for results files
    and for the key of a cached timing (:mod:`hf_spec.verify_cost`)."""
    import transformers

    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.cuda.is_available(),
        "load_average_1_5_15min": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "dtype": dtype_name(dtype),
        "device": str(device or "cpu"),
        **({"gpu": torch.cuda.get_device_name(device)} if device is not None and torch.device(device).type == "cuda" else {}),
    }


_warned = False


def warn_if_emulated_bf16(model) -> None:
    """Warn once per process when ``model`` runs in bf16 on a CPU that emulates it (see the module
    docstring): speculative decoding then loses to plain decoding, whatever the drafter."""
    global _warned
    if _warned or model.dtype != torch.bfloat16 or model.device.type != "cpu" or native_bf16("cpu"):
        return
    _warned = True
    warnings.warn(
        "The target runs in bfloat16 on a CPU without native bf16 (no AVX512-BF16/AMX): PyTorch emulates it, so "
        "verifying k draft tokens costs about k decoding steps and speculative decoding cannot pay here. Fix: load "
        "the target in float32 (torch_dtype=torch.float32), or use `--dtype auto` on the hf-spec commands.",
        stacklevel=3,
    )
