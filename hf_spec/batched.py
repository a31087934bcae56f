"""Tree speculative decoding for a batch of left-padded prompts (batch size > 1).

Drafting stays per row: every row has its own drafting session (its own drafter cache),
started from that row's unpadded prompt and looped over in Python. Verification, the
expensive part, is ONE target forward for all rows: each row's draft tree is padded to the
widest tree (pad nodes attend only to themselves and are never visited), under one
(b, 1, q, past + q) additive mask that combines each row's tree mask, its cache-slot
validity (left padding and holes) and, for sliding-window targets, the window; position
ids are per row. Each row then walks its own tree exactly as the batch-1 path does
(:func:`hf_spec.verify.verify_tree`), so greedy output and sampling laws are those of the
single-row sampler.

Cache layout: one ``DynamicCache`` of uniform length L for all rows, plus ``valid`` (b, L):
which slots hold one of the row's tokens, and ``slot_pos`` (b, L): their positions. After a
verification forward, row r's accepted tree entries (root first) are gathered into the
first slots after the old length; the batch keeps max_r(accepted_r + 1) new slots and the
rows that accepted fewer get invalid slots ("holes"), masked in later forwards. Rows that
have finished are dropped from the cache (and from every later forward). When the holes
grow past ``max(HOLE_SLACK, longest_row // 4)`` slots, the cache is re-packed with each
row's valid slots right-aligned (left padding again). Bound: L <= longest_row +
max(HOLE_SLACK, longest_row // 4) + tree depth + 1, where longest_row is the most tokens
(prompt + generated) any unfinished row holds; re-packing copies the cache once per at
least HOLE_SLACK / (tree depth + 1) cycles.

What the output equals: transformers' batched ``generate()`` on the same left-padded
input: each row's tokens after the prompt, and once a row's stopping criteria fire, the
pad token (when an EOS criterion exists, as ``_sample`` pads finished rows), the whole
batch ending when every row has finished. Logits processors and stopping criteria see a
row's own padded sequence (padded prompt + its tokens), which is what the row sees in
batched ``generate()``; for processors that ignore the padding (none, temperature, top-k/p,
EOS and length criteria), that is also each row's plain single-prompt ``generate()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.generation.utils import GenerateDecoderOnlyOutput

from . import compat, timing
from .cache import gather_positions, select_rows
from .generation import GenerationStats, _Target, new_session, stop_flags
from .verify import greedy_plan, greedy_result, verify_tree

HOLE_SLACK = 32
"""Invalid cache slots tolerated beyond ``longest_row // 4`` before the cache is re-packed."""


@dataclass
class BatchGenerationStats(GenerationStats):
    """:class:`GenerationStats` of a batched call: the fields aggregate over rows.

    ``accepted_lengths`` lists every row's cycles (so ``tau`` is tokens per row per
    verification); ``rows`` holds each row's own stats; ``verify_forwards`` counts the
    batched target forwards (one per cycle, whatever the number of rows).
    """

    rows: list[GenerationStats] = field(default_factory=list)
    verify_forwards: int = 0


def left_padding(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor:
    """(b,) pad tokens in front of each row; ValueError unless the mask is left padding."""
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


@dataclass
class _Row:
    """Decoding state of one batch row."""

    index: int  # row in the input batch
    session: object  # the row's drafting session
    sequence: torch.Tensor  # (1, P + n): padded prompt + generated tokens
    pending_features: torch.Tensor
    pending_tokens: torch.Tensor
    emitted: torch.Tensor  # (k,) tokens of the last cycle, not yet appended to ``sequence``
    stats: GenerationStats
    stop_length: int | None = None  # generated tokens when the stopping criteria fired

    def generated(self, prompt_length: int) -> int:
        return self.sequence.shape[1] - prompt_length


class _BatchTarget(_Target):
    def forward_batch(self, input_ids, cache, attention_mask, position_ids) -> torch.Tensor:
        """Base model over (b, q) new tokens on top of ``cache``; the (b, q, H) features."""
        return self._run(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         past_key_values=cache)  # fmt: skip


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


def batched_speculative_decode(model, input_ids, logits_processor, stopping_criteria, generation_config, *,
                               drafter, shape, do_sample: bool, temperature: float, attention_mask=None,
                               use_router: bool | None = None, ngram_branches: int | None = None):  # fmt: skip
    """Tree speculative decoding of a left-padded batch; returns what batched ``generate()`` would.

    Called by :func:`hf_spec.generation.speculative_decode` for batch size > 1 (or a padded
    prompt) after its checks, with the drafter bound and the tree shape validated.
    """
    check_batch_supported(input_ids, generation_config, attention_mask)
    device = model.device
    input_ids = input_ids.to(device)
    batch, prompt_length = input_ids.shape
    pads = left_padding(attention_mask, input_ids).to(device)
    valid = torch.arange(prompt_length, device=device).view(1, -1) >= pads.view(-1, 1)  # (b, P)
    slot_pos = (valid.long().cumsum(dim=1) - 1).clamp(min=0)
    has_eos = any(hasattr(criteria, "eos_token_id") for criteria in stopping_criteria)
    pad_token = compat.pad_token_tensor(generation_config)
    if has_eos and pad_token is None:
        raise ValueError("Batched generation with an EOS token needs a pad token. Fix: pass pad_token_id.")
    max_length = getattr(stopping_criteria, "max_length", None)

    stats = BatchGenerationStats()
    drafter.last_generation_stats = stats
    loop_start = timing.clock(model.device)
    target = _BatchTarget(model, drafter.target_feature_layers())

    cache = compat.full_dynamic_cache()
    padded = bool((pads > 0).any())
    features = target.forward_batch(input_ids, cache, valid.long() if padded else None, slot_pos if padded else None)

    row_processors = [compat.row_logits_processor(logits_processor, r) for r in range(batch)]

    def process(row: int, context: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        """The row's logits processors on one position, with the row's own context (batch of one)."""
        return row_processors[row](context, raw.view(1, -1))[0] if len(logits_processor) else raw

    rows: list[_Row] = []
    last_logits = target.logits(features[:, -1])
    for r in range(batch):
        start = int(pads[r])
        row_prompt = input_ids[r : r + 1, start:]
        session = new_session(drafter, model, shape, do_sample, temperature, row_prompt, use_router, ngram_branches)
        sequence = input_ids[r : r + 1]
        scores = process(r, sequence, last_logits[r])
        first = torch.multinomial(torch.softmax(scores, dim=-1), 1) if do_sample else scores.argmax().view(1)
        rows.append(_Row(index=r, session=session, sequence=sequence, pending_features=target.drafter_features[r, start:],
                         pending_tokens=torch.cat([row_prompt[0, 1:], first]), emitted=first,
                         stats=GenerationStats()))  # fmt: skip
    stats.rows = [row.stats for row in rows]
    active = list(rows)

    while True:
        # Append each row's emitted tokens in one cat; the stopping criteria of every prefix of
        # every row are read back in one host transfer (they must fire at the same token as in generate()).
        checks, starts = [], []
        for row in active:
            start = row.sequence.shape[1]
            tokens = row.emitted if max_length is None else row.emitted[: max(max_length - start, 0)]
            row.sequence = torch.cat([row.sequence, tokens.view(1, -1).to(row.sequence.dtype)], dim=1)
            starts.append(start)
            if row.stop_length is None and tokens.numel():
                checks.append(stop_flags(row.sequence, start, stopping_criteria))
        fired = torch.cat(checks).tolist() if checks else []
        for row, start in zip(active, starts):
            if row.stop_length is None:
                flags, fired = fired[: row.sequence.shape[1] - start], fired[row.sequence.shape[1] - start :]
                if True in flags:
                    end = start + flags.index(True) + 1
                    row.stop_length = end - prompt_length
                    if has_eos:
                        row.sequence = row.sequence[:, :end]
            row.emitted = row.emitted[:0]
        everyone_stopped = all(row.stop_length is not None for row in rows)
        horizon = max(row.stop_length for row in rows) if everyone_stopped else None

        def done(row: _Row) -> bool:
            if row.stop_length is not None and has_eos:  # transformers pads a finished row from here on
                return True
            if max_length is not None and row.sequence.shape[1] >= max_length:
                return True
            return horizon is not None and row.generated(prompt_length) >= horizon

        keep = [i for i, row in enumerate(active) if not done(row)]
        if not keep:
            break
        if len(keep) < len(active):
            index = torch.tensor(keep, device=device)
            select_rows(cache, index)
            valid, slot_pos = valid[index], slot_pos[index]
            active = [active[i] for i in keep]
        valid, slot_pos = _maybe_repack(cache, valid, slot_pos)

        trees = [row.session.propose(row.pending_features, row.pending_tokens) for row in active]
        past = valid.shape[1]
        start_pos = valid.sum(dim=1)
        tokens, positions, mask = _verify_mask(trees, valid, slot_pos, start_pos, target.base.dtype,
                                               target.sliding_window)  # fmt: skip
        features = target.forward_batch(tokens, cache, mask, positions)
        stats.verify_forwards += 1

        # One LM-head matmul over every real node of every row's tree (one read of the head's weights).
        sizes = [len(tree) for tree in trees]
        q = features.shape[1]
        flat = torch.cat([torch.arange(r * q, r * q + n, device=device) for r, n in enumerate(sizes)])
        row_logits = target.logits(features.reshape(-1, features.shape[-1])[flat]).split(sizes)
        if do_sample or len(logits_processor):
            walks = []
            for row, tree, logits in zip(active, trees, row_logits):

                def process_node(node: int, raw: torch.Tensor, tree=tree, context=row.sequence, index=row.index):
                    return process(index, torch.cat([context, tree.path_tokens(node).view(1, -1)], dim=1), raw)

                walks.append(verify_tree(tree, logits, process_node if len(logits_processor) else None, do_sample))
        else:  # every row's greedy walk on device, read back in one transfer
            plans = [greedy_plan(tree, logits) for tree, logits in zip(trees, row_logits)]
            width = max(plan.numel() for plan in plans)
            packed = torch.stack([torch.nn.functional.pad(plan, (0, width - plan.numel())) for plan in plans])
            walks = [greedy_result(host, n, None, plan) for host, n, plan in zip(packed.tolist(), sizes, plans)]
        accepted = []
        for r, (row, tree, walk) in enumerate(zip(active, trees, walks)):
            row.stats.record(tree, walk)
            nodes = walk.node_tensor(device)
            accepted.append(nodes)
            row.pending_features = target.drafter_features[r, nodes]
            row.pending_tokens = row.emitted = walk.token_tensor(device)
        width = max(nodes.numel() for nodes in accepted)
        index = torch.stack([torch.cat([n, n[-1:].expand(width - n.numel())]) for n in accepted]) + past
        gather_positions(cache, past, index)
        new_valid = torch.arange(width, device=device).view(1, -1) < torch.tensor(
            [n.numel() for n in accepted], device=device).view(-1, 1)  # fmt: skip
        valid = torch.cat([valid, new_valid], dim=1)
        slot_pos = torch.cat([slot_pos, start_pos.view(-1, 1) + torch.arange(width, device=device).view(1, -1)], dim=1)

    horizon = max(row.stop_length if row.stop_length is not None else row.generated(prompt_length) for row in rows)
    fill = int(pad_token) if pad_token is not None else 0
    sequences = torch.full((batch, prompt_length + horizon), fill, dtype=input_ids.dtype, device=device)
    for row in rows:
        length = row.stop_length if has_eos and row.stop_length is not None else horizon
        sequences[row.index, : prompt_length + length] = row.sequence[0, : prompt_length + length]
        row.stats.new_tokens = length

    for row in rows:
        stats.accepted_lengths += row.stats.accepted_lengths
        stats.accepted_from_ngram += row.stats.accepted_from_ngram
    stats.new_tokens = sum(row.stats.new_tokens for row in rows)
    stats.target_forward_seconds = target.seconds
    stats.drafter_forward_seconds = sum(getattr(row.session, "forward_seconds", 0.0) for row in rows)
    stats.total_seconds = timing.clock(model.device) - loop_start
    if generation_config.return_dict_in_generate:
        # The cache has per-row holes and drops finished rows, so it is not returned.
        return GenerateDecoderOnlyOutput(sequences=sequences, past_key_values=None)
    return sequences


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
