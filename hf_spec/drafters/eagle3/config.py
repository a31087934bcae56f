"""Config of the EAGLE-3 family (:class:`Eagle3DrafterConfig`) and EAGLE-3's default fused target layers."""

from __future__ import annotations

from transformers import LlamaConfig, PretrainedConfig

from ..eagle.config import EagleDrafterConfig
from ..layer_config import decoder_layer_config


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3's fused layers ``(2, L//2, L-3)`` of an ``L``-layer target; ValueError when they collide."""
    ids = [2, num_layers // 2, num_layers - 3]
    if len(set(ids)) != 3 or min(ids) < 0:
        raise ValueError(
            f"EAGLE-3's default fused layers (2, L//2, L-3) = {tuple(ids)} collide for a target with {num_layers} "
            "layers (it needs at least 7). Fix: pass eagle_aux_hidden_state_layer_ids=[...] (distinct layer ids "
            f"below {num_layers})."
        )
    return ids


class Eagle3DrafterConfig(EagleDrafterConfig):
    """Config of :class:`Eagle3Drafter` (the fields of :class:`EagleDrafterConfig`, ``num_layers`` 1).

    Args:
        eagle_aux_hidden_state_layer_ids: the target layers whose inputs (HF ``hidden_states[i]``)
            are fused, at least two distinct ids, kept sorted (the order EAGLE-3 and vLLM concatenate
            them in). Default: ``(2, L//2, L-3)`` of the target.
        norm_before_residual: the residual of the attention block is ``hidden_norm(h)`` instead of h
            (a speculators option; EAGLE-3's own checkpoints: False).
        target_num_layers: the target's decoder layer count (checked at bind time).
        fc_bias: ``fc`` has a bias (early speculators checkpoints; EAGLE-3: no).
    """

    model_type = "hf_spec_eagle3"
    default_training_method = "eagle3"

    def __init__(self, eagle_aux_hidden_state_layer_ids: list[int] | None = None, norm_before_residual: bool = False,
                 target_num_layers: int | None = None, fc_bias: bool = False, **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.fc_bias = bool(fc_bias)
        if self.num_layers != 1:
            raise ValueError(f"Eagle3Drafter has exactly one decoder layer, got num_layers={self.num_layers}.")
        if self.router_num_groups:
            raise ValueError("Eagle3Drafter has its own draft head and no LM-head router. Fix: drop router_num_groups.")
        ids = eagle_aux_hidden_state_layer_ids
        if ids is not None:
            ids = sorted(int(i) for i in ids)
            if len(ids) < 2 or len(set(ids)) != len(ids) or ids[0] < 0:
                raise ValueError(f"eagle_aux_hidden_state_layer_ids must be at least two distinct layer ids >= 0, got {ids}.")
            if target_num_layers is not None and ids[-1] >= target_num_layers:
                raise ValueError(f"eagle_aux_hidden_state_layer_ids {ids} must be below the target's {target_num_layers} layers.")
        self.eagle_aux_hidden_state_layer_ids = ids
        self.norm_before_residual = bool(norm_before_residual)
        self.target_num_layers = target_num_layers

    @classmethod
    def for_target(cls, target_config: PretrainedConfig, name_or_path: str | None = None, **kwargs):
        """A config shaped for ``target_config``, fusing its layers ``(2, L//2, L-3)`` unless ids are given."""
        num_layers = target_config.get_text_config().num_hidden_layers
        kwargs["target_num_layers"] = num_layers
        if kwargs.get("eagle_aux_hidden_state_layer_ids") is None:
            kwargs["eagle_aux_hidden_state_layer_ids"] = default_aux_layer_ids(num_layers)
        return super().for_target(target_config, name_or_path, **kwargs)

    def check_target(self, target) -> None:
        super().check_target(target)
        num_layers = target.config.get_text_config().num_hidden_layers
        if self.eagle_aux_hidden_state_layer_ids[-1] >= num_layers:
            raise ValueError(
                f"This Eagle3Drafter fuses target layers {self.eagle_aux_hidden_state_layer_ids}, but the target has "
                f"{num_layers} layers. Fix: load the target it was trained for."
            )

    def decoder_layer_config(self) -> LlamaConfig:
        """EAGLE-3's layer is Llama's whatever the target family (no q/k/v or MLP biases)."""
        fields = {k: v for k, v in self.layer_config.items() if k != "model_type"}
        return decoder_layer_config("llama", {**fields, "attention_bias": False, "mlp_bias": False}, 1)

