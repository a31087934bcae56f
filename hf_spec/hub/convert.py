"""Load drafters published in other formats: EAGLE-1 / EAGLE-2 / HASS checkpoints become an
:class:`~hf_spec.EagleDrafter`, EAGLE-3 and vLLM speculators ``eagle3`` checkpoints an
:class:`~hf_spec.Eagle3Drafter`, in memory (``save_pretrained`` then writes hf-spec's format).

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

The EAGLE-3 layout (SafeAILab/EAGLE ``eagle/model/cnets.py``): a Llama ``config.json`` (one layer) with
``draft_vocab_size``; ``fc.weight [H, 3H]`` over the target's hidden states at layers (2, L//2, L-3),
``midlayer.self_attn.{q,k,v}_proj.weight [., 2H]``, ``midlayer.self_attn.o_proj``, ``midlayer.mlp.*``,
``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``, ``norm.weight``, own
``lm_head.weight [D, H]``, ``d2t [D]`` (int64) and ``t2d [V]`` (bool); ``midlayer.`` becomes ``layers.0.``.

The speculators ``eagle3`` layout (vllm-project/speculators ``models/eagle3``): ``config.json`` with
``speculators_model_type: "eagle3"``, ``transformer_layer_config`` (the layer's Llama config),
``draft_vocab_size``, ``norm_before_residual`` (absent: true, as vLLM reads it),
``eagle_aux_hidden_state_layer_ids`` (absent: EAGLE-3's default), ``speculators_config.verifier``; tensors
``fc.weight``, ``layers.0.*`` (the same layer, ``hidden_norm`` included), ``norm.weight``, ``lm_head.weight``,
``d2t``, ``t2d``, and optional ``embed_tokens``/``verifier_*`` copies of the target's (ignored).

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
from ..drafters.layer_config import _NOT_LAYER_FIELDS
from ..drafters.registry import drafter_classes

HF_SPEC = "hf_spec"
EAGLE = "eagle"
EAGLE3 = "eagle3"
SPECULATORS_EAGLE3 = "speculators_eagle3"
SUPPORTED_LAYOUTS = {
    HF_SPEC: "hf-spec checkpoint (config.json with model_type hf_spec_*, model.safetensors)",
    EAGLE: "EAGLE-1 / EAGLE-2 / HASS (Llama config.json with num_hidden_layers 1; fc.weight [H, 2H] and "
    "layers.0.* in pytorch_model.bin or model.safetensors)",
    EAGLE3: "EAGLE-3 (midlayer.*, fc.weight [H, 3H], lm_head, d2t/t2d)",
    SPECULATORS_EAGLE3: "vLLM speculators eagle3 (config.json speculators_model_type 'eagle3'; fc, layers.0.*, norm, "
    "lm_head, d2t/t2d)",
}
NOT_YET_SUPPORTED = "vLLM speculators 'eagle' (fusion_fc.*, transformer.*) and other speculators types"
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_IGNORED_EAGLE_KEYS = ("embed_tokens.weight",)
_IGNORED_EAGLE3_PREFIXES = ("embed_tokens.", "verifier_")
_HUB_KWARGS = ("revision", "token", "cache_dir", "local_files_only", "force_download")
EAGLE_MODEL_TYPE, EAGLE3_MODEL_TYPE = "hf_spec_eagle", "hf_spec_eagle3"
"""The families external checkpoints convert to. Their classes come from :mod:`hf_spec.drafters.registry` by
``model_type``: this module never imports the drafter modules, whose ``from_pretrained`` calls it (through the
registry's Hub hooks), nor :mod:`hf_spec.drafters.auto` (:class:`~hf_spec.AutoDrafter`), which calls it too."""


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
    """The layout of a local checkpoint directory: ``"hf_spec"``, ``"eagle"`` (EAGLE-1/2, HASS), ``"eagle3"``
    or ``"speculators_eagle3"``;
    :class:`UnsupportedLayoutError` listing what was found and the supported layouts otherwise."""
    path = Path(path)
    if not path.is_dir():
        raise _unsupported(path, "not a directory")
    config = _read_config(path)
    model_type = str(config.get("model_type") or "")
    if model_type.startswith("hf_spec_"):
        return HF_SPEC
    if "speculators_model_type" in config:
        if config["speculators_model_type"] == "eagle3":
            return SPECULATORS_EAGLE3
        raise _unsupported(path, f"a speculators {config['speculators_model_type']!r} checkpoint")
    names = _weight_names(_weight_file(path))
    if any(n.startswith("midlayer.") for n in names) and "fc.weight" in names:
        return EAGLE3
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
            "EAGLE/HASS/EAGLE-3 checkpoints do not name their target's architecture reliably, so hf-spec needs the target. "
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

    fields = {k: v for k, v in eagle_config.items() if k not in ("bias", "qkv_bias", "head_dim", "model_type")}
    llama = LlamaConfig(**fields)  # defaults as EAGLE's own config class: rope_theta 10000, no scaling
    layer_config = {k: v for k, v in llama.to_dict().items() if k not in _NOT_LAYER_FIELDS}
    layer_config.pop("attention_bias", None)  # o_proj never has a bias in EAGLE
    layer_config["head_dim"] = llama.hidden_size // llama.num_attention_heads  # EAGLE ignores a head_dim field
    layer_config["model_type"] = "qwen2" if qkv_bias else "llama"
    return layer_config


def _check_hidden_size(what: str, path: Path, hidden: int, tconfig, declared_target: int | None = None,
                       why: str = "") -> None:
    """ValueError naming the fix unless the drafter's hidden size (and the target hidden size its config
    declares, if any) equals the target's."""
    text_config = tconfig.get_text_config()
    if hidden != text_config.hidden_size or (declared_target is not None and declared_target != hidden):
        raise ValueError(
            f"The {what} drafter at {str(path)!r} has hidden size {hidden} but the given target "
            f"({compat.model_name_or_path(tconfig) or text_config.model_type}) has {text_config.hidden_size}{why}. "
            "Fix: pass the target model (or its config) that this drafter was trained for."
        )


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
    EagleDrafterConfig, EagleDrafter = drafter_classes(EAGLE_MODEL_TYPE)
    path = Path(path)
    if detect_layout(path) != EAGLE:
        raise ValueError(f"{str(path)!r} is an hf-spec checkpoint, not an EAGLE one. Fix: use from_pretrained.")
    eagle_config = _read_config(path)
    tconfig = _target_config(target, target_config)
    text_config = tconfig.get_text_config()
    hidden = int(eagle_config.get("hidden_size", 0))
    _check_hidden_size("EAGLE", path, hidden, tconfig)
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
    config = EagleDrafterConfig(
        num_layers=num_layers,
        layer_config=eagle_layer_config(eagle_config, qkv_bias),
        training_method=training_method,
        converted_from={"format": "eagle", "source": source or str(path), "ignored_weights": sorted(ignored)},
        **EagleDrafterConfig.target_fields(tconfig, name_or_path),
        **config_kwargs,
    )
    return _load_converted(EagleDrafter(config), weights, "EAGLE", path, dtype, target)


def _load_converted(drafter, weights: dict, what: str, path: Path, dtype, target):
    """Load ``weights`` strictly into a freshly built ``drafter`` (names and shapes checked, a clear error
    otherwise), cast to ``dtype`` (``"auto"``: the checkpoint's floating dtype), eval mode, bound to ``target``."""
    if dtype == "auto":
        floats = {t.dtype for t in weights.values() if t.is_floating_point()}
        dtype = floats.pop() if len(floats) == 1 else None
    elif isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    expected = drafter.state_dict()
    problems = [f"missing {k}" for k in sorted(set(expected) - set(weights))]
    problems += [f"unexpected {k}" for k in sorted(set(weights) - set(expected))]
    problems += [f"{k}: shape {tuple(v.shape)} != {tuple(expected[k].shape)}" for k, v in weights.items()
                 if k in expected and v.shape != expected[k].shape]  # fmt: skip
    if problems:
        raise ValueError(f"The {what} checkpoint at {str(path)!r} does not match its config.json: " + "; ".join(problems[:10])
                         + ". Fix: check that config.json belongs to these weights.")  # fmt: skip
    drafter.load_state_dict(weights, strict=True)
    if dtype is not None:
        drafter.to(dtype)
    drafter.eval()
    return drafter.bind(target) if target is not None else drafter


def convert_eagle3(
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
    """An :class:`~hf_spec.Eagle3Drafter` from an EAGLE-3 or speculators ``eagle3`` checkpoint directory;
    arguments as :func:`convert_eagle`."""
    Eagle3DrafterConfig, Eagle3Drafter = drafter_classes(EAGLE3_MODEL_TYPE)
    path = Path(path)
    layout = detect_layout(path)
    if layout not in (EAGLE3, SPECULATORS_EAGLE3):
        raise ValueError(f"{str(path)!r} is a {layout!r} checkpoint, not an EAGLE-3 one. Fix: use AutoDrafter.from_pretrained.")
    config = _read_config(path)
    tconfig = _target_config(target, target_config)
    text_config = tconfig.get_text_config()
    if layout == SPECULATORS_EAGLE3:
        layer = dict(config.get("transformer_layer_config") or {})
        if layer.get("model_type", "llama") != "llama":
            raise ValueError(f"The speculators checkpoint at {str(path)!r} has a {layer['model_type']!r} decoder layer; "
                             "hf-spec's Eagle3Drafter converts Llama layers only. Fix: use a Llama-layer EAGLE-3 drafter.")  # fmt: skip
        if config.get("norm_before_fc") or int(layer.get("num_hidden_layers", 1)) != 1:
            raise ValueError(f"The speculators checkpoint at {str(path)!r} uses norm_before_fc or several decoder layers, "
                             "which Eagle3Drafter does not have. Fix: use a one-layer EAGLE-3 drafter.")  # fmt: skip
        layer_ids = config.get("eagle_aux_hidden_state_layer_ids")
        norm_before_residual = config.get("norm_before_residual", True)  # vLLM's default when absent
        prefix = "layers.0."
    else:
        layer, layer_ids, norm_before_residual, prefix = config, None, False, "midlayer."
    hidden = int(layer.get("hidden_size", 0))
    _check_hidden_size("EAGLE-3", path, hidden, tconfig, int(config.get("target_hidden_size") or hidden),
                       " (hf-spec borrows the target's embedding, so they must match)")  # fmt: skip

    weights = _load_weights(_weight_file(path))
    ignored = sorted(k for k in weights if k.startswith(_IGNORED_EAGLE3_PREFIXES) or k.endswith("rotary_emb.inv_freq"))
    weights = {("layers.0." + k[len(prefix):] if k.startswith(prefix) else k): v for k, v in weights.items()
               if k not in ignored}  # fmt: skip
    draft_size = weights["lm_head.weight"].shape[0] if "lm_head.weight" in weights else None
    if "d2t" not in weights and draft_size != text_config.vocab_size:
        raise ValueError(f"The EAGLE-3 checkpoint at {str(path)!r} has no d2t/t2d map but a {draft_size}-row head for a "
                         f"{text_config.vocab_size}-token target. Fix: add the checkpoint's d2t and t2d tensors.")  # fmt: skip
    if "t2d" in weights:
        weights["t2d"] = weights["t2d"].bool()
    drafter_config = Eagle3DrafterConfig.for_target(
        tconfig,
        name_or_path,
        layer_config=eagle_layer_config({k: v for k, v in layer.items() if k != "draft_vocab_size"}, qkv_bias=False),
        eagle_aux_hidden_state_layer_ids=layer_ids,
        norm_before_residual=norm_before_residual,
        fc_bias="fc.bias" in weights,
        draft_vocab_size=draft_size if "d2t" in weights else None,
        training_method=training_method,
        converted_from={"format": layout, "source": source or str(path), "ignored_weights": ignored},
        **config_kwargs,
    )
    return _load_converted(Eagle3Drafter(drafter_config), weights, "EAGLE-3", path, dtype, target)


CONVERTERS = {EAGLE: (EAGLE_MODEL_TYPE, convert_eagle), EAGLE3: (EAGLE3_MODEL_TYPE, convert_eagle3),
              SPECULATORS_EAGLE3: (EAGLE3_MODEL_TYPE, convert_eagle3)}  # fmt: skip
"""layout -> (``model_type`` of the hf-spec family it converts to, converter)."""


def convert_to_family(cls, name_or_path, target, target_config, kwargs: dict):
    """The drafters' ``"convert"`` Hub hook (:data:`~hf_spec.drafters.registry.HUB_HOOKS`), which a family's
    ``from_pretrained`` calls: ``name_or_path`` converted to ``cls`` (and bound to ``target`` when given) when it
    holds another format; None for an hf-spec checkpoint, which transformers loads. ``kwargs``: the
    ``from_pretrained`` options, left as they are when it returns None."""
    if name_or_path is None:  # transformers' from_pretrained(None, config=..., state_dict=...)
        return None
    layout, path = resolve(name_or_path, **{k: kwargs[k] for k in _HUB_KWARGS if k in kwargs})
    if layout not in CONVERTERS:
        return None
    model_type, converter = CONVERTERS[layout]
    if cls.config_class.model_type != model_type:
        family = drafter_classes(model_type)[1].__name__
        raise ValueError(f"{name_or_path!r} is a {layout} checkpoint, which converts to {family}, not "
                         f"{cls.__name__}. Fix: load it with {family} or AutoDrafter.")  # fmt: skip
    options = {k: v for k, v in kwargs.items() if k not in _HUB_KWARGS}
    return converter(path, target, target_config, source=str(name_or_path), **options)


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
