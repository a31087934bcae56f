"""Load drafters published in other formats: EAGLE-1 / EAGLE-2 / HASS checkpoints become an
:class:`~hf_spec.EagleDrafter` in memory (``save_pretrained`` then writes hf-spec's format).

The EAGLE-1/2/HASS layout (read from SafeAILab/EAGLE ``eagle/model/cnets1.py`` + ``ea_model.py``
and HArmonizedSS/HASS ``model/cnets.py``):

- ``config.json``: a Llama config (``num_hidden_layers: 1``) plus optional ``bias`` (fc bias,
  true when absent) and ``qkv_bias`` (Qwen2 targets: biases on q/k/v, never on o_proj);
- ``pytorch_model.bin`` or ``model.safetensors``: ``fc.weight [H, 2H]`` (+ ``fc.bias``),
  ``layers.{i}.self_attn.{q,k,v,o}_proj.*``, ``layers.{i}.mlp.{gate,up,down}_proj.weight``,
  ``layers.{i}.post_attention_layernorm.weight`` (and ``input_layernorm`` for i > 0), an optional
  frozen ``embed_tokens.weight [V, H]``;
- forward: ``fc(cat[embed(token), feature])`` -> decoder layers (layer 0 without input norm, head
  dim = hidden / heads) -> the target's LM head, no final norm. That is hf-spec's EagleDrafter, so
  the weight names map one to one; the layer family is Qwen2's when q/k/v carry biases, else Llama's.

``embed_tokens`` is ignored: hf-spec borrows the target's embedding at bind time (EAGLE loads the
same frozen matrix from the target). The EAGLE config does not name its target reliably, so the
target's config must be given (``target=`` or ``target_config=``).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch

from .. import compat

HF_SPEC = "hf_spec"
EAGLE = "eagle"
SUPPORTED_LAYOUTS = {
    HF_SPEC: "hf-spec checkpoint (config.json with model_type hf_spec_*, model.safetensors)",
    EAGLE: "EAGLE-1 / EAGLE-2 / HASS (Llama config.json with num_hidden_layers 1; fc.weight [H, 2H] and "
    "layers.0.* in pytorch_model.bin or model.safetensors)",
}
NOT_YET_SUPPORTED = "EAGLE-3 (midlayer.*, d2t/t2d, fc [H, 3H]) and vLLM speculators (speculators_model_type)"
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_IGNORED_EAGLE_KEYS = ("embed_tokens.weight",)
_HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "force_download")


class UnsupportedLayoutError(ValueError):
    """A directory whose files match no drafter layout hf-spec can load."""


def _unsupported(path: Path, found: str) -> UnsupportedLayoutError:
    files = sorted(p.name for p in path.iterdir()) if path.is_dir() else []
    layouts = "; ".join(f"{name}: {text}" for name, text in SUPPORTED_LAYOUTS.items())
    return UnsupportedLayoutError(
        f"{str(path)!r} is not a drafter checkpoint hf-spec can load ({found}; files: {files}). "
        f"Supported layouts: {layouts}. Not yet supported: {NOT_YET_SUPPORTED}."
    )


def _read_config(path: Path) -> dict:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise _unsupported(path, "no config.json")
    return json.loads(config_file.read_text(encoding="utf-8"))


def _weight_file(path: Path) -> Path:
    for name in _WEIGHT_FILES:
        if (path / name).is_file():
            return path / name
    shards = sorted(p.name for p in path.glob("*.index.json"))
    if shards:
        raise ValueError(
            f"{str(path)!r} holds a sharded checkpoint ({', '.join(shards)}); converting drafters from shards is "
            "not supported. Fix: merge the shards into one model.safetensors (a one-layer drafter fits one file)."
        )
    raise _unsupported(path, f"no weights file ({' or '.join(_WEIGHT_FILES)})")


def _weight_names(weight_file: Path) -> list[str]:
    if weight_file.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(weight_file), framework="pt") as f:
            return list(f.keys())
    try:  # memory-mapped: names without reading the tensors (zip-format files, torch >= 1.6)
        return list(torch.load(str(weight_file), weights_only=True, map_location="cpu", mmap=True))
    except RuntimeError:
        return list(_load_weights(weight_file))


def _load_weights(weight_file: Path) -> dict[str, torch.Tensor]:
    """Weights of one file; pickle is read only with ``weights_only=True`` (tensors, no code)."""
    if weight_file.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(weight_file))
    return torch.load(str(weight_file), weights_only=True, map_location="cpu")


def detect_layout(path: str | os.PathLike) -> str:
    """The layout of a local checkpoint directory: ``"hf_spec"`` or ``"eagle"`` (EAGLE-1/2, HASS);
    :class:`UnsupportedLayoutError` listing what was found and the supported layouts otherwise."""
    path = Path(path)
    if not path.is_dir():
        raise _unsupported(path, "not a directory")
    config = _read_config(path)
    model_type = str(config.get("model_type") or "")
    if model_type.startswith("hf_spec_"):
        return HF_SPEC
    if "speculators_model_type" in config:
        raise _unsupported(path, f"a speculators {config['speculators_model_type']!r} checkpoint")
    names = _weight_names(_weight_file(path))
    if any(n.startswith("midlayer.") for n in names) or "d2t" in names or "draft_vocab_size" in config:
        raise _unsupported(path, "an EAGLE-3 checkpoint")
    is_llama = model_type == "llama" or "LlamaForCausalLM" in (config.get("architectures") or [])
    if is_llama and "fc.weight" in names and any(n.startswith("layers.0.") for n in names):
        return EAGLE
    shown = ", ".join(sorted(names)[:8]) + (", ..." if len(names) > 8 else "")
    raise _unsupported(path, f"config model_type {model_type!r}, weights {shown}")


def _target_config(target, target_config):
    if target is not None:
        return target.config
    if target_config is None:
        raise ValueError(
            "EAGLE/HASS checkpoints do not name their target's architecture reliably, so hf-spec needs the target. "
            "Fix: pass target=<the loaded target model> or target_config=AutoConfig.from_pretrained(<target name>)."
        )
    if isinstance(target_config, (str, os.PathLike)):
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(target_config)
    return target_config


def eagle_layer_config(eagle_config: dict, qkv_bias: bool) -> dict:
    """The drafter's ``layer_config`` for an EAGLE config: Llama's decoder layer, or Qwen2's (the same
    layer with q/k/v biases) when the checkpoint's q/k/v projections carry biases."""
    from transformers import LlamaConfig

    from ..drafters.eagle import _NOT_LAYER_FIELDS

    fields = {k: v for k, v in eagle_config.items() if k not in ("bias", "qkv_bias", "head_dim", "model_type")}
    llama = LlamaConfig(**fields)  # defaults as EAGLE's own config class: rope_theta 10000, no scaling
    layer_config = {k: v for k, v in llama.to_dict().items() if k not in _NOT_LAYER_FIELDS}
    layer_config.pop("attention_bias", None)  # o_proj never has a bias in EAGLE
    layer_config["head_dim"] = llama.hidden_size // llama.num_attention_heads  # EAGLE ignores a head_dim field
    layer_config["model_type"] = "qwen2" if qkv_bias else "llama"
    return layer_config


def convert_eagle(
    path: str | os.PathLike,
    target=None,
    target_config=None,
    *,
    dtype: torch.dtype | str | None = "auto",
    training_method: str | None = None,
    name_or_path: str | None = None,
    source: str | None = None,
    **config_kwargs,
):
    """An :class:`~hf_spec.EagleDrafter` from an EAGLE-1/2 or HASS checkpoint directory.

    Args:
        target: the loaded target model; the drafter is bound to it (device and dtype too).
        target_config: the target's config (or its name/path) when no target is given.
        dtype: ``"auto"``: the checkpoint's dtype; None: float32; or a torch dtype.
        training_method: ``"eagle"`` (default) or ``"hass"`` (picks the model card).
        name_or_path: the target's name recorded in the config (default: the target config's).
        source: where the checkpoint came from, recorded in ``config.converted_from`` (default: ``path``).
    """
    from ..drafters.eagle import EagleDrafter, EagleDrafterConfig

    path = Path(path)
    if detect_layout(path) != EAGLE:
        raise ValueError(f"{str(path)!r} is an hf-spec checkpoint, not an EAGLE one. Fix: use from_pretrained.")
    eagle_config = _read_config(path)
    tconfig = _target_config(target, target_config)
    text_config = tconfig.get_text_config()
    hidden = int(eagle_config.get("hidden_size", 0))
    if hidden != text_config.hidden_size:
        raise ValueError(
            f"The EAGLE drafter at {str(path)!r} has hidden size {hidden} but the given target "
            f"({compat.model_name_or_path(tconfig) or text_config.model_type}) has {text_config.hidden_size}. "
            "Fix: pass the target model (or its config) that this drafter was trained for."
        )
    eagle_vocab = eagle_config.get("vocab_size")
    if eagle_vocab is not None and eagle_vocab != text_config.vocab_size:
        warnings.warn(f"EAGLE config vocab_size {eagle_vocab} != target's {text_config.vocab_size}: the drafter may "
                      "have been trained for another target.", stacklevel=2)  # fmt: skip

    weights = _load_weights(_weight_file(path))
    ignored = [k for k in weights if k in _IGNORED_EAGLE_KEYS or k.endswith("rotary_emb.inv_freq")]
    for key in ignored:  # embed_tokens: hf-spec borrows the target's; inv_freq: recomputed from the config
        del weights[key]
    num_layers = int(eagle_config.get("num_hidden_layers", 1))
    qkv_bias = "layers.0.self_attn.q_proj.bias" in weights
    if "fc.bias" not in weights:  # bias: false checkpoints (HASS on LLaMA-3): an all-zero bias is the same map
        weights["fc.bias"] = torch.zeros(hidden, dtype=weights["fc.weight"].dtype)
    if dtype == "auto":
        floats = {t.dtype for t in weights.values() if t.is_floating_point()}
        dtype = floats.pop() if len(floats) == 1 else None
    elif isinstance(dtype, str):
        dtype = getattr(torch, dtype)

    config = EagleDrafterConfig(
        num_layers=num_layers,
        layer_config=eagle_layer_config(eagle_config, qkv_bias),
        training_method=training_method,
        converted_from={"format": "eagle", "source": source or str(path), "ignored_weights": sorted(ignored)},
        **EagleDrafterConfig.target_fields(tconfig, name_or_path),
        **config_kwargs,
    )
    drafter = EagleDrafter(config)
    expected = drafter.state_dict()
    problems = [f"missing {k}" for k in sorted(set(expected) - set(weights))]
    problems += [f"unexpected {k}" for k in sorted(set(weights) - set(expected))]
    problems += [f"{k}: shape {tuple(v.shape)} != {tuple(expected[k].shape)}" for k, v in weights.items()
                 if k in expected and v.shape != expected[k].shape]  # fmt: skip
    if problems:
        raise ValueError(f"The EAGLE checkpoint at {str(path)!r} does not match its config.json: " + "; ".join(problems[:10])
                         + ". Fix: check that config.json belongs to these weights (EAGLE-3 checkpoints are not yet supported).")  # fmt: skip
    drafter.load_state_dict(weights, strict=True)
    if dtype is not None:
        drafter.to(dtype)
    drafter.eval()
    return drafter.bind(target) if target is not None else drafter


def split_hub_kwargs(kwargs: dict) -> dict:
    """Pop the Hub download options (revision, token, cache_dir…) out of ``kwargs``."""
    return {k: kwargs.pop(k) for k in _HUB_KWARGS if k in kwargs}


def resolve(name_or_path: str | os.PathLike, **hub_kwargs) -> tuple[str, Path | None]:
    """``(layout, local directory)`` of a checkpoint. A local directory is used as is; otherwise
    ``name_or_path`` is a Hub repo id: its ``config.json`` is fetched, and an external layout is
    downloaded with ``huggingface_hub.snapshot_download`` (config and weight files only). For an
    hf-spec repo the directory is None: transformers' ``from_pretrained`` fetches it itself."""
    if os.path.isdir(name_or_path):
        return detect_layout(name_or_path), Path(name_or_path)
    from huggingface_hub import hf_hub_download, snapshot_download

    config = json.loads(Path(hf_hub_download(str(name_or_path), "config.json", **hub_kwargs)).read_text(encoding="utf-8"))
    if str(config.get("model_type") or "").startswith("hf_spec_"):
        return HF_SPEC, None
    path = Path(snapshot_download(str(name_or_path), allow_patterns=["*.json", *_WEIGHT_FILES], **hub_kwargs))
    return detect_layout(path), path


class AutoDrafter:
    """Loads any drafter hf-spec understands: its own checkpoints through ``AutoModel``, EAGLE-1/2 and
    HASS checkpoints converted to :class:`~hf_spec.EagleDrafter` (see :mod:`hf_spec.hub.convert`)."""

    def __init__(self):
        raise TypeError("AutoDrafter is not instantiated; use AutoDrafter.from_pretrained(path, target=...).")

    @classmethod
    def from_pretrained(cls, name_or_path, target=None, *, target_config=None, **kwargs):
        """The drafter at a local directory or Hub repo id, bound to ``target`` when given.

        Args:
            target: the loaded target model (required for EAGLE/HASS checkpoints unless ``target_config``).
            target_config: the target's config, name or path (EAGLE/HASS without ``target``).
            kwargs: ``from_pretrained`` options (``dtype``, ``revision``…); EAGLE/HASS: those of
                :func:`convert_eagle` and the Hub download options.
        """
        hub_kwargs = split_hub_kwargs(kwargs)
        layout, path = resolve(name_or_path, **hub_kwargs)
        if layout == EAGLE:
            return convert_eagle(path, target, target_config, source=str(name_or_path), **kwargs)
        from transformers import AutoModel

        import hf_spec  # noqa: F401  (registers the drafter classes with AutoModel)

        drafter = AutoModel.from_pretrained(str(path or name_or_path), **hub_kwargs, **kwargs)
        return drafter.bind(target) if target is not None else drafter
