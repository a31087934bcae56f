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

import contextlib
import copy
import dataclasses
import functools
import warnings

import torch
from transformers import GenerationMixin

from . import compat
from .attention_kernels import few_query_attention
from .controller import SpeedController, controller_for
from .decoding import PLAIN, Arm, check_batch_supported, decode, is_batched
from .drafters.base import SpecDrafterModel
from .hardware import warn_if_emulated_bf16
from .linear_kernels import few_row_linears
from .shape_select import candidate_options, check_candidates, renamed_options
from .static_cache import wants_static_cache
from .stats import GenerationStats

__all__ = ["GenerationStats", "check_supported", "install", "is_installed", "speculative_decode", "uninstall"]

SPEED_CONTROL_BY_DEFAULT = True
"""What ``generate(..., speed_controller=None)`` means: the online controller chooses each cycle's arm (True), or
the configured shape drafts every cycle (False). The test suite sets it False so that the timings of its tiny
models cannot change what a test exercises; the controller's own tests pass ``speed_controller`` explicitly."""


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


def check_prompt_ids(model, input_ids: torch.Tensor) -> None:
    """ValueError naming the first prompt id outside the target's vocabulary (its input embedding would raise a
    bare ``IndexError``, or a device-side assert on a GPU), before any forward. One host read: :func:`_precheck` runs
    it once per call, before transformers' generate()."""
    if input_ids.is_floating_point() or input_ids.numel() == 0:
        return
    vocab = getattr(model.get_input_embeddings(), "num_embeddings", None) or model.config.get_text_config().vocab_size
    outside = (input_ids < 0) | (input_ids >= vocab)
    if bool(outside.any()):
        row, position = outside.nonzero()[0].tolist()
        raise ValueError(
            f"Prompt token id {int(input_ids[row, position])} (row {row}, position {position}) is outside the "
            f"target's vocabulary of {vocab} ids (valid ids: 0 to {vocab - 1}). Fix: tokenize with the target's own "
            "tokenizer, pad with its pad_token_id (not -100), and after adding tokens to the tokenizer call "
            "`model.resize_token_embeddings(len(tokenizer))`."
        )


def follow_target_placement(drafter: SpecDrafterModel, model) -> None:
    """Move a bound ``drafter`` to ``model``'s dtype and device when one of them was moved after binding (which
    :meth:`~hf_spec.drafters.base.SpecDrafterModel.bind` does for an unbound drafter): the drafter runs on the
    target's borrowed embedding and LM head, so it must share their dtype and device. Warns when it moves it."""
    weight = next((p for p in drafter.parameters() if p.is_floating_point()), None)
    if weight is None or (weight.dtype == model.dtype and weight.device == model.device):
        return  # no weights (NGramDrafter), or in place
    warnings.warn(
        f"The drafter ({type(drafter).__name__}) is in {weight.dtype} on {weight.device} but its target in "
        f"{model.dtype} on {model.device} (one was moved after binding); generate() moves the drafter to the "
        "target's dtype and device, as binding does. To skip this copy: cast or move the target before "
        "binding, or move the drafter with it (`drafter.to(model.device, model.dtype)`).",
        stacklevel=2,
    )
    drafter.to(device=model.device, dtype=model.dtype)


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
    ngram_nodes: int | None = None,
    ngram_branches: int | None = None,
    speed_controller: SpeedController | bool | None = None,
    **model_kwargs,
):
    """Tree speculative decoding of ``model`` with ``drafter``.

    Called by transformers' ``generate`` (``custom_generate``) with the prepared processors,
    stopping criteria and generation config. Returns what ``generate`` would. After the checks
    it binds the drafter if needed, sets up the arms and the speed controller (:func:`call_arms`) and runs
    :func:`hf_spec.decoding.decode` (one prompt or a left-padded batch).

    ``speed_controller``: True (the default, :data:`SPEED_CONTROL_BY_DEFAULT`) lets the process's online
    controller choose each cycle's arm (plain, or one of the drafter's shapes) unless the call fixes the shape;
    False drafts every cycle with the configured shape; a :class:`~hf_spec.controller.SpeedController` over
    this call's arms is used as it is.
    """
    check_supported(model, input_ids, generation_config, model_kwargs)
    warn_if_emulated_bf16(model)
    if not drafter.is_bound_to(model):
        drafter.bind(model)
    follow_target_placement(drafter, model)
    do_sample = bool(generation_config.do_sample)
    options = dict(tree_depth=tree_depth, tree_top_k=tree_top_k, tree_total_tokens=tree_total_tokens,
                   tree_min_prob=tree_min_prob, ngram_nodes=ngram_nodes, ngram_branches=ngram_branches)  # fmt: skip
    options = renamed_options(options, "generate()")  # ngram_branches: the old name of ngram_nodes
    if speed_controller is None:
        speed_controller = SPEED_CONTROL_BY_DEFAULT
    arms, start = call_arms(drafter, options, do_sample, controlled=speed_controller is not False)
    labels = [arm.label for arm in arms]
    controller = None
    if isinstance(speed_controller, SpeedController):
        if speed_controller.labels != labels:
            raise ValueError(f"speed_controller has arms {speed_controller.labels}, this call {labels}. "
                             "Fix: build it with SpeedController([arm labels]) for this drafter and options.")  # fmt: skip
        controller = speed_controller
    elif speed_controller not in (True, False):
        raise ValueError(f"speed_controller must be None, True, False or a SpeedController, got {speed_controller!r}.")
    elif len(arms) > 1:
        key = (id(model), str(model.device), str(model.dtype), torch.get_num_threads(), input_ids.shape[0] > 1, do_sample)
        controller = controller_for(drafter, key, labels, start, ladder_positions(drafter, arms))
    temperature = float(generation_config.temperature or 1.0) if do_sample else 1.0
    _check_streamer(streamer, input_ids)
    # no key/value-head copies (CPU), no per-shape cuDNN plans (CUDA); on a CPU each few-row linear layer and each
    # few-query attention runs the kernel measured fastest (not under a static cache, whose forwards may be compiled)
    kernels = contextlib.ExitStack()
    if not wants_static_cache(generation_config):
        kernels.enter_context(few_row_linears(model, drafter, *drafter.decoding_modules()))
        kernels.enter_context(few_query_attention(model.device))
    with compat.tree_attention(model.device), kernels:
        output, stats = decode(model, input_ids, logits_processor, stopping_criteria, generation_config,
                               drafter=drafter, arms=arms, controller=controller, do_sample=do_sample,
                               temperature=temperature, attention_mask=model_kwargs.get("attention_mask"),
                               streamer=streamer, use_router=use_router)  # fmt: skip
    drafter.last_generation_stats = stats  # the one place: a convenience for the caller, read after the call
    return output


def call_arms(drafter: SpecDrafterModel, options: dict, do_sample: bool, controlled: bool = True) -> tuple[list[Arm], int]:
    """The arms of one call and the one to start from.

    A call that sets any shape option (``options``: ``tree_depth``, ``tree_top_k``, ``tree_total_tokens``,
    ``tree_min_prob``, ``ngram_nodes``), or runs uncontrolled, has one arm: that shape (no controller).
    Else arm 0 is plain (no draft), then the drafter's ``tree_shape_candidates`` from cheap to costly, one
    dimension at a time: by tree size, then n-gram budget (:func:`rung_key`; unless ``auto_tree_shape`` is false;
    candidates this call's mode cannot use, such as pruned trees when sampling, are left out), or its configured
    shape when it has none; the start is the candidate with the configured shape, else the cheapest drafted arm."""
    def arm(label: str, opts: dict) -> Arm:
        shape = drafter.tree_shape(opts.get("tree_depth"), opts.get("tree_top_k"), opts.get("tree_total_tokens"))
        shape = with_min_prob(drafter, shape, opts.get("tree_min_prob"))
        shape.validate(do_sample)
        return Arm(label, shape, opts.get("ngram_nodes"))

    if not controlled or any(v is not None for v in options.values()):
        return [arm("fixed", options)], 0
    config = drafter.config
    candidates = check_candidates(getattr(config, "tree_shape_candidates", None))
    if getattr(config, "auto_tree_shape", None) is False or not candidates:
        return [PLAIN, arm("configured", {})], 1
    drafted, seen = [], set()
    configured = {name: getattr(config, name, None) for name in ("tree_depth", "tree_top_k", "tree_total_tokens",
                                                                 "ngram_nodes")}  # fmt: skip
    for candidate in candidates:
        opts = candidate_options(candidate)
        label = " ".join(f"{k.removeprefix('tree_')}={v}" for k, v in sorted(opts.items())) or "configured"
        if label in seen:
            continue
        seen.add(label)
        try:
            drafted.append((arm(label, opts), all(opts.get(k, v) == v for k, v in configured.items())))
        except ValueError:  # e.g. a pruned tree a greedy ladder may use but sampling may not: not an arm here
            continue
    drafted.sort(key=lambda pair: rung_key(drafter, pair[0]))
    start = next((i + 1 for i, (_, is_configured) in enumerate(drafted) if is_configured), 1)
    return [PLAIN] + [a for a, _ in drafted], start


def rung_key(drafter: SpecDrafterModel, arm: Arm) -> tuple[tuple, int]:
    """Where a drafted arm stands on the ladder: (its tree's size: drafted nodes kept, depth, children per node, and
    a lower confidence floor as bigger; its n-gram budget, the drafter's when the arm sets none)."""
    shape = arm.shape
    tree = (shape.total_tokens, shape.depth, getattr(shape, "top_k", 0), -getattr(shape, "min_prob", 0.0))
    ngram = arm.ngram_nodes if arm.ngram_nodes is not None else getattr(drafter.config, "ngram_nodes", None)
    return tree, int(ngram or 0)


def ladder_positions(drafter: SpecDrafterModel, arms: list[Arm]) -> list[tuple[int, int] | None]:
    """Each arm's (tree rank, n-gram rank) among ``arms`` (None for plain), so the controller also moves one
    dimension at a time (:class:`~hf_spec.controller.SpeedController`)."""
    keys = [None if a.shape is None else rung_key(drafter, a) for a in arms]
    trees = sorted({k[0] for k in keys if k is not None})
    ngrams = sorted({k[1] for k in keys if k is not None})
    return [None if k is None else (trees.index(k[0]), ngrams.index(k[1])) for k in keys]


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
    else:
        check_prompt_ids(model, inputs)
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
