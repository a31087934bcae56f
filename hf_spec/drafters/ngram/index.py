"""The incremental n-gram index of a growing token list and the continuations it finds."""

from __future__ import annotations

from dataclasses import dataclass


class NGramIndex:
    """Incremental hashed n-gram index of a growing token list.

    ``tables[n][ngram]`` lists, oldest first, the positions p with ``tokens[p-n:p] == ngram``
    (p is where the continuation starts). ``operations`` counts index updates (one per
    appended token and n), for tests that the cost per token is flat.
    """

    def __init__(self, min_match: int, max_match: int):
        if not 1 <= min_match <= max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got min_match={min_match}, max_match={max_match}.")
        self.min_match, self.max_match = min_match, max_match
        self.tokens: list[int] = []
        self.tables: dict[int, dict[tuple, list[int]]] = {n: {} for n in range(min_match, max_match + 1)}
        self.operations = 0

    def extend(self, new_tokens) -> None:
        """Append tokens; each one becomes the known follower of the n-grams just before it."""
        tokens = self.tokens
        for token in new_tokens:
            pos = len(tokens)
            for n, table in self.tables.items():
                if pos < n:
                    break
                key = tuple(tokens[pos - n : pos])
                positions = table.get(key)
                if positions is None:
                    table[key] = [pos]
                else:
                    positions.append(pos)
                self.operations += 1
            tokens.append(int(token))

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass
class Continuation:
    """The ``tokens`` that followed an earlier occurrence of the context's suffix.

    ``match_length``: how many suffix tokens matched there; ``position``: where the
    continuation starts in the context (larger = more recent).
    """

    tokens: list[int]
    match_length: int
    position: int


def find_continuations(index: NGramIndex, max_depth: int, max_occurrences: int):
    """Yield the continuations of the index's whole token list, longest match first, then most
    recent first (lazily: a consumer that has enough stops the scan).

    Scans each match length n from ``max_match`` down to ``min_match``, at most
    ``max_occurrences`` new occurrences per n (a position found with a longer match is not
    yielded again), each continuation at most ``max_depth`` tokens.
    """
    tokens = index.tokens
    length = len(tokens)
    seen: set[int] = set()
    for n in range(min(index.max_match, length), index.min_match - 1, -1):
        positions = index.tables[n].get(tuple(tokens[length - n :]))
        if not positions:
            continue
        taken = 0
        for pos in reversed(positions):
            if taken >= max_occurrences:
                break
            if pos in seen:
                continue
            seen.add(pos)
            taken += 1
            yield Continuation(tokens[pos : pos + max_depth], n, pos)


def continuations_with_datastore(index: NGramIndex, datastore, max_depth: int, max_occurrences: int):
    """:func:`find_continuations` of the context merged with a :class:`~hf_spec.drafters.datastore.NGramDatastore`'s
    corpus continuations of the same suffix (None: the context's alone). Per match length, longest first,
    the context's occurrences come before the corpus's; corpus occurrences rank as older than any context one
    (position -1). Drafted tokens stay a deterministic function of the committed text (point-mass drafts)."""
    context = find_continuations(index, max_depth, max_occurrences)
    if datastore is None:
        yield from context
        return
    context = list(context)
    stored = [Continuation(tokens, n, -1) for tokens, n in datastore.continuations(index.tokens, max_depth, max_occurrences)]
    for n in sorted({c.match_length for c in context} | {c.match_length for c in stored}, reverse=True):
        yield from (c for c in context if c.match_length == n)
        yield from (c for c in stored if c.match_length == n)

