"""The cost gate of the n-gram hybrid (:class:`CycleGate`): whether a cycle runs the drafter or verifies the
n-gram trie alone."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

from ...shape_select import interpolate_cost
from ...tree.tree import DraftTree
from .trie import DEFAULT_DRAFT_NODES, TrieNodes, best_size, relative_node_costs


@dataclass
class _Tally:
    """A running sum and count (a mean with ``prior`` weighted as ``weight`` observations)."""

    total: float = 0.0
    count: float = 0.0

    def add(self, value: float) -> None:
        self.total += value
        self.count += 1

    def mean(self, prior: float = 0.0, weight: float = 0.0) -> float:
        return (self.total + prior * weight) / (self.count + weight) if self.count + weight else prior

    def capped(self, count: float) -> _Tally:
        """The same mean weighted as at most ``count`` observations."""
        scale = min(1.0, count / self.count) if self.count else 1.0
        return _Tally(self.total * scale, self.count * scale)


@dataclass
class _CopyTrial:
    """A copy cycle's trie as a counterfactual: its (parent, token) -> (child, rank) map, how many of its best
    nodes the smaller budget keeps, both versions' relative costs, and the text committed since."""

    children: dict[tuple[int, int], tuple[int, int]]
    small_nodes: int
    big_cost: float
    small_cost: float
    text: list[int] = field(default_factory=list)

    def outcome(self) -> tuple[int, int] | None:
        """Tokens the whole trie and its ``small_nodes`` best would have committed (1 + their longest path that
        the committed text follows), or None while the text may still follow a path further."""
        node, big, small, on_small = -1, 0, 0, True
        for token in self.text:
            child = self.children.get((node, token))
            if child is None:
                return 1 + big, 1 + small
            node, big = child[0], big + 1
            on_small = on_small and child[1] < self.small_nodes
            small += on_small
        return None


@dataclass
class _Rate:
    """Tokens committed for a cost, over some cycles."""

    tokens: float = 0.0
    cost: float = 0.0
    cycles: int = 0

    def add(self, tokens: float, cost: float) -> None:
        self.tokens, self.cost, self.cycles = self.tokens + tokens, self.cost + cost, self.cycles + 1


class CycleGate:
    """Per-cycle choice of a hybrid drafter (``ngram_cost_gate``): the n-gram trie alone, or the drafter's tree
    with that trie grafted in.

    The n-gram trie, cut as :class:`~hf_spec.NGramDrafter` cuts it, is expected to commit ``expected`` tokens (1 + its
    nodes' estimated acceptance probabilities) for the cost of verifying its n nodes. Running the drafter as well
    adds ``gain`` tokens, for the cost of its forwards and its m more nodes. Both are measured in this generation,
    separately for each *bucket* of ``expected`` (:attr:`BUCKET_EDGES`): where the trie expects little, the
    drafter adds most; on a copied passage it adds almost nothing (measured on SmolLM2: +0.6-1.1 tokens a cycle
    below 2 expected, +0.1-0.2 above 3). The gain of a drafted cycle is exact in greedy decoding: the committed
    tokens minus what the trie alone would have committed (1 + the longest prefix of the committed tokens that is a
    path of the trie, which was grafted whole into the verified tree); the same count estimates it when sampling.
    The trie's own outcomes (drafted cycles' counterfactuals, n-gram cycles' commits) correct ``expected`` per
    bucket too. Costs are relative to a one-token step on this machine (:func:`relative_node_costs` of the
    target's measured verification curve; drafting time as measured in this generation, host work included).

    The drafter runs when (expected + bias + gain) / (cost(n + m) + drafting) beats (expected + bias) / cost(n):
    where nothing matches it drafts; on a copied passage the trie alone goes to verification. A function of the
    committed text and of earlier cycles only, never of this cycle's verification: sampling stays exact.

    It also sizes *copy cycles* (:meth:`copy_trie`): a trie of up to the copy budget (``ngram_copy_nodes``) is
    verified only while, on this generation's earlier copy cycles, the whole trie would have committed more
    tokens per unit of cost than its best :data:`DEFAULT_DRAFT_NODES` nodes (each counted exactly in greedy
    decoding once the text has gone past it; not carried over: how far a text copies is its own); a copied passage
    of code goes on deep, a restated sentence that soon departs from its source stops where :class:`~hf_spec.NGramDrafter`
    does."""

    PRIOR_CYCLES = 4
    """Each bucket's gain starts from the mean over all buckets (at first ``prior_gain``) weighted as this many
    drafted cycles, and its bias from 0 weighted as this many cycles."""
    BUCKET_EDGES = (1.25, 1.75, 2.5, 4.0)
    """Upper edges of the ``expected``-token buckets (the last bucket is open-ended)."""
    MIN_COPY_TRIALS = 2
    """Copy cycles verify their whole trie until this many have been counted."""
    MEMORY_CYCLES = 200
    """A gate carried over to the drafter's next call (:meth:`carried_over`) weighs each bucket's past as at most
    this many cycles (and the drafting time as at most this many drafted cycles), so it keeps adapting."""

    def __init__(self, verify_ms: dict[int, float], max_nodes: int, prior_gain: float = 1.0):
        self.max_nodes = max_nodes
        self._use_costs(verify_ms)
        self.prior_gain = prior_gain
        buckets = len(self.BUCKET_EDGES) + 1
        self._gain = [_Tally() for _ in range(buckets)]
        """Per bucket: tokens the drafter added on drafted cycles."""
        self._bias = [_Tally() for _ in range(buckets)]
        """Per bucket: what the trie alone committed (or would have) minus what it was expected to."""
        self._drafter_nodes, self._draft_ms = _Tally(), _Tally()
        self._pending: tuple[float, dict[tuple[int, int], int] | None] | None = None
        """The last cycle's trie: its expected tokens and, after a drafted cycle, its (parent, token) -> child map."""
        self._copy_trials: list[_CopyTrial] = []
        """Copy cycles whose counterfactuals wait for the text to go past them."""
        self._copy_big, self._copy_small = _Rate(), _Rate()
        """What copy cycles' whole tries, and their best :data:`DEFAULT_DRAFT_NODES` nodes, would have committed."""

    def _use_costs(self, verify_ms: dict[int, float]) -> None:
        """Weigh nodes by the verification curve ``verify_ms`` (tree size -> ms)."""
        self.node_costs = relative_node_costs(verify_ms, self.max_nodes)
        self._cost_curve = dict(enumerate(self.node_costs))  # relative cost by node count, for interpolate_cost
        self.step_ms = interpolate_cost(verify_ms, 1)

    def _cost(self, nodes: float) -> float:
        """Relative cost of verifying ``nodes`` (a mean, so fractional) nodes; past ``max_nodes`` extended linearly."""
        return interpolate_cost(self._cost_curve, nodes)

    def carried_over(self, verify_ms: dict[int, float] | None = None) -> CycleGate:
        """This gate's statistics for the drafter's next call with the same target (nothing pending), each
        weighted as at most :attr:`MEMORY_CYCLES` cycles, on the verification curve ``verify_ms`` as it is now (None:
        this gate's). The choice stays a function of earlier cycles only: sampling stays exact."""
        gate = copy.copy(self)
        if verify_ms is not None:
            gate._use_costs(verify_ms)
        gate._pending = None
        gate._gain = [tally.capped(self.MEMORY_CYCLES) for tally in self._gain]
        gate._bias = [tally.capped(self.MEMORY_CYCLES) for tally in self._bias]
        gate._drafter_nodes = self._drafter_nodes.capped(self.MEMORY_CYCLES)
        gate._draft_ms = self._draft_ms.capped(self.MEMORY_CYCLES)
        gate._copy_trials, gate._copy_big, gate._copy_small = [], _Rate(), _Rate()  # how far a text copies is its own
        return gate

    def bucket(self, expected_tokens: float) -> int:
        """The bucket of a trie that expects ``expected_tokens``."""
        return sum(expected_tokens >= edge for edge in self.BUCKET_EDGES)

    def gain(self, expected_tokens: float) -> float:
        """Tokens the drafter is expected to add to a trie that expects ``expected_tokens``."""
        overall = _Tally(sum(t.total for t in self._gain), sum(t.count for t in self._gain))
        prior = overall.mean(self.prior_gain, self.PRIOR_CYCLES)
        return self._gain[self.bucket(expected_tokens)].mean(prior, self.PRIOR_CYCLES)

    def trie_tokens(self, expected_tokens: float) -> float:
        """Tokens the trie alone is expected to commit: ``expected_tokens`` corrected by its bucket's outcomes."""
        return max(1.0, expected_tokens + self._bias[self.bucket(expected_tokens)].mean(0.0, self.PRIOR_CYCLES))

    def prefers_ngram(self, expected_tokens: float, nodes: int) -> bool:
        """Whether the n-gram trie alone (``nodes`` nodes, ``expected_tokens``) beats drafting as well. Until a
        drafted cycle has been timed, the drafter runs."""
        if not self._draft_ms.count:
            return False
        alone = self.trie_tokens(expected_tokens)
        drafted_cost = self._cost(nodes + self._drafter_nodes.mean()) + self._draft_ms.mean() / self.step_ms
        return alone / self._cost(nodes) >= (alone + self.gain(expected_tokens)) / drafted_cost

    def record_ngram(self, expected_tokens: float) -> None:
        """A cycle that verified the trie alone (``expected_tokens``); its commit calibrates the bucket."""
        self._pending = (expected_tokens, None)

    def record_drafted(self, drafter_nodes: int, draft_ms: float | None, expected_tokens: float,
                       trie: DraftTree) -> None:  # fmt: skip
        """A drafted cycle: the drafter's own nodes (root and grafted n-gram nodes excluded), its drafting time
        (None: not a cycle's cost, e.g. the first cycle, whose drafter reads the whole prompt), and the trie it
        weighed (grafted whole), with what that trie was expected to commit."""
        self._drafter_nodes.add(drafter_nodes)
        if draft_ms is not None:
            self._draft_ms.add(draft_ms)
        tokens, parents = trie.tokens.tolist(), trie.parents.tolist()
        children = {(parents[i], tokens[i]): i for i in range(1, len(tokens))}
        self._pending = (expected_tokens, children)

    def copy_trie(self, trie: TrieNodes, nodes: int = DEFAULT_DRAFT_NODES) -> TrieNodes:
        """What a copy cycle verifies of ``trie`` (cut to this gate's costs, up to the copy budget): all of it,
        or, once earlier copy cycles say the nodes past the best ``nodes`` did not pay for themselves, those best
        ``nodes`` cut again to the costs. Either way the trie is kept as a counterfactual (:class:`_CopyTrial`)."""
        if len(trie) <= nodes:  # both budgets keep the same nodes
            return trie
        order = sorted(range(len(trie)), key=trie.ranks.__getitem__)
        small = best_size([trie.probabilities[i] for i in order[:nodes]], self.node_costs)
        children = {(trie.parents[i], trie.tokens[i]): (i, trie.ranks[i]) for i in range(len(trie))}
        self._copy_trials.append(_CopyTrial(children, small, self._cost(len(trie)), self._cost(small)))
        big, cut = self._copy_big, self._copy_small
        if big.cycles < self.MIN_COPY_TRIALS or big.tokens * cut.cost >= cut.tokens * big.cost:
            return trie
        return trie.first(small)

    def _record_copy_outcomes(self, tokens: Sequence[int]) -> None:
        waiting = []
        for trial in self._copy_trials:
            trial.text.extend(tokens)
            outcome = trial.outcome()
            if outcome is None:
                waiting.append(trial)
            else:
                self._copy_big.add(outcome[0], trial.big_cost)
                self._copy_small.add(outcome[1], trial.small_cost)
        self._copy_trials = waiting

    def record_committed(self, tokens: Sequence[int], own: int | None = None) -> None:
        """The tokens committed since the last cycle this gate weighed, after :meth:`record_ngram` or
        :meth:`record_drafted`: that cycle's own commit (accepted + the target's own) is the first ``own`` of
        them (None: all), the rest came from cycles of other arms (the speed controller's plain steps, other tree
        shapes), which say nothing of this gate's trie or drafter."""
        if self._copy_trials:
            self._record_copy_outcomes(tokens)
        if self._pending is None:
            return
        expected, children = self._pending
        self._pending = None
        tokens = tokens[:own]  # own None: all of them
        bucket = self.bucket(expected)
        if children is None:
            alone = len(tokens)
        else:
            node, matched = 0, 0
            for token in tokens:
                node = children.get((node, token))
                if node is None:
                    break
                matched += 1
            alone = matched + 1
            self._gain[bucket].add(len(tokens) - alone)
        self._bias[bucket].add(alone - expected)

