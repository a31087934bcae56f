"""Context n-gram branches for ANY trained drafter: one wrapper around its drafting session.

With ``ngram_nodes`` > 0 (a drafter config field of every trained family, or ``generate(...,
ngram_nodes=N)``), the loop wraps the family's session (EAGLE/HASS/CORAL, EAGLE-3, ParallelSpec, S2D) in
:class:`NGramHybridSession`: it indexes prompt + committed tokens (:class:`~hf_spec.drafters.ngram.NGramBranches`,
with the drafter's ``ngram_datastore``) and grafts continuation tries into every tree the family drafts
(:func:`~hf_spec.drafters.ngram.graft_trie`). With ``ngram_cost_gate`` it also decides, each cycle, whether to
run the drafter at all (:class:`~hf_spec.drafters.ngram.CycleGate`): on a cycle where the n-gram trie alone is
worth more per unit of cost, the trie is verified alone and the committed pairs wait, to reach the family's
session with the next drafted cycle (which reads several committed pairs at once, as after any verification).

Why this stays lossless: the grafted nodes and the gate's choice are functions of the committed text and of
earlier cycles only, never of this cycle's verification; grafted candidates are point-mass drafts, verified as
:mod:`hf_spec.verify` proves exact (see :mod:`hf_spec.drafters.ngram`). The family's session sees exactly the
committed pairs, in order, as without the branches.
"""

from __future__ import annotations

import time
import weakref

import torch

from .. import linear_kernels, timing, verify_cost
from ..tree.tree import DraftTree
from .ngram.branches import NGramBranches
from .ngram.gate import CycleGate
from .ngram.trie import DEFAULT_DRAFT_DEPTH, DEFAULT_DRAFT_NODES, TrieNodes, graft_trie
from .session import DraftingSession

_GATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
"""drafter -> (weak reference to the target, (dtype, device), the last session's :class:`CycleGate`): a new call
with the same target starts from what the last one measured (:meth:`CycleGate.carried_over`)."""


def cycle_gate_for(drafter, target, max_nodes: int) -> CycleGate:
    """The cost gate of a new session of ``drafter`` on ``target``: the last session's, carried over, when it had
    the same target (same object, dtype and device); else a new one. Either way on the target's verification costs
    as this process measures them now (:func:`hf_spec.verify_cost.verify_costs`)."""
    key = (target.dtype, target.device)
    last = _GATES.get(drafter)
    curve = verify_cost.verify_costs(target).curve()
    if last is not None and last[0]() is target and last[1] == key:
        gate = last[2].carried_over(curve)
    else:
        gate = CycleGate(curve, max_nodes)
    _GATES[drafter] = (weakref.ref(target), key, gate)  # the session updates the gate in place
    return gate


class NGramHybridSession(DraftingSession):
    """A family's drafting session with context n-gram branches grafted into its trees (and the cost gate).

    ``inner``: the family's session; ``branches``: n-gram nodes grafted per tree; ``shape``: the tree shape
    (its ``top_k`` bounds the trie's branching, its ``depth`` the trie's depth unless the config's
    ``ngram_depth`` reaches deeper); the config's ``ngram_max_match`` and ``ngram_copy_nodes`` set the index and
    the copy cycles; ``gate``: a :class:`CycleGate` (None: the drafter runs every cycle)."""

    def __init__(self, inner: DraftingSession, config, shape, do_sample: bool, prompt_ids: torch.Tensor,
                 branches: int, datastore=None, gate: CycleGate | None = None):  # fmt: skip
        if prompt_ids is None:
            raise ValueError("ngram_nodes needs the prompt. Fix: pass prompt_ids to new_drafting_session().")
        self.inner = inner
        self.shape = shape
        self.do_sample = do_sample
        self.branches = branches
        self.depth = config.ngram_depth
        self.copy_nodes = config.ngram_copy_nodes
        self.ngram = NGramBranches(prompt_ids, max_match=config.ngram_max_match, datastore=datastore,
                                   copy_nodes=config.ngram_copy_nodes)  # fmt: skip
        self.gate = gate
        self.seconds = 0.0
        """Seconds of n-gram work (index, tries, grafting)."""
        self.skipped_cycles = 0
        """Cycles that verified the n-gram trie alone (no drafter forward)."""
        self._deferred: list[tuple[torch.Tensor, torch.Tensor]] = []
        """Committed (features, tokens) of skipped cycles, not yet given to :attr:`inner`."""
        self._drafted = 0
        self._own: int | None = None
        """Tokens of the next :meth:`propose`'s pairs that its last tree committed, when other arms ran since."""

    def read_other_arms(self, own: int) -> None:
        self._own = own

    @property
    def forward_seconds(self) -> float:
        return self.inner.forward_seconds + self.seconds

    def record(self, stats) -> None:
        self.inner.record(stats)
        stats.drafter_forward_seconds += self.seconds
        stats.drafter_skipped_cycles += self.skipped_cycles

    def gate_nodes(self) -> int:
        """Most nodes of the n-gram trie the gate weighs against drafting (``ngram_copy_nodes`` on a copy cycle;
        on others :data:`~hf_spec.drafters.ngram.DEFAULT_DRAFT_NODES`, as :class:`~hf_spec.NGramDrafter`)."""
        return max(self.copy_nodes, DEFAULT_DRAFT_NODES)

    def propose(self, features: torch.Tensor, next_tokens: torch.Tensor) -> DraftTree:
        # The n-gram work is host work (its tensor reads wait for the device anyway): timed without a device sync.
        # Only a weighed cycle's drafting is timed through the device (timing.clock), as the gate needs it.
        start = time.perf_counter()
        committed = self.ngram.extend(next_tokens)
        own, self._own = self._own, None
        depth = self.depth or self.gate_nodes()
        copy_budget = self.ngram.copy_budget(depth) if self.copy_nodes else 0  # no scan where copies cannot be
        self.copied = copy_budget > 0
        weighed = None
        if self.gate is not None:
            self.gate.record_committed(committed, own=own)
            weighed = self._trie_alone(next_tokens[-1], depth, copy_budget)
            if self.gate.prefers_ngram(weighed[0], len(weighed[1]) - 1):
                self.gate.record_ngram(weighed[0])
                self._deferred.append((features, next_tokens))  # read with the next drafted cycle
                self.skipped_cycles += 1
                self.seconds += time.perf_counter() - start
                return weighed[1]
        if self._deferred:
            features = torch.cat([*(f for f, _ in self._deferred), features])
            next_tokens = torch.cat([*(t for _, t in self._deferred), next_tokens])
            self._deferred = []
        self.seconds += time.perf_counter() - start
        drafting = timing.clock(next_tokens.device) if weighed is not None else 0.0
        packed = linear_kernels.weights_packed()
        tree = self.inner.propose(features, next_tokens)
        grafting = time.perf_counter()
        drafter_nodes = len(tree) - 1
        if weighed is None:
            tree = self.ngram.graft(tree, self.shape, self.branches, self.do_sample, depth=self.depth)
        else:  # the gate's trie (at most the arm's budget but on a copy cycle), no node it judged not worth verifying
            expected, alone, trie = weighed
            if not self.copied and len(trie) > self.branches:
                trie = trie.first(self.branches)
                alone, expected = self.ngram.trie_tree(int(next_tokens[-1]), trie, next_tokens.device)
            tree = graft_trie(tree, trie)
        self.seconds += time.perf_counter() - grafting
        if weighed is not None:  # not a cycle's cost: the first drafted cycle's (it reads the whole prompt), packing's
            typical = self._drafted > 0 and linear_kernels.weights_packed() == packed
            draft_ms = 1000.0 * (timing.clock(next_tokens.device) - drafting) if typical else None
            self.gate.record_drafted(drafter_nodes, draft_ms, expected, alone)
        self._drafted += 1
        return tree

    def _trie_alone(self, root_token: torch.Tensor, depth: int,
                    copy_budget: int) -> tuple[float, DraftTree, TrieNodes]:  # fmt: skip
        """The n-gram trie the gate weighs against drafting, ``depth`` deep at most, sized by this machine's costs
        (a copy cycle's, whose ``copy_budget`` exceeds the usual trie, by :meth:`CycleGate.copy_trie`): its expected
        committed tokens, the tree of it alone, and the trie."""
        if copy_budget > DEFAULT_DRAFT_NODES:
            trie = self.gate.copy_trie(self.ngram.sized_trie(self.gate_nodes(), depth, self.gate.node_costs))
        else:  # as NGramDrafter drafts (not the drafter tree's branching: the trie alone is verified)
            trie = self.ngram.sized_trie(DEFAULT_DRAFT_NODES, min(depth, DEFAULT_DRAFT_DEPTH), self.gate.node_costs)
        tree, expected = self.ngram.trie_tree(int(root_token), trie, root_token.device)
        return expected, tree, trie


def with_ngram_branches(session: DraftingSession, drafter, target, shape, do_sample: bool, prompt_ids,
                        branches: int) -> DraftingSession:  # fmt: skip
    """``session`` wrapped in :class:`NGramHybridSession` when ``branches`` > 0 (else unchanged), with the cost
    gate when the drafter's config asks for it (``ngram_cost_gate``) and a target is there."""
    if branches <= 0:
        return session
    config = drafter.config
    hybrid = NGramHybridSession(session, config, shape, do_sample, prompt_ids, branches,
                                datastore=drafter.ngram_datastore)  # fmt: skip
    if config.ngram_cost_gate and target is not None:
        hybrid.gate = cycle_gate_for(drafter, target, hybrid.gate_nodes())
    return hybrid
