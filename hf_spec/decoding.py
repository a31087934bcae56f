"""The tree speculative decoding loop: ONE loop over rows, batch 1 being one row.

Every call runs the same phases (:func:`decode`): set-up, prefill and first token of every
row, then per cycle: emit (append each row's tokens, stopping criteria, streamer; the speed
controller gets the last cycle's wall time and committed tokens) -> choose (the controller's
arm for this cycle: plain, or one of the drafter's tree shapes, :mod:`hf_spec.controller`) ->
propose (one draft tree per row, by that arm's drafting session) -> verify (one target forward
and one LM-head matmul for all rows, then each row's walk, :func:`hf_spec.verify.verify_tree`)
-> commit (stats, the accepted path becomes the row's pending pairs, the cache keeps it) -> output.

Drafting stays per row: every row has its own drafting sessions (:class:`RowDrafting`: one
:class:`~hf_spec.drafters.session.DraftingSession` per drafted arm, each with its own drafter
cache, fed the committed pairs it missed), started from that row's unpadded prompt. Only the target's cache layout differs with the batch, behind the
same four methods (prefill, keep_rows, verify, commit):

- :class:`_OneRowCache`, the fast path of one unpadded prompt: the cache holds exactly the
  row's positions, the tree's mask is the tree's own (:meth:`DraftTree.attention_mask`), and
  the accepted path is compacted in place (:func:`hf_spec.cache.keep_accepted`, no copy
  when it is contiguous).
- :class:`_PaddedCache`, a batch of left-padded prompts (batch size > 1 or a padded
  prompt): each row's draft tree is padded to the widest tree (pad nodes attend only to
  themselves and are never visited), under one (b, 1, q, past + q) additive mask that
  combines each row's tree mask, its cache-slot validity (left padding and holes) and, for
  sliding-window targets, the window; position ids are per row.

Padded cache layout: one ``DynamicCache`` of uniform length L for all rows, plus ``valid``
(b, L): which slots hold one of the row's tokens, and ``slot_pos`` (b, L): their positions.
After a verification forward, row r's accepted tree entries (root first) are gathered into
the first slots after the old length; the batch keeps max_r(accepted_r + 1) new slots and
the rows that accepted fewer get invalid slots ("holes"), masked in later forwards. Rows
that have finished are dropped from the cache (and from every later forward). When the
holes grow past ``max(HOLE_SLACK, longest_row // 4)`` slots, the cache is re-packed with
each row's valid slots right-aligned (left padding again). Bound: L <= longest_row +
max(HOLE_SLACK, longest_row // 4) + tree depth + 1, where longest_row is the most tokens
(prompt + generated) any unfinished row holds; re-packing copies the cache once per at
least HOLE_SLACK / (tree depth + 1) cycles.

What the output equals: for one prompt, plain ``generate()`` (greedy: token for token;
sampling: the same law), with ``output_scores``/``output_logits``, the streamer and the cache
as ``_sample`` returns them. For a batch, transformers' batched ``generate()`` on the same
left-padded input: each row's tokens after the prompt, and once a row's stopping criteria
fire, the pad token (when an EOS criterion exists, as ``_sample`` pads finished rows), the
whole batch ending when every row has finished. Logits processors and stopping criteria see
a row's own padded sequence (padded prompt + its tokens), which is what the row sees in
batched ``generate()``; for processors that ignore the padding (none, temperature,
top-k/p, EOS and length criteria), that is also each row's plain single-prompt ``generate()``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from . import compat, linear_kernels, timing, verify_cost
from .cache import crop_to, gather_positions, keep_accepted, select_rows
from .controller import SpeedController
from .drafters.hybrid import with_ngram_branches
from .drafters.session import DraftingSession, check_node_count
from .static_cache import MAX_BUCKET, static_layout, wants_static_cache
from .stats import BatchGenerationStats, GenerationStats
from .tree.tree import DraftTree
from .verify import WalkResult, greedy_plan, greedy_result, verify_tree

HOLE_SLACK = 32
"""Invalid cache slots tolerated beyond ``longest_row // 4`` before a padded cache is re-packed."""


def new_session(drafter, model, shape, do_sample: bool, temperature: float, prompt_ids, use_router: bool | None,
                ngram_nodes: int | None = None) -> DraftingSession:  # fmt: skip
    """The drafter's drafting session for one sequence; ``use_router`` (None: the drafter's
    config) switches a CORAL LM-head router on or off for this call; ``ngram_nodes`` (None:
    the drafter's config) sets how many context n-gram nodes are grafted into each of a trained
    drafter's trees (:mod:`hf_spec.drafters.hybrid`, whatever the family)."""
    session = drafter.new_drafting_session(model, shape, do_sample, temperature, prompt_ids=prompt_ids)
    if session.wants_verify_costs and model is not None:  # an n-gram session sized by this machine's costs
        session.use_verify_costs(verify_cost.verify_costs(model).curve())
    if use_router is not None:
        if use_router and not session.supports_router:
            raise ValueError(
                "use_router=True but this drafter has no LM-head router. Fix: drop use_router, or train a router "
                "(training_scripts/train_coral.py)."
            )
        if session.supports_router:
            session.use_router = bool(use_router)
    if ngram_nodes is not None:
        check_node_count(ngram_nodes)
        if ngram_nodes and not drafter.supports_ngram_branches:
            raise ValueError(
                f"ngram_nodes={ngram_nodes} grafts n-gram branches into a trained drafter's trees, not into "
                f"{type(drafter).__name__}'s. Fix: drop ngram_nodes (for n-gram trees alone, use "
                "hf_spec.NGramDrafter)."
            )
    elif drafter.supports_ngram_branches:
        ngram_nodes = drafter.config.ngram_nodes
    return with_ngram_branches(session, drafter, model, shape, do_sample, prompt_ids, ngram_nodes or 0)


@dataclass(frozen=True)
class Arm:
    """One way to run a cycle, an arm of the speed controller (:mod:`hf_spec.controller`): ``shape`` None drafts
    nothing (plain: the tree is its root, one target step); else the drafter's tree shape and n-gram budget
    (``ngram_nodes``; None: the drafter's config)."""

    label: str
    shape: object | None = None
    ngram_nodes: int | None = None


PLAIN = Arm("plain")
"""Arm 0 of every controlled call: no draft."""


class RowDrafting:
    """One row's drafting across arms: a drafting session per drafted arm, made on the arm's first cycle, each
    fed the committed (features, tokens) pairs it has not read yet, from one history of them per row. So the
    arm may change at any cycle: an arm that did not run reads what it missed (prompt included) on its next
    cycle, and its session's state is exactly as if it had run all along, minus the trees it did not draft."""

    def __init__(self, make_session, drafted_arms: int):
        self._make_session = make_session
        self._drafted_arms = drafted_arms
        self._history: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._sessions: dict[int, tuple[DraftingSession, int]] = {}  # arm index -> (session, history read)
        self.copied = False
        """Whether the last tree was a copy cycle's (:attr:`DraftingSession.copied`)."""

    def propose(self, index: int, arm: Arm, features: torch.Tensor, tokens: torch.Tensor) -> DraftTree:
        """Commit the pairs and draft the tree of arm ``index`` rooted at ``tokens[-1]``."""
        self._history.append((features, tokens))
        self.copied = False
        if arm.shape is None:
            return DraftTree.chain(tokens[-1], tokens.new_empty(0))
        known = self._sessions.get(index)
        session, read = known or (self._make_session(arm), 0)
        unread = self._history[read:]
        self._sessions[index] = (session, len(self._history))
        if len(unread) > 1:
            if known is not None:  # the first pairs are the commit of this session's last tree, the rest other arms'
                session.read_other_arms(len(unread[0][1]))
            features = torch.cat([f for f, _ in unread])
            tokens = torch.cat([t for _, t in unread])
        if len(self._sessions) == self._drafted_arms:  # every arm has a session: drop what all of them read
            low = min(r for _, r in self._sessions.values())
            if low:
                self._history = self._history[low:]
                self._sessions = {i: (s, r - low) for i, (s, r) in self._sessions.items()}
        tree = session.propose(features, tokens)
        self.copied = session.copied
        return tree

    def record(self, stats) -> None:
        """Every session's counters into the row's stats."""
        for session, _ in self._sessions.values():
            session.record(stats)


def target_layers(base_model, layer_ids) -> list:
    """Decoder layers ``layer_ids`` (ascending: the order they run in) of a target's base model; ValueError
    naming the fix when the target does not have them."""
    layers = getattr(base_model, "layers", None)
    ids = [int(i) for i in layer_ids]
    if layers is None or not ids or min(ids) < 0 or max(ids) >= len(layers) or ids != sorted(ids):
        raise ValueError(f"Target layers {ids} (ascending) are not decoder layers of this target, which has "
                         f"{len(layers or [])} in `.layers`. Fix: use the drafter's own target.")  # fmt: skip
    return [layers[i] for i in ids]


def forward_with_layer_inputs(base_model, layers, **inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """One base-model forward: (post-norm last hidden state, the inputs of ``layers`` (HF ``hidden_states[i]``)
    concatenated on the last dimension in the order they run), captured by forward pre-hooks on those
    layers only, never ``output_hidden_states``. What an EAGLE-3 drafter reads, at decoding and in training."""
    captured = []

    def capture(module, args, kwargs):
        captured.append(args[0] if args else kwargs["hidden_states"])

    hooks = [layer.register_forward_pre_hook(capture, with_kwargs=True) for layer in layers]
    try:
        out = base_model(**inputs).last_hidden_state
    finally:
        for hook in hooks:
            hook.remove()
    return out, torch.cat(captured, dim=-1)


class _Target:
    """The target split into its base model (features = post-norm last hidden state) and LM head.

    ``feature_layers`` (the drafter's :meth:`~hf_spec.drafters.base.SpecDrafterModel.target_feature_layers`):
    each forward also captures the inputs of those decoder layers (HF ``hidden_states[i]``) with
    forward pre-hooks, only those, not ``output_hidden_states``, into :attr:`drafter_features`
    (their concatenation); None: the drafter's features are the last hidden state itself."""

    def __init__(self, model, feature_layers=None):
        self.base = model.base_model
        self.lm_head = model.get_output_embeddings()
        self.sliding_window = compat.target_sliding_window(model.config)
        self.device = model.device
        self.watch = timing.Stopwatch(self.device)
        """Time in the target's forwards and LM head (no host sync per forward on CUDA)."""
        self.feature_layers = tuple(feature_layers) if feature_layers else None
        self.drafter_features = None
        """What the drafter reads of the last forward, (b, q, ·), set by :meth:`forward`."""
        if self.feature_layers is not None:
            self._layers = target_layers(self.base, self.feature_layers)

    def forward(self, input_ids, cache, attention_mask=None, position_ids=None, call=None) -> torch.Tensor:
        """The base model over (b, q) new tokens on top of ``cache``: the (b, q, H) last hidden
        state; sets :attr:`drafter_features`. ``call``: the base model's compiled call to run instead
        (the drafter's layer inputs then come from ``output_hidden_states``: hooks would recompile it)."""
        with self.watch():
            return self._forward(input_ids, cache, attention_mask, position_ids, call)

    def _forward(self, input_ids, cache, attention_mask, position_ids, call) -> torch.Tensor:
        inputs = dict(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      past_key_values=cache, use_cache=True)  # fmt: skip
        if call is not None:
            result = call(**inputs, output_hidden_states=self.feature_layers is not None)
            out = result.last_hidden_state
            self.drafter_features = out if self.feature_layers is None else torch.cat(
                [result.hidden_states[i] for i in self.feature_layers], dim=-1)  # fmt: skip
        elif self.feature_layers is None:
            out = self.base(**inputs).last_hidden_state
            self.drafter_features = out
        else:
            out, self.drafter_features = forward_with_layer_inputs(self.base, self._layers, **inputs)
        return out

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Raw float32 logits of features (..., H): one LM-head matmul (one read of its weights)
        in the target's dtype, then ``.float()``. Verification runs it over every tree node:
        free on a GPU (memory bound), but on a CPU 61 rows of SmolLM2's head cost about 4 (fp32)
        / 2.7 (bf16) single-row calls, more than a walk at tau ~1.6 visits (measured 1 thread)."""
        with self.watch():
            return self.lm_head(features).float()


def stop_flags(sequence: torch.Tensor, start: int, stopping_criteria) -> torch.Tensor:
    """(k,) bool on device: whether ``stopping_criteria`` fire on each prefix ``sequence[:, :start + i + 1]``
    of the k tokens appended after ``start``; one host read of it replaces a sync per token."""
    return torch.stack(
        [stopping_criteria(sequence[:, : start + i + 1], None).all() for i in range(sequence.shape[1] - start)]
    )


def is_batched(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
    """Batch size > 1 or a padded prompt: the rows need the padded cache layout."""
    return input_ids.shape[0] > 1 or (attention_mask is not None and not bool(attention_mask.bool().all()))


def left_padding(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor:
    """(b,) pad tokens in front of each row (on the CPU); ValueError unless the mask is left padding."""
    if attention_mask is None:
        return torch.zeros(input_ids.shape[0], dtype=torch.long)
    mask = attention_mask.bool().cpu()
    if mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask has shape {tuple(mask.shape)} but input_ids {tuple(input_ids.shape)}. "
            "Fix: pass the 2D mask the tokenizer returned with the ids."
        )
    lengths = mask.sum(dim=1)
    if bool((lengths == 0).any()):
        raise ValueError("A prompt in the batch is all padding. Fix: give every row at least one token.")
    pads = mask.shape[1] - lengths
    expected = torch.arange(mask.shape[1]).view(1, -1) >= pads.view(-1, 1)
    if not torch.equal(mask, expected):
        raise ValueError(
            "hf-spec batched tree decoding needs left-padded prompts (padding only at the start of a row), but the "
            "attention_mask has padding after real tokens (right padding?). Fix: tokenize with "
            "`tokenizer.padding_side = 'left'`."
        )
    return pads


def check_batch_supported(input_ids: torch.Tensor, generation_config, attention_mask=None) -> None:
    """ValueError for what the batched path cannot do, before generating."""
    gc = generation_config
    if gc.return_dict_in_generate and (gc.output_scores or gc.output_logits):
        raise ValueError(
            "output_scores/output_logits are not supported with hf-spec batched tree decoding (batch size "
            f"{input_ids.shape[0]}): rows advance at different speeds, so per-step batch scores do not exist. "
            "Fix: call generate() once per prompt for scores, or drop output_scores/output_logits."
        )
    left_padding(attention_mask, input_ids)


# -- the target's cache layouts ------------------------------------------------------------------
class _OneRowCache:
    """One unpadded prompt (the fast path): the cache holds exactly the row's positions, the tree
    mask is the tree's own, and the accepted path is compacted in place."""

    engines = None
    """Every forward runs eagerly: no engine choice (see :attr:`~hf_spec.static_cache.StaticTreeCache.engines`)."""

    def __init__(self, capacity: int | None):
        self.cache = compat.full_dynamic_cache(capacity)
        self.past = 0

    def prefill(self, target: _Target, input_ids: torch.Tensor) -> torch.Tensor:
        return target.forward(input_ids, self.cache)

    def prompt_start(self, row: int) -> int:
        return 0

    def keep_rows(self, keep: list[int]) -> None:
        """Nothing to do: the one row stays until the call ends."""

    def verify(self, target: _Target, trees: list[DraftTree]) -> list[torch.Tensor]:
        (tree,) = trees
        self.past = past = self.cache.get_seq_length()
        if len(tree) == 1:  # a lone root (a plain cycle): the plain decoding step itself, no tree mask to build
            features = target.forward(tree.tokens.view(1, -1), self.cache)
        else:
            features = target.forward(tree.tokens.view(1, -1), self.cache,
                                      attention_mask=tree.attention_mask(past, target.base.dtype, target.sliding_window),
                                      position_ids=tree.position_ids(past))  # fmt: skip
        return [target.logits(features[0])]

    def commit(self, accepted: list[torch.Tensor], walks: list[WalkResult]) -> None:
        keep_accepted(self.cache, self.past, accepted[0], contiguous=walks[0].accepted_contiguously)

    def sequences(self, rows: list[_Row], prompt_length: int, horizon: int, pad_token) -> torch.Tensor:
        return rows[0].sequence[:, : prompt_length + horizon]

    def final_cache(self, length: int):
        crop_to(self.cache, length - 1)
        return self.cache


class _PaddedCache:
    """Left-padded rows in one cache of uniform length, with per-slot validity and positions
    (see the module docstring)."""

    engines = None
    """Every forward runs eagerly: no engine choice."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, capacity: int | None):
        self.pads = left_padding(attention_mask, input_ids)
        device = input_ids.device
        self.valid = torch.arange(input_ids.shape[1], device=device).view(1, -1) >= self.pads.to(device).view(-1, 1)
        self.slot_pos = (self.valid.long().cumsum(dim=1) - 1).clamp(min=0)
        self.cache = compat.full_dynamic_cache(capacity)
        self.start_pos = None

    def prefill(self, target: _Target, input_ids: torch.Tensor) -> torch.Tensor:
        padded = bool((self.pads > 0).any())
        return target.forward(input_ids, self.cache, self.valid.long() if padded else None,
                              self.slot_pos if padded else None)  # fmt: skip

    def prompt_start(self, row: int) -> int:
        return int(self.pads[row])

    def keep_rows(self, keep: list[int]) -> None:
        """Drop the cache rows of finished rows; re-pack once the holes exceed the slack."""
        if len(keep) < self.valid.shape[0]:
            index = torch.tensor(keep, device=self.valid.device)
            select_rows(self.cache, index)
            self.valid, self.slot_pos = self.valid[index], self.slot_pos[index]
        self.valid, self.slot_pos = _maybe_repack(self.cache, self.valid, self.slot_pos)

    def verify(self, target: _Target, trees: list[DraftTree]) -> list[torch.Tensor]:
        self.start_pos = self.valid.sum(dim=1)
        tokens, positions, mask = _verify_mask(trees, self.valid, self.slot_pos, self.start_pos, target.base.dtype,
                                               target.sliding_window)  # fmt: skip
        features = target.forward(tokens, self.cache, mask, positions)
        # One LM-head matmul over every real node of every row's tree (one read of the head's weights).
        sizes = [len(tree) for tree in trees]
        q = features.shape[1]
        flat = torch.cat([torch.arange(r * q, r * q + n, device=features.device) for r, n in enumerate(sizes)])
        return list(target.logits(features.reshape(-1, features.shape[-1])[flat]).split(sizes))

    def commit(self, accepted: list[torch.Tensor], walks: list[WalkResult]) -> None:
        device, past = self.valid.device, self.valid.shape[1]
        width = max(nodes.numel() for nodes in accepted)
        index = torch.stack([torch.cat([n, n[-1:].expand(width - n.numel())]) for n in accepted]) + past
        gather_positions(self.cache, past, index)
        new_valid = torch.arange(width, device=device).view(1, -1) < torch.tensor(
            [n.numel() for n in accepted], device=device).view(-1, 1)  # fmt: skip
        self.valid = torch.cat([self.valid, new_valid], dim=1)
        new_pos = self.start_pos.view(-1, 1) + torch.arange(width, device=device).view(1, -1)
        self.slot_pos = torch.cat([self.slot_pos, new_pos], dim=1)

    def sequences(self, rows: list[_Row], prompt_length: int, horizon: int, pad_token) -> torch.Tensor:
        """(b, P + horizon): each row's first ``new_tokens`` tokens, then the pad token (0 without one)."""
        first = rows[0].sequence
        fill = int(pad_token) if pad_token is not None else 0
        out = torch.full((len(rows), prompt_length + horizon), fill, dtype=first.dtype, device=first.device)
        for row in rows:
            end = prompt_length + row.stats.new_tokens
            out[row.index, :end] = row.sequence[0, :end]
        return out

    def final_cache(self, length: int):
        return None  # per-row holes and dropped rows: not a cache generate() would return


def _verify_mask(trees, valid, slot_pos, start_pos, dtype, sliding_window):
    """Tokens, position ids and the additive (b, 1, q, L + q) mask of one batched tree forward."""
    b, length = valid.shape
    device = valid.device
    q = max(len(tree) for tree in trees)
    tokens = torch.zeros(b, q, dtype=torch.long, device=device)
    depths = torch.zeros(b, q, dtype=torch.long, device=device)
    tree_allowed = torch.eye(q, dtype=torch.bool, device=device).repeat(b, 1, 1)  # pad nodes: themselves only
    real = torch.zeros(b, q, dtype=torch.bool, device=device)
    for r, tree in enumerate(trees):
        n = len(tree)
        tokens[r, :n] = tree.tokens
        depths[r, :n] = tree.depths
        tree_allowed[r, :n, :n] = tree.ancestor_matrix()
        real[r, :n] = True
    positions = start_pos.view(-1, 1) + depths
    past_allowed = valid.view(b, 1, length) & real.view(b, q, 1)
    allowed = torch.cat([past_allowed, tree_allowed], dim=2)
    if sliding_window is not None:
        key_pos = torch.cat([slot_pos, positions], dim=1)
        allowed &= key_pos.view(b, 1, -1) > positions.view(b, q, 1) - sliding_window
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, torch.finfo(dtype).min)
    return tokens, positions, mask.unsqueeze(1)


def _maybe_repack(cache, valid: torch.Tensor, slot_pos: torch.Tensor):
    """Re-pack the cache (each row's valid slots right-aligned) once holes exceed the slack."""
    length = valid.shape[1]
    longest = int(valid.sum(dim=1).max())
    if length - longest <= max(HOLE_SLACK, longest // 4):
        return valid, slot_pos
    order = torch.sort(valid.to(torch.int8), dim=1, stable=True).indices  # invalid slots first, order kept
    index = order[:, length - longest :]
    gather_positions(cache, 0, index)
    return valid.gather(1, index), slot_pos.gather(1, index)


# -- the loop --------------------------------------------------------------------------------------
@dataclass
class _Row:
    """Decoding state of one row (the whole call for one prompt)."""

    index: int  # row in the input batch
    drafting: RowDrafting  # the row's drafting sessions, one per drafted arm
    sequence: torch.Tensor  # (1, P + n): (padded) prompt + generated tokens
    pending_features: torch.Tensor  # what the next propose() commits: features of the accepted positions…
    pending_tokens: torch.Tensor  # …and the token after each (the last is the next root)
    emitted: torch.Tensor  # (k,) tokens of the last cycle, not yet appended to ``sequence``
    stats: GenerationStats
    emitted_host: list[int] | None = None  # ``emitted`` as read back by the walk (None: not read)
    scores: list = field(default_factory=list)  # processed / raw scores of ``emitted`` (output_scores/logits)
    logits: list = field(default_factory=list)
    stop_length: int | None = None  # generated tokens when the stopping criteria fired

    def generated(self, prompt_length: int) -> int:
        return self.sequence.shape[1] - prompt_length


@dataclass
class _Call:
    """What stays fixed during one call, and the phases that read it."""

    logits_processor: object
    processors: list  # each row's processors (one row: ``logits_processor`` itself)
    stopping_criteria: object
    do_sample: bool
    prompt_length: int
    has_eos: bool
    max_length: int | None
    streamer: object = None
    keep_scores: bool = False
    keep_logits: bool = False
    all_scores: list = field(default_factory=list)
    all_logits: list = field(default_factory=list)

    def process(self, row: int, context: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        """The row's logits processors on one position, with the row's own context (batch of one)."""
        return self.processors[row](context, raw.view(1, -1))[0] if len(self.logits_processor) else raw

    def first_token(self, row: int, sequence: torch.Tensor, raw: torch.Tensor):
        """(token (1,), its processed scores) after the prompt, as ``_sample``'s first step."""
        scores = self.process(row, sequence, raw)
        first = torch.multinomial(torch.softmax(scores, dim=-1), 1) if self.do_sample else scores.argmax().view(1)
        return first, scores

    def emit(self, active: list[_Row]) -> None:
        """Append each row's emitted tokens in one cat; the stopping criteria of every prefix of
        every row are read back in one host transfer (they must fire at the same token as in
        generate()); the streamer and kept scores get the tokens up to a row's stop."""
        checks, starts = [], []
        for row in active:
            start = row.sequence.shape[1]
            tokens = row.emitted if self.max_length is None else row.emitted[: max(self.max_length - start, 0)]
            row.sequence = torch.cat([row.sequence, tokens.view(1, -1).to(row.sequence.dtype)], dim=1)
            starts.append(start)
            if row.stop_length is None and tokens.numel():
                checks.append(stop_flags(row.sequence, start, self.stopping_criteria))
        fired = torch.cat(checks).tolist() if checks else []
        for row, start in zip(active, starts):
            kept = row.sequence.shape[1] - start
            if row.stop_length is None:
                flags, fired = fired[:kept], fired[kept:]
                if True in flags:
                    kept = flags.index(True) + 1
                    row.stop_length = start + kept - self.prompt_length
                    if self.has_eos:
                        row.sequence = row.sequence[:, : start + kept]
            if self.streamer is not None:
                host = row.emitted_host if row.emitted_host is not None else row.emitted.tolist()
                for token in host[:kept]:
                    self.streamer.put(torch.tensor([token]))
            if self.keep_scores:
                self.all_scores += [scores.view(1, -1) for scores in row.scores[:kept]]
            if self.keep_logits:
                self.all_logits += [logits.view(1, -1) for logits in row.logits[:kept]]
            row.emitted = row.emitted[:0]

    def walk(self, active: list[_Row], trees: list[DraftTree], row_logits: list[torch.Tensor]) -> list[WalkResult]:
        """Each row's verification walk over its tree's raw logits (n, V)."""
        processed = len(self.logits_processor) > 0
        keep = self.keep_scores or self.keep_logits
        if self.do_sample or processed or keep or len(trees) == 1:
            walks = []
            for row, tree, logits in zip(active, trees, row_logits):

                def process_node(node: int, raw: torch.Tensor, tree=tree, context=row.sequence, index=row.index):
                    return self.process(index, torch.cat([context, tree.path_tokens(node).view(1, -1)], dim=1), raw)

                walks.append(verify_tree(tree, logits, process_node if processed else None, self.do_sample, keep))
            return walks
        # every row's greedy walk on device, read back in one transfer
        plans = [greedy_plan(tree, logits) for tree, logits in zip(trees, row_logits)]
        width = max(plan.numel() for plan in plans)
        packed = torch.stack([torch.nn.functional.pad(plan, (0, width - plan.numel())) for plan in plans])
        return [greedy_result(host, len(tree), None, plan) for host, tree, plan in zip(packed.tolist(), trees, plans)]


def decode(model, input_ids, logits_processor, stopping_criteria, generation_config, *, drafter, arms: list[Arm],
           controller: SpeedController | None, do_sample: bool, temperature: float, attention_mask=None,
           streamer=None, use_router: bool | None = None):  # fmt: skip
    """Tree speculative decoding of ``input_ids`` (one prompt, or a left-padded batch); returns what
    ``generate()`` would, and the call's :class:`~hf_spec.stats.GenerationStats` (a
    :class:`~hf_spec.stats.BatchGenerationStats` for a batch).

    Called by :func:`hf_spec.generation.speculative_decode` after its checks, with the drafter
    bound and the arms' shapes validated. ``controller`` (:class:`~hf_spec.controller.SpeedController` over
    ``arms``) chooses each cycle's arm from the measured wall time per committed token; None: ``arms`` is one
    arm, used for every cycle.
    """
    if controller is None and len(arms) != 1:
        raise ValueError("Several arms need a speed controller to choose among them.")
    device = model.device
    input_ids = input_ids.to(device)
    batch, prompt_length = input_ids.shape
    one_row = not is_batched(input_ids, attention_mask)
    has_eos = any(hasattr(criteria, "eos_token_id") for criteria in stopping_criteria)
    pad_token = compat.pad_token_tensor(generation_config)
    if not one_row and has_eos and pad_token is None:
        raise ValueError("Batched generation with an EOS token needs a pad token. Fix: pass pad_token_id.")
    gc = generation_config
    call = _Call(
        logits_processor=logits_processor,
        processors=[logits_processor] if one_row else [compat.row_logits_processor(logits_processor, r)
                                                       for r in range(batch)],
        stopping_criteria=stopping_criteria, do_sample=do_sample, prompt_length=prompt_length, has_eos=has_eos,
        max_length=getattr(stopping_criteria, "max_length", None), streamer=streamer,
        keep_scores=bool(gc.return_dict_in_generate and gc.output_scores),
        keep_logits=bool(gc.return_dict_in_generate and gc.output_logits),
    )  # fmt: skip

    # Set-up and prefill; every row's session and first token.
    stats = GenerationStats() if one_row else BatchGenerationStats()
    loop_start = timing.clock(device)
    drafted_arms = sum(arm.shape is not None for arm in arms)
    target = _Target(model, drafter.target_feature_layers())  # every call has a drafted arm: features are read
    if wants_static_cache(gc):
        layout = static_layout(model, gc, call.max_length, one_row)
    else:
        # what the cache's buffers allocate ahead: the call's positions and a large tree (past it they double)
        capacity = None if call.max_length is None else call.max_length + MAX_BUCKET
        layout = _OneRowCache(capacity) if one_row else _PaddedCache(input_ids, attention_mask, capacity)
    features = layout.prefill(target, input_ids)
    last_logits = target.logits(features[:, -1])
    rows: list[_Row] = []
    for r in range(batch):
        start = layout.prompt_start(r)
        row_prompt = input_ids[r : r + 1, start:]
        def make_session(arm: Arm, row_prompt=row_prompt) -> DraftingSession:
            return new_session(drafter, model, arm.shape, do_sample, temperature, row_prompt, use_router,
                               arm.ngram_nodes)  # fmt: skip

        first, scores = call.first_token(r, input_ids[r : r + 1], last_logits[r])
        rows.append(_Row(index=r, drafting=RowDrafting(make_session, drafted_arms), sequence=input_ids[r : r + 1],
                         pending_features=target.drafter_features[r, start:],
                         pending_tokens=torch.cat([row_prompt[0, 1:], first]), emitted=first,
                         stats=stats if one_row else GenerationStats(),
                         scores=[scores], logits=[last_logits[r]]))  # fmt: skip
    if not one_row:
        stats.rows = [row.stats for row in rows]
    active = list(rows)
    if controller is not None:
        controller.start_call()
    arm_index, cycle_start, committed, copied = 0, None, 0, False
    costs = None  # the target's live verification costs, once a drafter has asked for them (verify_cost)

    while True:
        # Emit: the last cycle's tokens join each row's sequence; stop checks.
        call.emit(active)
        if cycle_start is not None:  # the cycle's wall time, emit included
            stats.cycle_seconds.append(time.perf_counter() - cycle_start)
            if controller is not None:
                typical = linear_kernels.weights_packed() == cycle_packed  # no weight packed in the cycle
                controller.record(arm_index, stats.cycle_seconds[-1], committed, rows=len(active), copied=copied,
                                  typical=typical)  # fmt: skip
        everyone_stopped = all(row.stop_length is not None for row in rows)
        horizon = max(row.stop_length for row in rows) if everyone_stopped else None

        def done(row: _Row) -> bool:
            if row.stop_length is not None and has_eos:  # transformers pads a finished row from here on
                return True
            if call.max_length is not None and row.sequence.shape[1] >= call.max_length:
                return True
            return horizon is not None and row.generated(prompt_length) >= horizon

        keep = [i for i, row in enumerate(active) if not done(row)]
        if not keep:
            break
        active = [active[i] for i in keep]
        layout.keep_rows(keep)

        # Propose: the controller's arm for this cycle, one draft tree per row.
        cycle_start, cycle_packed = time.perf_counter(), linear_kernels.weights_packed()
        if controller is not None:
            arm_index = controller.choose()
            stats.arm_per_cycle.append(arm_index)
        arm = arms[arm_index]
        trees = [row.drafting.propose(arm_index, arm, row.pending_features, row.pending_tokens) for row in active]
        copied = any(row.drafting.copied for row in active)  # one copying row's tokens swamp the others'

        # Verify: one target forward and one LM-head matmul for all rows, then each row's walk.
        verify_start, verify_packed = time.perf_counter(), linear_kernels.weights_packed()
        row_logits = layout.verify(target, trees)
        stats.verify_forwards += 1
        walks = call.walk(active, trees, row_logits)  # reads the logits: the forward is done, on any device
        # What this tree size costs as decoding runs it, for the drafters that size trees by it; not a forward that
        # packed a weight (a kernel trial's first-time work, which decoding does not pay per step).
        if one_row and linear_kernels.weights_packed() == verify_packed:
            costs = costs or verify_cost.live_verify_costs(model)
            if costs is not None:
                costs.observe(len(trees[0]), 1000.0 * (time.perf_counter() - verify_start))

        # Commit: the accepted path (root first) is the next cycle's pending pairs; the cache keeps it.
        accepted = []
        for r, (row, tree, walk) in enumerate(zip(active, trees, walks)):
            row.stats.record(tree, walk)
            nodes = walk.node_tensor(device)
            accepted.append(nodes)
            row.pending_features = target.drafter_features[r, nodes]
            row.pending_tokens = row.emitted = walk.token_tensor(device)
            row.emitted_host, row.scores, row.logits = walk.tokens, walk.scores, walk.logits
        layout.commit(accepted, walks)
        committed = sum(len(walk.tokens) for walk in walks)

    # Output: each row's tokens up to the batch's horizon (finished rows padded when an EOS criterion exists).
    horizon = max(row.stop_length if row.stop_length is not None else row.generated(prompt_length) for row in rows)
    for row in rows:
        row.stats.new_tokens = row.stop_length if has_eos and row.stop_length is not None else horizon
        row.drafting.record(row.stats)
        if row.stats is not stats:
            stats.add_row(row.stats)
    sequences = layout.sequences(rows, prompt_length, horizon, pad_token)
    if streamer is not None:
        streamer.end()
    stats.target_forward_seconds = target.watch.seconds
    stats.total_seconds = timing.clock(device) - loop_start
    if controller is not None:
        stats.controller = controller.summary()
    if costs is not None:
        stats.verify_ms = {n: round(ms, 3) for n, ms in costs.curve().items()}
    if layout.engines is not None:
        stats.engines = layout.engines.summary()
    if gc.return_dict_in_generate:
        return GenerateDecoderOnlyOutput(
            sequences=sequences,
            scores=tuple(call.all_scores) if call.keep_scores else None,
            logits=tuple(call.all_logits) if call.keep_logits else None,
            past_key_values=layout.final_cache(sequences.shape[1]) if gc.use_cache else None,
        ), stats
    return sequences, stats
