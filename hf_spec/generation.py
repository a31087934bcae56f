"""The tree speculative decoding loop and its one integration point with transformers.

Integration: :func:`install` (run by ``import hf_spec``) wraps
``transformers.GenerationMixin.generate`` once. When ``assistant_model`` is an hf-spec
drafter, the wrapper calls the original ``generate`` with ``custom_generate=`` our loop, so
transformers still prepares the generation config, logits processors/warpers and stopping
criteria exactly as for plain decoding; every other call goes to transformers untouched.
:func:`uninstall` restores the original method.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field

import torch
from transformers import GenerationMixin
from transformers.generation.utils import GenerateDecoderOnlyOutput

from . import compat, timing
from .cache import crop_to, keep_accepted
from .drafters.base import SpecDrafterModel
from .verify import verify_tree

TREE_KWARGS = ("tree_depth", "tree_top_k", "tree_total_tokens")


def new_session(drafter, model, shape, do_sample: bool, temperature: float, prompt_ids, use_router: bool | None,
                ngram_branches: int | None = None):  # fmt: skip
    """The drafter's drafting session for one sequence; ``use_router`` (None: the drafter's
    config) switches a CORAL LM-head router on or off for this call; ``ngram_branches`` (None:
    the drafter's config) sets how many context n-gram nodes a feature drafter grafts per tree."""
    session = drafter.new_drafting_session(model, shape, do_sample, temperature, prompt_ids=prompt_ids)
    if ngram_branches is not None:
        from .drafters.eagle import check_ngram_branches

        check_ngram_branches(ngram_branches)
        if not hasattr(session, "ngram_branches"):
            if ngram_branches:
                raise ValueError(
                    f"ngram_branches={ngram_branches} grafts n-gram branches into a trained feature drafter's trees "
                    f"(EagleDrafter, ParallelDrafter), not into {type(drafter).__name__}'s. Fix: drop ngram_branches "
                    "(for n-gram trees alone, use hf_spec.NGramDrafter)."
                )
        else:
            session.ngram_branches = ngram_branches
    if use_router is not None:
        if use_router and getattr(drafter, "router", None) is None:
            raise ValueError(
                "use_router=True but this drafter has no LM-head router. Fix: drop use_router, or train a router "
                "(training_scripts/train_coral.py)."
            )
        if hasattr(session, "use_router"):
            session.use_router = bool(use_router)
    return session


@dataclass
class GenerationStats:
    """What one speculative generate() call did.

    ``accepted_lengths``: drafted tokens accepted in each cycle (each cycle also emits one
    target token); ``accepted_from_ngram``: how many of those were nodes that only n-gram
    grafting drafted (``ngram_branches``), the rest came from the drafter
    (:attr:`accepted_from_drafter`); ``tree_sizes``: nodes verified per cycle (root included), the
    size that sets a verification forward's cost. Seconds: ``target_forward_seconds`` (prefill + verification forwards),
    ``drafter_forward_seconds`` (drafter forwards), ``total_seconds`` (the whole loop).
    """

    accepted_lengths: list[int] = field(default_factory=list)
    accepted_from_ngram: int = 0
    tree_sizes: list[int] = field(default_factory=list)
    new_tokens: int = 0
    target_forward_seconds: float = 0.0
    drafter_forward_seconds: float = 0.0
    total_seconds: float = 0.0

    @property
    def cycles(self) -> int:
        return len(self.accepted_lengths)

    @property
    def accepted_from_drafter(self) -> int:
        """Accepted drafted tokens that the drafter itself drafted."""
        return sum(self.accepted_lengths) - self.accepted_from_ngram

    def record(self, tree, walk) -> None:
        """Count one verified cycle: its accepted drafts, and those from n-gram-only nodes."""
        self.accepted_lengths.append(walk.num_accepted_drafts)
        self.tree_sizes.append(len(tree))
        if tree.from_ngram is not None and walk.num_accepted_drafts:
            self.accepted_from_ngram += sum(bool(tree.from_ngram[node]) for node in walk.nodes[1:])

    @property
    def tau(self) -> float:
        """Mean tokens emitted per verification forward (accepted drafts + 1)."""
        if not self.accepted_lengths:
            return float("nan")
        return sum(self.accepted_lengths) / len(self.accepted_lengths) + 1.0

    def acceptance_by_position(self) -> list[float]:
        """Share of cycles whose i-th draft position (i = 1, 2, …) was accepted."""
        if not self.accepted_lengths:
            return []
        deepest = max(self.accepted_lengths)
        return [sum(a >= i for a in self.accepted_lengths) / self.cycles for i in range(1, deepest + 1)]

    @property
    def overhead_share(self) -> float:
        """Share of the loop's wall time spent outside the two models' forwards."""
        if self.total_seconds <= 0:
            return float("nan")
        return 1.0 - (self.target_forward_seconds + self.drafter_forward_seconds) / self.total_seconds


class _Target:
    """The target split into its base model (features = post-norm last hidden state) and LM head.

    ``feature_layers`` (the drafter's :meth:`~hf_spec.drafters.base.SpecDrafterModel.target_feature_layers`):
    each forward also captures the inputs of those decoder layers (HF ``hidden_states[i]``) with
    forward pre-hooks, only those, not ``output_hidden_states``, into :attr:`drafter_features`
    (their concatenation); None: the drafter's features are the last hidden state itself."""

    def __init__(self, model, feature_layers=None):
        self.base = model.base_model
        self.lm_head = model.get_output_embeddings()
        self.sliding_window = target_sliding_window(model.config)
        self.device = model.device
        self.seconds = 0.0
        self.feature_layers = tuple(feature_layers) if feature_layers else None
        self.drafter_features = None
        """What the drafter reads of the last forward, (b, q, ·), set by :meth:`_run`."""
        if self.feature_layers is not None:
            layers = getattr(self.base, "layers", None)
            if layers is None or max(self.feature_layers) >= len(layers):
                raise ValueError(f"The drafter reads target layers {list(self.feature_layers)}, but the target has "
                                 f"{len(layers or [])} decoder layers in `.layers`. Fix: use the drafter's own target.")  # fmt: skip
            self._layers = [layers[i] for i in self.feature_layers]

    def _run(self, **inputs) -> torch.Tensor:
        """The base model's (b, q, H) last hidden state; sets :attr:`drafter_features`."""
        start = timing.clock(self.device)
        if self.feature_layers is None:
            out = self.base(**inputs, use_cache=True).last_hidden_state
            self.drafter_features = out
        else:
            captured = []

            def capture(module, args, kwargs):
                captured.append(args[0] if args else kwargs["hidden_states"])

            hooks = [layer.register_forward_pre_hook(capture, with_kwargs=True) for layer in self._layers]
            try:
                out = self.base(**inputs, use_cache=True).last_hidden_state
            finally:
                for hook in hooks:
                    hook.remove()
            self.drafter_features = torch.cat(captured, dim=-1)  # layers run in ascending order, as the ids
        self.seconds += timing.clock(self.device) - start
        return out

    def forward(self, input_ids, cache, attention_mask=None, position_ids=None) -> torch.Tensor:
        """Run the base model on top of ``cache``; returns the features (n, H) of the new tokens
        (the drafter's features of them: ``drafter_features[0]``)."""
        return self._run(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache)[0]  # fmt: skip

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Raw float32 logits of features (..., H): one LM-head matmul (one read of its weights)
        in the target's dtype, then ``.float()``. Verification runs it over every tree node:
        free on a GPU (memory bound), but on a CPU 61 rows of SmolLM2's head cost about 4 (fp32)
        / 2.7 (bf16) single-row calls, more than a walk at tau ~1.6 visits (measured 1 thread)."""
        start = timing.clock(self.device)
        logits = self.lm_head(features).float()
        self.seconds += timing.clock(self.device) - start
        return logits


def target_sliding_window(config) -> int | None:
    """The target's attention window if all its layers use one, None if none do."""
    config = config.get_text_config()
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    if layer_types is not None and any(t != "sliding_attention" for t in layer_types):
        raise ValueError(
            "Targets that mix sliding-window and full-attention layers are not supported by tree verification yet. "
            "Fix: use plain generate() or transformers' assisted decoding for this model."
        )
    if getattr(config, "model_type", None) == "qwen2" and not getattr(config, "use_sliding_window", False):
        return None
    return int(window)


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
    if _is_batched(input_ids, model_kwargs):
        from .batched import check_batch_supported

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


def stop_flags(sequence: torch.Tensor, start: int, stopping_criteria) -> torch.Tensor:
    """(k,) bool on device: whether ``stopping_criteria`` fire on each prefix ``sequence[:, :start + i + 1]``
    of the k tokens appended after ``start``; one host read of it replaces a sync per token."""
    return torch.stack(
        [stopping_criteria(sequence[:, : start + i + 1], None).all() for i in range(sequence.shape[1] - start)]
    )


def _is_batched(input_ids, model_kwargs) -> bool:
    """Batch size > 1 or a padded prompt: the batched loop (:mod:`hf_spec.batched`) runs it."""
    mask = model_kwargs.get("attention_mask")
    return input_ids.shape[0] > 1 or (mask is not None and not bool(mask.bool().all()))


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
    use_router: bool | None = None,
    ngram_branches: int | None = None,
    **model_kwargs,
):
    """Tree speculative decoding of ``model`` with ``drafter``.

    Called by transformers' ``generate`` (``custom_generate``) with the prepared processors,
    stopping criteria and generation config. Returns what ``generate`` would. Batches (and
    left-padded prompts) go to :func:`hf_spec.batched.batched_speculative_decode`.
    """
    check_supported(model, input_ids, generation_config, model_kwargs)
    if not drafter.is_bound_to(model):
        drafter.bind(model)
    do_sample = bool(generation_config.do_sample)
    shape = drafter.tree_shape(tree_depth, tree_top_k, tree_total_tokens)
    shape.validate(do_sample)
    temperature = float(generation_config.temperature or 1.0) if do_sample else 1.0
    if _is_batched(input_ids, model_kwargs):
        from .batched import batched_speculative_decode

        _check_streamer(streamer, input_ids)
        return batched_speculative_decode(model, input_ids, logits_processor, stopping_criteria, generation_config,
                                          drafter=drafter, shape=shape, do_sample=do_sample, temperature=temperature,
                                          attention_mask=model_kwargs.get("attention_mask"),
                                          use_router=use_router, ngram_branches=ngram_branches)  # fmt: skip

    stats = GenerationStats()
    drafter.last_generation_stats = stats
    loop_start = timing.clock(model.device)
    target = _Target(model, drafter.target_feature_layers())
    keep_scores = bool(generation_config.return_dict_in_generate and generation_config.output_scores)
    keep_logits = bool(generation_config.return_dict_in_generate and generation_config.output_logits)
    all_scores, all_logits = [], []

    input_ids = input_ids.to(model.device)
    session = new_session(drafter, model, shape, do_sample, temperature, input_ids, use_router, ngram_branches)
    cache = compat.full_dynamic_cache()
    features = target.forward(input_ids, cache)
    last_logits = target.logits(features[-1])
    sequence = input_ids
    prompt_length = input_ids.shape[1]

    def process(context: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        return logits_processor(context, raw.view(1, -1))[0] if len(logits_processor) else raw

    first_scores = process(sequence, last_logits)
    if do_sample:
        first = torch.multinomial(torch.softmax(first_scores, dim=-1), 1)
    else:
        first = first_scores.argmax().view(1)
    pending_features = target.drafter_features[0]
    pending_tokens = torch.cat([input_ids[0, 1:], first])
    emitted, emitted_host = first, first.tolist()
    step_scores, step_logits = [first_scores], [last_logits]

    while True:
        start = sequence.shape[1]
        sequence = torch.cat([sequence, emitted.view(1, -1).to(sequence.dtype)], dim=1)
        fired = stop_flags(sequence, start, stopping_criteria).tolist()
        kept = fired.index(True) + 1 if True in fired else len(fired)
        sequence = sequence[:, : start + kept]
        for i in range(kept):
            if streamer is not None:
                streamer.put(torch.tensor([emitted_host[i]]))
            if keep_scores:
                all_scores.append(step_scores[i].view(1, -1))
            if keep_logits:
                all_logits.append(step_logits[i].view(1, -1))
        if kept < len(fired) or fired[-1]:
            break

        tree = session.propose(pending_features, pending_tokens)
        past = cache.get_seq_length()
        features = target.forward(
            tree.tokens.view(1, -1),
            cache,
            attention_mask=tree.attention_mask(past, target.base.dtype, target.sliding_window),
            position_ids=tree.position_ids(past),
        )

        def process_node(node: int, raw: torch.Tensor, context=sequence, tree=tree) -> torch.Tensor:
            return process(torch.cat([context, tree.path_tokens(node).view(1, -1)], dim=1), raw)

        walk = verify_tree(tree, target.logits(features), process_node if len(logits_processor) else None,
                           do_sample, keep_scores or keep_logits)  # fmt: skip
        stats.record(tree, walk)
        accepted = walk.node_tensor(features.device)
        keep_accepted(cache, past, accepted, contiguous=walk.accepted_contiguously)
        pending_features = target.drafter_features[0, accepted]
        pending_tokens = emitted = walk.token_tensor(features.device)
        emitted_host, step_scores, step_logits = walk.tokens, walk.scores, walk.logits

    crop_to(cache, sequence.shape[1] - 1)
    if streamer is not None:
        streamer.end()
    stats.new_tokens = sequence.shape[1] - prompt_length
    stats.target_forward_seconds = target.seconds
    stats.drafter_forward_seconds = getattr(session, "forward_seconds", 0.0)
    stats.total_seconds = timing.clock(model.device) - loop_start
    if generation_config.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(
            sequences=sequence,
            scores=tuple(all_scores) if keep_scores else None,
            logits=tuple(all_logits) if keep_logits else None,
            past_key_values=cache if generation_config.use_cache else None,
        )
    return sequence


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
