"""Export EAGLE-architecture drafters (EAGLE, HASS, CORAL without router) to the
`speculators <https://github.com/vllm-project/speculators>`_ ``eagle`` format.

The format (``speculators_model_type: "eagle"``, class ``EagleSpeculatorConfig`` of speculators
0.1–0.4, which lists EAGLE-1/EAGLE-2/HASS as ``layernorms``/``fusion_bias`` variants):

- ``config.json``: ``transformer_layer_config`` (the decoder layer's transformers config, one
  layer, the target's vocab), ``transformer_layer_architecture`` (e.g. ``LlamaDecoderLayer``),
  ``layernorms: false`` (no extra embedding/pre-LM-head norms, and layer 0's
  ``input_layernorm`` is replaced by identity, exactly like hf-spec's drafter),
  ``fusion_bias: true`` (hf-spec's ``fc`` has a bias, as in HASS), and the
  ``speculators_config`` block (algorithm, greedy proposal, ``verifier`` = the target).
- ``model.safetensors``: our weights renamed one to one, ``fc.*`` -> ``fusion_fc.*`` and
  ``layers.0.*`` -> ``transformer.*``. Embedding and LM head stay with the verifier (target),
  as in hf-spec.

Not covered: speculators >= 0.5 and vLLM's speculators loader only know ``eagle3`` (an EAGLE-3
drafter fuses three target layers and feeds a 2H-wide first attention), which is a different
architecture: an hf-spec EAGLE drafter cannot be mapped one to one onto it. Drafters with more
than one decoder layer have no ``eagle`` equivalent either; both raise ``ValueError``.

Works without the drafter class: :func:`export_speculators` accepts a drafter object or the
directory of a saved hf-spec drafter (only ``config.json`` + ``model.safetensors`` are read).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SPECULATORS_SCHEMA_VERSION = "0.4.0"
"""speculators version whose ``EagleSpeculatorConfig`` schema the export writes."""

_EXPORTABLE_MODEL_TYPES = ("hf_spec_eagle",)


def _load(drafter_or_path) -> tuple[dict, dict[str, torch.Tensor]]:
    if isinstance(drafter_or_path, (str, os.PathLike)):
        path = Path(drafter_or_path)
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        return config, load_file(str(path / "model.safetensors"))
    drafter = drafter_or_path
    return drafter.config.to_dict(), {k: v.detach().cpu().contiguous() for k, v in drafter.state_dict().items()}


def speculators_name(name: str) -> str:
    """hf-spec weight name -> speculators ``EagleSpeculator`` weight name."""
    if name.startswith("fc."):
        return "fusion_fc." + name[len("fc.") :]
    if name.startswith("layers.0."):
        return "transformer." + name[len("layers.0.") :]
    raise ValueError(f"Weight {name!r} has no counterpart in the speculators eagle format.")


def transformer_layer_config(config: dict):
    """The transformers config of the drafter's decoder layer, as speculators builds it (one layer)."""
    from ..drafters.layer_config import decoder_layer_config

    fields = dict(config.get("layer_config") or {})
    model_type = fields.pop("model_type", config.get("target_model_type"))
    layer_config = decoder_layer_config(model_type, fields, 1, attn_implementation=None)
    layer_config.vocab_size = config["target_vocab_size"]
    layer_config.hidden_size = config["target_hidden_size"]
    return layer_config


def speculators_config(config: dict, speculative_tokens: int | None = None, dtype: str | None = None) -> dict:
    """The speculators ``config.json`` for an hf-spec EAGLE drafter config (as a dict)."""
    if config.get("model_type") not in _EXPORTABLE_MODEL_TYPES:
        raise ValueError(f"Only {_EXPORTABLE_MODEL_TYPES} drafters export to the speculators eagle format, "
                         f"got {config.get('model_type')!r}.")  # fmt: skip
    if config.get("draft_vocab_size"):
        raise ValueError("The speculators eagle format has no draft vocabulary; this drafter drafts over "
                         f"{config['draft_vocab_size']} ids. Fix: export a drafter trained with draft_vocab_size=0.")
    if int(config.get("num_layers", 1)) != 1:
        raise ValueError(f"The speculators eagle format has exactly one decoder layer; this drafter has "
                         f"{config['num_layers']}.")  # fmt: skip
    layer_config = transformer_layer_config(config)
    layer_class = type(layer_config).__name__.removesuffix("Config") + "DecoderLayer"
    layer_dict = layer_config.to_diff_dict()
    layer_dict.pop("transformers_version", None)
    layer_dict["model_type"] = layer_config.model_type
    out = {
        "architectures": ["EagleSpeculator", layer_class],
        "speculators_model_type": "eagle",
        "speculators_version": SPECULATORS_SCHEMA_VERSION,
        "transformer_layer_architecture": layer_class,
        "transformer_layer_config": layer_dict,
        "layernorms": False,
        "fusion_bias": True,
        "speculators_config": {
            "algorithm": "eagle",
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
                "name_or_path": config.get("target_model_name_or_path"),
                "architectures": list(config.get("target_architectures") or []),
            },
        },
    }
    if dtype:
        out["dtype"] = dtype
    return out


def export_speculators(drafter_or_path, out_dir: str | os.PathLike, *, speculative_tokens: int | None = None) -> dict:
    """Write ``config.json`` + ``model.safetensors`` in the speculators eagle format to ``out_dir``.

    Args:
        drafter_or_path: an hf-spec EAGLE drafter (``EagleDrafter``, also one loaded via remote
            code) or the directory it was saved to.
        speculative_tokens: chain length of the greedy proposal; default the drafter's tree depth.

    Returns:
        ``{hf-spec weight name: speculators weight name}``, one entry per tensor.
    """
    config, weights = _load(drafter_or_path)
    speculators_config(config)  # validates the model type and layer count first, with a clear error
    mapping = {name: speculators_name(name) for name in sorted(weights)}
    if len(set(mapping.values())) != len(mapping):
        raise ValueError("Two weights map to the same speculators name.")
    dtypes = {t.dtype for t in weights.values()}
    dtype = str(next(iter(dtypes))).removeprefix("torch.") if len(dtypes) == 1 else None
    exported = speculators_config(config, speculative_tokens, dtype)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(exported, indent=2) + "\n", encoding="utf-8")
    save_file({mapping[k]: v.contiguous() for k, v in weights.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt", "exported_by": "hf_spec.hub.export"})  # fmt: skip
    return mapping
