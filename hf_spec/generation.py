"""The one integration point with transformers' generate(), and the one checks pass.

Integration: :func:`install` (run by ``import hf_spec``) wraps
``transformers.GenerationMixin.generate`` once. When ``assistant_model`` is an hf-spec
drafter, the wrapper calls the original ``generate`` with ``custom_generate=`` our loop, so
transformers still prepares the generation config, logits processors/warpers and stopping
criteria exactly as for plain decoding; every other call goes to transformers untouched.
:func:`uninstall` restores the original method. The loop itself (one prompt or a batch) is
:func:`hf_spec.decoding.decode`; :func:`check_supported` rejects what it cannot do first.
"""

from __future__ import annotations

import copy
import dataclasses
import functools

import torch
from transformers import GenerationMixin

from . import compat
from .decoding import check_batch_supported, decode, is_batched
from .drafters.base import SpecDrafterModel
from .hardware import warn_if_emulated_bf16
from .shape_select import CANDIDATE_OPTIONS
from .tune import select_shape
from .stats import GenerationStats

__all__ = ["GenerationStats", "check_supported", "install", "is_installed", "speculative_decode", "uninstall"]

def check_supported(model, input_ids, generation_config, model_kwargs) -> None:
    """Raise ValueError for anything the tree path cannot do losslessly, before generating."""
    if input_ids.shape[1] == 0:
        raise ValueError("The prompt is empty. Fix: pass at least one token (e.g. the BOS token).")
    compat.check_tree_mask_attention(model)
    unsupported = []
    if (generation_config.num_beams or 1) != 1:
        unsupported.append(f"num_beams={generation_config.num_beams} (beam search)")
    if getattr(generation_config, "penalty_alpha", None):
        unsupported.append("penalty_alpha (contrastive search)")
    if (generation_config.num_return_sequences or 1) != 1:
        unsupported.append(f"num_return_sequences={generation_config.num_return_sequences}")
    if generation_config.output_attentions or generation_config.output_hidden_states:
        unsupported.append("output_attentions/output_hidden_states")
    if unsupported:
        raise ValueError(
            "hf-spec speculative decoding supports greedy and sampling (temperature/top-k/top-p and other logits "
            f"processors) only; unsupported: {', '.join(unsupported)}. Fix: drop these options, or call generate() "
            "without `assistant_model` to use transformers' own decoding."
        )
    if is_batched(input_ids, model_kwargs.get("attention_mask")):
        check_batch_supported(input_ids, generation_config, model_kwargs.get("attention_mask"))
    past = model_kwargs.get("past_key_values")
    if past is not None and past.get_seq_length() > 0:
        raise ValueError("Continuing from a pre-filled past_key_values is not supported. Fix: pass the full prompt.")
    max_positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if max_positions is not None and input_ids.shape[1] >= max_positions:
        raise ValueError(
            f"The prompt has {input_ids.shape[1]} tokens but the target's context window is {max_positions}. "
            "Fix: truncate the prompt."
        )


def speculative_decode(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    *,
    drafter: SpecDrafterModel,
    streamer=None,
    tree_depth: int | None = None,
    tree_top_k: int | None = None,
    tree_total_tokens: int | None = None,
    tree_min_prob: float | None = None,
    use_router: bool | None = None,
    ngram_branches: int | None = None,
    **model_kwargs,
):
    """Tree speculative decoding of ``model`` with ``drafter``.

    Called by transformers' ``generate`` (``custom_generate``) with the prepared processors,
    stopping criteria and generation config. Returns what ``generate`` would. After the checks
    it binds the drafter if needed, resolves the tree shape (a call that sets none of the shape
    options gets the drafter's fastest shape candidate on this machine, :mod:`hf_spec.shape_select`,
    when its config has candidates; when even that one is predicted slower than a plain step, the
    call drafts nothing and runs one target step per cycle, exact and as fast as plain), and runs
    :func:`hf_spec.decoding.decode` (one prompt or a left-padded batch).
    """
    check_supported(model, input_ids, generation_config, model_kwargs)
    warn_if_emulated_bf16(model)
    if not drafter.is_bound_to(model):
        drafter.bind(model)
    with compat.masked_sdpa_gqa(model.device):  # tree masks without copying the cache's key/value heads (CPU)
        return _speculative_decode(model, input_ids, logits_processor, stopping_criteria, generation_config,
                                   drafter=drafter, streamer=streamer, use_router=use_router,
                                   options=dict(tree_depth=tree_depth, tree_top_k=tree_top_k,
                                                tree_total_tokens=tree_total_tokens, tree_min_prob=tree_min_prob,
                                                ngram_branches=ngram_branches),
                                   **model_kwargs)  # fmt: skip


def _speculative_decode(model, input_ids, logits_processor, stopping_criteria, generation_config, *, drafter,
                        streamer, use_router, options: dict, **model_kwargs):  # fmt: skip
    """:func:`speculative_decode` after its checks: the shape (``options``, else a candidate) and the loop."""
    do_sample = bool(generation_config.do_sample)
    choice = None
    if all(v is None for v in options.values()):
        choice = select_shape(model, drafter)  # the drafter's shape candidates, timed on this machine
        if choice is not None:
            options = {name: choice.options.get(name) for name in CANDIDATE_OPTIONS}
    shape = drafter.tree_shape(options["tree_depth"], options["tree_top_k"], options["tree_total_tokens"])
    shape = with_min_prob(drafter, shape, options["tree_min_prob"])
    shape.validate(do_sample)
    temperature = float(generation_config.temperature or 1.0) if do_sample else 1.0
    _check_streamer(streamer, input_ids)
    output = decode(model, input_ids, logits_processor, stopping_criteria, generation_config, drafter=drafter,
                    shape=shape, do_sample=do_sample, temperature=temperature,
                    attention_mask=model_kwargs.get("attention_mask"), streamer=streamer, use_router=use_router,
                    ngram_branches=options["ngram_branches"], target_only=choice is not None and choice.plain_is_faster)  # fmt: skip
    if choice is not None:
        drafter.last_generation_stats.shape_choice = {**choice.candidate,
                                                      "predicted_ms_per_token": choice.predicted_ms_per_token,
                                                      "plain_ms_per_token": choice.plain_ms_per_token,
                                                      "drafted": not choice.plain_is_faster}  # fmt: skip
    return output


def with_min_prob(drafter: SpecDrafterModel, shape, min_prob: float | None):
    """``shape`` with the confidence floor ``min_prob`` (None: the drafter's ``tree_min_prob``, 0 when unset);
    raises ValueError when a drafter family without dynamic trees is given a non-zero floor."""
    explicit = min_prob is not None
    min_prob = min_prob if explicit else getattr(drafter.config, "tree_min_prob", 0.0) or 0.0
    if not drafter.supports_tree_min_prob:
        if explicit and min_prob:
            raise ValueError(
                f"tree_min_prob={min_prob} sizes the dynamic trees of EAGLE-family drafters (EagleDrafter, "
                f"Eagle3Drafter) and the chains of SortedDrafter; {type(drafter).__name__} drafts other trees. "
                "Fix: drop tree_min_prob."
            )
        return shape
    return dataclasses.replace(shape, min_prob=min_prob)  # validate() checks the value


# -- the integration point ---------------------------------------------------------------------
_original_generate = None


def _routing_generate(self, *args, assistant_model=None, streamer=None, custom_generate=None, **kwargs):
    if not isinstance(assistant_model, SpecDrafterModel):
        return _original_generate(
            self, *args, assistant_model=assistant_model, streamer=streamer, custom_generate=custom_generate, **kwargs
        )
    if custom_generate is not None:
        raise ValueError("`custom_generate` cannot be combined with an hf-spec drafter as `assistant_model`.")
    _precheck(self, args, kwargs, streamer)
    loop = functools.partial(speculative_decode, drafter=assistant_model, streamer=streamer)
    return _original_generate(self, *args, streamer=streamer, custom_generate=loop, **kwargs)


def _check_streamer(streamer, input_ids) -> None:
    if streamer is not None and input_ids.shape[0] > 1:
        raise ValueError(
            f"A streamer cannot be used with a batch of {input_ids.shape[0]} prompts (transformers' streamers take "
            "batch size 1). Fix: drop `streamer`, or call generate() once per prompt."
        )


def _precheck(model, args, kwargs, streamer=None) -> None:
    """Fail before transformers touches the streamer or the cache on options we reject anyway."""
    inputs = args[0] if args else kwargs.get("inputs", kwargs.get("input_ids"))
    generation_config = copy.deepcopy(args[1] if len(args) > 1 and args[1] is not None else
                                      kwargs.get("generation_config") or model.generation_config)  # fmt: skip
    generation_config.update(**{k: v for k, v in kwargs.items() if k != "generation_config"})
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 2:
        inputs = torch.ones(1, 1, dtype=torch.long)
    mask = kwargs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.shape != inputs.shape:
        mask = None
    _check_streamer(streamer, inputs)
    check_supported(model, inputs, generation_config, {"attention_mask": mask})


def install() -> None:
    """Route ``generate(assistant_model=<hf-spec drafter>)`` to the tree loop (idempotent)."""
    global _original_generate
    if _original_generate is not None:
        return
    _original_generate = GenerationMixin.generate
    GenerationMixin.generate = functools.wraps(_original_generate)(_routing_generate)


def uninstall() -> None:
    """Restore transformers' own ``GenerationMixin.generate``."""
    global _original_generate
    if _original_generate is None:
        return
    GenerationMixin.generate = _original_generate
    _original_generate = None


def is_installed() -> bool:
    return _original_generate is not None
