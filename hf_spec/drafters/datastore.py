"""A static n-gram datastore: draft continuations from a corpus, not only from the context.

SuffixDecoding (Arctic Inference), REST and SAM-decoding draft from text the model produced
before as well as from the current context. :class:`NGramDatastore` is that corpus side for
hf-spec's n-gram trees: an index over a fixed token corpus (typically the target's own
self-distilled answers, which a training run already has) that returns, for the context's
suffix, the tokens that followed the same n-gram in the corpus.

Layout: the corpus is one int32 token tensor, documents separated by ``-1``. For every match
length n in [min_match, max_match] the index keeps the 64-bit polynomial hashes of all corpus
n-grams sorted, with the position that follows each; a lookup is one binary search, so its cost
does not depend on the corpus size. A hash collision can only propose a wrong token, which
verification rejects: drafting stays lossless (the tokens are a deterministic function of
the committed text, i.e. point-mass drafts, see :mod:`hf_spec.drafters.ngram`).

Saved next to a drafter's weights as ``ngram_datastore.safetensors`` (one ``tokens`` tensor).
"""

from __future__ import annotations

import os

import numpy as np
import torch

DATASTORE_FILE = "ngram_datastore.safetensors"
_SEPARATOR = -1
_BASE = np.uint64(1_000_003)


def _hashes(windows: np.ndarray) -> np.ndarray:
    """Polynomial hash (mod 2**64) of each row of an int64 array of n-grams."""
    out = np.zeros(windows.shape[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for column in range(windows.shape[1]):
            out = out * _BASE + windows[:, column].astype(np.uint64)
    return out


class NGramDatastore:
    """Sorted n-gram hashes of a token corpus; :meth:`continuations` looks up a context suffix."""

    def __init__(self, tokens: torch.Tensor, min_match: int = 2, max_match: int = 4):
        if not 1 <= min_match <= max_match:
            raise ValueError(f"need 1 <= min_match <= max_match, got min_match={min_match}, max_match={max_match}.")
        self.tokens = np.asarray(tokens.to(torch.int64).cpu(), dtype=np.int64)
        self.min_match, self.max_match = min_match, max_match
        self._keys: dict[int, np.ndarray] = {}
        self._follow: dict[int, np.ndarray] = {}
        length = len(self.tokens)
        for n in range(min_match, max_match + 1):
            if length <= n:
                self._keys[n], self._follow[n] = np.zeros(0, np.uint64), np.zeros(0, np.int64)
                continue
            windows = np.lib.stride_tricks.sliding_window_view(self.tokens, n)[: length - n]  # n-gram before p = i + n
            follow = np.arange(n, length)
            valid = (windows != _SEPARATOR).all(axis=1) & (self.tokens[n:] != _SEPARATOR)
            keys, follow = _hashes(windows[valid]), follow[valid]
            order = np.argsort(keys, kind="stable")  # equal keys keep corpus order
            self._keys[n], self._follow[n] = keys[order], follow[order]

    @classmethod
    def from_documents(cls, documents, min_match: int = 2, max_match: int = 4) -> "NGramDatastore":
        """A datastore over token-id sequences (e.g. answers), n-grams never crossing documents."""
        flat: list[int] = []
        for document in documents:
            flat.extend(int(t) for t in document)
            flat.append(_SEPARATOR)
        return cls(torch.tensor(flat, dtype=torch.int32), min_match, max_match)

    @classmethod
    def merge(cls, stores) -> "NGramDatastore":
        """One datastore over several stores' corpora (e.g. the target's answers to more prompts added to a
        shipped datastore); n-grams never cross from one corpus into the next."""
        stores = list(stores)
        if not stores:
            raise ValueError("merge needs at least one datastore.")
        matches = {(s.min_match, s.max_match) for s in stores}
        if len(matches) > 1:
            raise ValueError(f"Datastores with different match lengths {sorted(matches)} cannot be merged. Fix: build "
                             "them with the same min_match / max_match.")  # fmt: skip
        parts = []
        for store in stores:
            parts.append(store.tokens)
            if not len(store.tokens) or store.tokens[-1] != _SEPARATOR:
                parts.append(np.array([_SEPARATOR], dtype=np.int64))
        min_match, max_match = matches.pop()
        return cls(torch.from_numpy(np.concatenate(parts)), min_match, max_match)

    def __len__(self) -> int:
        return len(self.tokens)

    def occurrences(self, suffix) -> int:
        """How often the n-gram ``suffix`` occurs followed by a token (for tests and stats)."""
        n = len(suffix)
        if n not in self._keys:
            return 0
        key = _hashes(np.asarray([suffix], dtype=np.int64))[0]
        keys = self._keys[n]
        return int(np.searchsorted(keys, key, side="right") - np.searchsorted(keys, key, side="left"))

    def continuations(self, context, max_depth: int, max_occurrences: int):
        """Yield ``(tokens, match_length)`` for corpus occurrences of the context's suffix, longest
        match first; per match length at most ``max_occurrences`` occurrences, spread evenly over
        all of them so that the counts in a trie follow the corpus frequencies."""
        for n in range(min(self.max_match, len(context)), self.min_match - 1, -1):
            key = _hashes(np.asarray([context[len(context) - n :]], dtype=np.int64))[0]
            keys = self._keys[n]
            lo, hi = np.searchsorted(keys, key, side="left"), np.searchsorted(keys, key, side="right")
            if hi <= lo:
                continue
            picks = np.linspace(lo, hi - 1, num=min(max_occurrences, hi - lo)).round().astype(np.int64)
            for position in self._follow[n][np.unique(picks)]:
                run = self.tokens[position : position + max_depth]
                stop = np.flatnonzero(run == _SEPARATOR)
                yield (run[: stop[0]] if len(stop) else run).tolist(), n

    def save(self, directory) -> str:
        """Write ``ngram_datastore.safetensors`` (the corpus tokens) into ``directory``; a file that already holds
        this datastore is left as it is (safetensors writes its metadata in no fixed order, so rewriting the same
        datastore would change the file's bytes: a re-published drafter folder would show a change it does not have)."""
        from safetensors.torch import save_file

        path = os.path.join(directory, DATASTORE_FILE)
        if os.path.isfile(path) and self._same_as(path):
            return path
        save_file({"tokens": torch.from_numpy(self.tokens.astype(np.int32))}, path,
                  metadata={"min_match": str(self.min_match), "max_match": str(self.max_match)})  # fmt: skip
        return path

    def _same_as(self, path) -> bool:
        """Whether the datastore file at ``path`` holds this corpus and these match lengths (an unreadable one does not)."""
        try:
            other = type(self).load(path)
        except Exception:  # a damaged or foreign file: write over it
            return False
        return (other.min_match, other.max_match) == (self.min_match, self.max_match) and np.array_equal(
            other.tokens, self.tokens)

    @classmethod
    def load(cls, path) -> "NGramDatastore":
        """Read a datastore written by :meth:`save` (a directory or the file itself)."""
        from safetensors import safe_open

        if os.path.isdir(path):
            path = os.path.join(path, DATASTORE_FILE)
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
            tokens = f.get_tensor("tokens")
        return cls(tokens, int(meta.get("min_match", 2)), int(meta.get("max_match", 4)))


def find_datastore(name_or_path, **hub_kwargs) -> NGramDatastore | None:
    """The datastore saved with a checkpoint (local directory or Hub repo), or None if it has none."""
    if os.path.isdir(str(name_or_path)):
        path = os.path.join(str(name_or_path), DATASTORE_FILE)
        return NGramDatastore.load(path) if os.path.isfile(path) else None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    keys = ("revision", "cache_dir", "token", "local_files_only", "force_download")
    try:
        path = hf_hub_download(str(name_or_path), DATASTORE_FILE, **{k: v for k, v in hub_kwargs.items() if k in keys})
    except (EntryNotFoundError, LocalEntryNotFoundError):
        return None
    return NGramDatastore.load(path)
