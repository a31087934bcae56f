"""Export hf-spec drafters to the `speculators <https://github.com/vllm-project/speculators>`_ format,
which vLLM serves.

What exports, checked by loading every export with the real ``speculators`` 0.9.0 package
(``tests/test_speculators_export.py``):

- :class:`~hf_spec.Eagle3Drafter` -> ``speculators_model_type: "eagle3"`` (``Eagle3SpeculatorConfig`` /
  ``Eagle3DraftModel`` of speculators 0.9). ``config.json``: ``transformer_layer_config`` (the
  drafter's one Llama decoder layer: the target's hidden size and vocabulary, no biases),
  ``draft_vocab_size`` (D, or V without a draft vocabulary), ``norm_before_residual`` (always
  written: speculators defaults it to false, vLLM to true when absent), ``target_hidden_size``,
  ``eagle_aux_hidden_state_layer_ids`` (the fused target layers; HF ``hidden_states[i]``, the
  inputs of those layers, which is what vLLM's auxiliary hidden states are), ``norm_before_fc`` /
  ``fc_norm`` / ``norm_output`` false (the EAGLE-3 drafter has none of them), and the
  ``speculators_config`` block (algorithm ``eagle3``, a greedy proposal, ``verifier`` = the target).
  ``model.safetensors``: our tensors under the same names, which are speculators' names:
  ``fc.weight``, ``layers.0.*`` (``hidden_norm`` included), ``norm.weight``, ``lm_head.weight``
  and, with a draft vocabulary, ``d2t`` (int64, target id = i + d2t[i]) and ``t2d`` (bool).
  ``embed_tokens`` is not written: speculators loads it from the verifier, as hf-spec borrows the
  target's. :func:`hf_spec.hub.convert.convert_eagle3` reads the export back bit for bit.
- :class:`~hf_spec.ParallelDrafter` (ParallelSpec): **no export**. speculators' ``peagle``
  (P-EAGLE) is EAGLE-3's drafter (three fused target layers through ``fc`` 3H -> H, a first layer
  reading ``cat[input_layernorm(embed), hidden_norm(h)]`` with ``h`` alone in the residual, its own
  ``norm`` + ``lm_head``) plus ONE mask token id and ONE learned ``mask_hidden`` for every parallel
  depth. Our ParallelDrafter is EAGLE-1's drafter (``fc`` over ``cat[embed(token), last hidden
  state]`` with a bias, a decoder layer without input norm whose residual carries the token
  embedding, the target's LM head with no final norm) plus one learned embedding PER depth and a
  zero feature. No setting of P-EAGLE's weights computes that function (its RMSNorms cannot be
  made the identity, and its residual never holds the token embedding), so a ``peagle`` file would
  be a different, untrained drafter. :func:`export_speculators` raises a ValueError saying so.
- :class:`~hf_spec.EagleDrafter` (EAGLE-1/2, HASS, CORAL): **no export by default**. speculators
  0.1-0.4 had an ``eagle`` type for this architecture; later releases removed it (0.9.0 knows
  ``dflash``, ``dflash2``, ``dspark``, ``eagle3``, ``mtp``, ``peagle``, ``xpress``) and has no
  converter from it, and EAGLE-1 cannot be rewritten as EAGLE-3 for the reasons above. The default
  raises a ValueError naming the options: train an EAGLE-3 drafter
  (``training_scripts/train_eagle3.py``) and export that, or pass ``legacy_eagle=True`` to write
  the old ``eagle`` layout (``fusion_fc.*`` / ``transformer.*``, ``layernorms: false``,
  ``fusion_bias: true``), which only speculators 0.1-0.4 (and serving stacks that still read
  that type) load.

Works without the drafter classes: :func:`export_speculators` accepts a drafter object or the
directory of a saved hf-spec drafter (only ``config.json`` + ``model.safetensors`` are read), and looks
its family up by ``model_type`` in one table, :data:`EXPORTERS` (:data:`NOT_EXPORTABLE` holds the reasons
of the families above that do not export); any other type raises a ValueError naming the exportable ones.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..drafters.registry import drafter_classes
from ..hardware import dtype_name

SPECULATORS_VERSION = "0.9.0"
"""speculators release whose ``eagle3`` schema the export writes and the tests load with."""
LEGACY_EAGLE_SCHEMA_VERSION = "0.4.0"
"""speculators version whose ``EagleSpeculatorConfig`` schema the legacy ``eagle`` export writes."""

EAGLE3_TENSORS = ("fc.", "layers.0.", "norm.", "lm_head.", "d2t", "t2d")
"""Prefixes of the tensors an ``eagle3`` export holds (the same names in hf-spec and speculators)."""

_EAGLE_MODEL_TYPES = ("hf_spec_eagle",)
_EAGLE3_MODEL_TYPE = "hf_spec_eagle3"
_PARALLEL_MODEL_TYPE = "hf_spec_parallel"
"""The families this module knows by ``model_type``; their classes come from :mod:`hf_spec.drafters.registry`."""

PARALLEL_NOT_EXPORTABLE = (
    "ParallelSpec drafters do not export to speculators: its 'peagle' (P-EAGLE) type is EAGLE-3's drafter "
    "(three fused target layers through fc, a first layer over cat[input_layernorm(embed), hidden_norm(h)] "
    "with h alone in the residual, its own norm + lm_head) with one mask token and one learned mask hidden "
    "state for all depths, while hf-spec's ParallelDrafter is EAGLE-1's drafter (fc over cat[embed, last "
    "hidden state] with a bias, no input norm, the token embedding in the residual, the target's LM head "
    "without a final norm) with one [MASK] embedding per depth. No P-EAGLE weights compute the same function, "
    "so the file would hold a different, untrained drafter. Fix: serve it with hf-spec's generate(), or train "
    "an EAGLE-3 drafter (training_scripts/train_eagle3.py) and export that as eagle3."
)
EAGLE_NOT_EXPORTABLE = (
    "EAGLE/HASS/CORAL drafters (EAGLE-1 architecture) have no counterpart in today's speculators: its 'eagle' "
    "type existed in speculators 0.1-0.4 only (0.9 knows dflash, dflash2, dspark, eagle3, mtp, peagle, xpress) "
    "and it has no converter from it; EAGLE-3's layout cannot express an EAGLE-1 drafter (its RMSNorms before "
    "attention and a residual without the token embedding). Fix: train an EAGLE-3 drafter "
    "(training_scripts/train_eagle3.py) and export that, or pass legacy_eagle=True to "
    "write the old 'eagle' layout that speculators 0.1-0.4 load."
)


def _load(drafter_or_path) -> tuple[dict, dict[str, torch.Tensor]]:
    if isinstance(drafter_or_path, (str, os.PathLike)):
        path = Path(drafter_or_path)
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        return config, load_file(str(path / "model.safetensors"))
    drafter = drafter_or_path
    return drafter.config.to_dict(), {k: v.detach().cpu().contiguous() for k, v in drafter.state_dict().items()}


def _dtype_name(weights: dict[str, torch.Tensor]) -> str | None:
    dtypes = {t.dtype for t in weights.values() if t.is_floating_point()}
    return dtype_name(next(iter(dtypes))) if len(dtypes) == 1 else None


def _verifier_block(config: dict, algorithm: str, speculative_tokens: int | None, verifier_name_or_path: str | None) -> dict:
    name = verifier_name_or_path or config.get("target_model_name_or_path")
    from ..resources import PACKAGED_MODELS

    if name in PACKAGED_MODELS and not os.path.isdir(name):
        warnings.warn(f"The verifier {name!r} is an hf-spec packaged model name, which speculators and vLLM cannot "
                      "resolve. Fix: pass verifier_name_or_path=<its Hub id or a model directory>.", stacklevel=4)  # fmt: skip
    return {
        "algorithm": algorithm,
        "proposal_methods": [
            {
                "proposal_type": "greedy",
                "speculative_tokens": int(speculative_tokens or config.get("tree_depth") or 5),
                "verifier_accept_k": 1,
                "accept_tolerance": 0.0,
            }
        ],
        "default_proposal_method": "greedy",
        "verifier": {
            "name_or_path": name,
            "architectures": list(config.get("target_architectures") or []),
        },
    }


def _write(out_dir, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt", "exported_by": "hf_spec.hub.export"})  # fmt: skip


# -- eagle3 ---------------------------------------------------------------------------------------
def eagle3_layer_config(config: dict) -> dict:
    """``transformer_layer_config`` of an hf-spec EAGLE-3 drafter config (a dict): its one Llama decoder
    layer (no q/k/v, o or MLP biases), the target's hidden size and vocabulary, only Llama's own fields."""
    from transformers import LlamaConfig

    from ..drafters.layer_config import decoder_layer_config

    fields = {k: v for k, v in (config.get("layer_config") or {}).items() if k != "model_type"}
    fields.update(attention_bias=False, mlp_bias=False)
    layer = decoder_layer_config("llama", fields, 1, attn_implementation=None)
    layer.vocab_size = config["target_vocab_size"]
    layer.hidden_size = config["target_hidden_size"]
    known = set(LlamaConfig().to_dict())
    out = {k: v for k, v in layer.to_dict().items() if k in known}
    for key in ("transformers_version", "architectures", "_name_or_path", "id2label", "label2id", "dtype",
                "output_attentions", "output_hidden_states", "return_dict", "chunk_size_feed_forward",
                "is_encoder_decoder", "problem_type"):  # fmt: skip
        out.pop(key, None)
    out["model_type"] = "llama"
    return out


def eagle3_config(config: dict, speculative_tokens: int | None = None, dtype: str | None = None,
                  verifier_name_or_path: str | None = None) -> dict:  # fmt: skip
    """The speculators ``eagle3`` ``config.json`` of an hf-spec EAGLE-3 drafter config (a dict)."""
    if config.get("model_type") != _EAGLE3_MODEL_TYPE:
        raise ValueError(f"eagle3_config needs an hf_spec_eagle3 config, got {config.get('model_type')!r}.")
    if config.get("fc_bias"):
        raise ValueError("This Eagle3Drafter's fc has a bias, which speculators' eagle3 fc (bias=False) cannot hold. "
                         "Fix: export a drafter built with fc_bias=False (the default).")  # fmt: skip
    out = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": eagle3_layer_config(config),
        "draft_vocab_size": int(config.get("draft_vocab_size") or config["target_vocab_size"]),
        "norm_before_residual": bool(config.get("norm_before_residual", False)),
        "target_hidden_size": int(config["target_hidden_size"]),
        "eagle_aux_hidden_state_layer_ids": [int(i) for i in config["eagle_aux_hidden_state_layer_ids"]],
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "speculators_config": _verifier_block(config, "eagle3", speculative_tokens, verifier_name_or_path),
    }
    if dtype:
        out["dtype"] = dtype
    return out


def _export_eagle3(config, weights, out_dir, speculative_tokens, verifier_name_or_path, legacy_eagle) -> dict[str, str]:
    """The ``eagle3`` export (``legacy_eagle`` is for EAGLE-1 drafters: an EAGLE-3 drafter has one layout)."""
    unknown = sorted(k for k in weights if not k.startswith(EAGLE3_TENSORS))
    if unknown:
        raise ValueError(f"Weights {unknown} have no counterpart in the speculators eagle3 format.")
    mapping = {name: name for name in sorted(weights)}
    _write(out_dir, eagle3_config(config, speculative_tokens, _dtype_name(weights), verifier_name_or_path), weights)
    return mapping


# -- legacy eagle (speculators 0.1-0.4) -----------------------------------------------------------
def speculators_name(name: str) -> str:
    """hf-spec weight name -> the legacy speculators ``EagleSpeculator`` (0.1-0.4) weight name."""
    if name.startswith("fc."):
        return "fusion_fc." + name[len("fc.") :]
    if name.startswith("layers.0."):
        return "transformer." + name[len("layers.0.") :]
    raise ValueError(f"Weight {name!r} has no counterpart in the speculators eagle format.")


def transformer_layer_config(config: dict):
    """The transformers config of an EAGLE drafter's decoder layer, as legacy speculators builds it (one layer)."""
    from ..drafters.layer_config import decoder_layer_config

    fields = dict(config.get("layer_config") or {})
    model_type = fields.pop("model_type", config.get("target_model_type"))
    layer_config = decoder_layer_config(model_type, fields, 1, attn_implementation=None)
    layer_config.vocab_size = config["target_vocab_size"]
    layer_config.hidden_size = config["target_hidden_size"]
    return layer_config


def legacy_eagle_config(config: dict, speculative_tokens: int | None = None, dtype: str | None = None,
                        verifier_name_or_path: str | None = None) -> dict:  # fmt: skip
    """The legacy speculators ``eagle`` ``config.json`` (speculators 0.1-0.4) of an hf-spec EAGLE drafter config."""
    if config.get("model_type") not in _EAGLE_MODEL_TYPES:
        raise ValueError(f"Only {_EAGLE_MODEL_TYPES} drafters export to the legacy speculators eagle format, "
                         f"got {config.get('model_type')!r}.")  # fmt: skip
    if config.get("draft_vocab_size"):
        raise ValueError("The speculators eagle format has no draft vocabulary; this drafter drafts over "
                         f"{config['draft_vocab_size']} ids. Fix: export a drafter trained with draft_vocab_size=0.")
    if int(config.get("num_layers", 1)) != 1:
        raise ValueError(f"The speculators eagle format has exactly one decoder layer; this drafter has "
                         f"{config['num_layers']}.")  # fmt: skip
    if config.get("router_num_groups"):
        raise ValueError("The speculators eagle format has no LM-head router (CORAL stage 2). Fix: export the "
                         "drafter saved before the router stage.")  # fmt: skip
    layer_config = transformer_layer_config(config)
    layer_class = type(layer_config).__name__.removesuffix("Config") + "DecoderLayer"
    layer_dict = layer_config.to_diff_dict()
    layer_dict.pop("transformers_version", None)
    layer_dict["model_type"] = layer_config.model_type
    out = {
        "architectures": ["EagleSpeculator", layer_class],
        "speculators_model_type": "eagle",
        "speculators_version": LEGACY_EAGLE_SCHEMA_VERSION,
        "transformer_layer_architecture": layer_class,
        "transformer_layer_config": layer_dict,
        "layernorms": False,
        "fusion_bias": True,
        "speculators_config": _verifier_block(config, "eagle", speculative_tokens, verifier_name_or_path),
    }
    if dtype:
        out["dtype"] = dtype
    return out


def _export_legacy_eagle(config, weights, out_dir, speculative_tokens, verifier_name_or_path) -> dict[str, str]:
    exported = legacy_eagle_config(config, speculative_tokens, _dtype_name(weights), verifier_name_or_path)  # validates first
    mapping = {name: speculators_name(name) for name in sorted(weights)}
    if len(set(mapping.values())) != len(mapping):
        raise ValueError("Two weights map to the same speculators name.")
    _write(out_dir, exported, {mapping[k]: v for k, v in weights.items()})
    return mapping


def _export_eagle(config, weights, out_dir, speculative_tokens, verifier_name_or_path, legacy_eagle) -> dict[str, str]:
    """The legacy ``eagle`` export when asked for (``legacy_eagle``); otherwise :data:`EAGLE_NOT_EXPORTABLE`."""
    if not legacy_eagle:
        raise ValueError(EAGLE_NOT_EXPORTABLE)
    return _export_legacy_eagle(config, weights, out_dir, speculative_tokens, verifier_name_or_path)


# -- the table ------------------------------------------------------------------------------------
EXPORTERS = {
    _EAGLE3_MODEL_TYPE: ("eagle3", _export_eagle3),
    _EAGLE_MODEL_TYPES[0]: ("eagle (speculators 0.1-0.4, with legacy_eagle=True)", _export_eagle),
}
"""``model_type`` of an hf-spec family -> (the speculators type it exports as, exporter). An exporter is called
as ``exporter(config, weights, out_dir, speculative_tokens, verifier_name_or_path, legacy_eagle)`` (``config``
the drafter's ``config.json`` as a dict, ``weights`` its tensors) and returns the weight-name mapping."""

NOT_EXPORTABLE = {_PARALLEL_MODEL_TYPE: PARALLEL_NOT_EXPORTABLE}
"""``model_type`` -> why a family that looks exportable is not (the error :func:`export_speculators` raises)."""


def exportable_types() -> str:
    """The exportable families, for error messages: ``hf_spec_eagle3 (Eagle3Drafter, as eagle3), ...``."""
    return ", ".join(f"{model_type} ({drafter_classes(model_type)[1].__name__}, as {speculators_type})"
                     for model_type, (speculators_type, _) in EXPORTERS.items())  # fmt: skip


# -- entry point ----------------------------------------------------------------------------------
def export_speculators(drafter_or_path, out_dir: str | os.PathLike, *, speculative_tokens: int | None = None,
                       verifier_name_or_path: str | None = None, legacy_eagle: bool = False) -> dict[str, str]:  # fmt: skip
    """Write ``config.json`` + ``model.safetensors`` in the speculators format to ``out_dir``.

    Args:
        drafter_or_path: an hf-spec drafter or the directory it was saved to. An
            :class:`~hf_spec.Eagle3Drafter` exports as ``eagle3`` (speculators 0.9); ParallelSpec,
            S2D and (without ``legacy_eagle``) EAGLE/HASS/CORAL drafters raise a ValueError saying why.
        speculative_tokens: chain length of the greedy proposal; default the drafter's tree depth.
        verifier_name_or_path: the verifier (target) recorded in ``speculators_config.verifier``;
            default the drafter config's ``target_model_name_or_path``. speculators loads the
            embedding (and its verifier head) from there, so give a Hub id or a path it can read.
        legacy_eagle: EAGLE/HASS/CORAL drafters only: write the ``eagle`` layout of speculators
            0.1-0.4 (which speculators 0.9 rejects) instead of raising.

    Returns:
        ``{hf-spec weight name: speculators weight name}``, one entry per tensor.
    """
    config, weights = _load(drafter_or_path)
    model_type = config.get("model_type")
    if model_type in NOT_EXPORTABLE:
        raise ValueError(NOT_EXPORTABLE[model_type])
    if model_type not in EXPORTERS:
        raise ValueError(f"{model_type!r} drafters have no speculators counterpart; the exportable types are "
                         f"{exportable_types()}. Fix: train an EAGLE-3 drafter (training_scripts/train_eagle3.py) "
                         "and export that.")  # fmt: skip
    exporter = EXPORTERS[model_type][1]
    return exporter(config, weights, out_dir, speculative_tokens, verifier_name_or_path, legacy_eagle)
