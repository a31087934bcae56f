"""Context n-gram drafting without weights: draft TREES of continuations from the text so far.

transformers' prompt lookup drafts one continuation of the longest matching n-gram. Since
hf-spec verifies a whole tree in one target forward, :class:`NGramDrafter` drafts several:
every earlier occurrence of the context's suffix contributes the tokens that followed it,
and the distinct continuations are merged into a trie (shared prefixes become one branch).

Per generation, a session keeps an incremental hashed n-gram index
(:class:`NGramIndex`: for each n in [min_match, max_match], n-gram tuple -> positions of the
token that followed it) over prompt + generated tokens; each cycle adds the newly committed
tokens in O(new tokens x max_match) dict updates, never rebuilding. Drafting a tree scans at
most ``max_occurrences`` occurrences per match length, each for at most ``max_depth``
tokens, so a cycle's cost does not grow with the context.

Ranking (:func:`ranked_continuations`, :func:`scored_trie`): occurrences of
the longest matching suffix come first; an occurrence that matches the whole ``max_match`` suffix has its real
match length measured (up to 32 tokens back), so a passage being copied outranks a common 4-gram. Every trie
node gets an estimated probability that the target accepts it (:func:`match_acceptance`: the longer an
occurrence has matched, the likelier the target keeps following it; split between occurrences that disagree;
the context weighs more than a datastore's corpus), the product along its path; nodes are taken best first (at
most ``max_branches`` children per node, ``max_depth`` deep, ``num_draft_tokens`` nodes) and, with
``node_cost`` > 0, the tree keeps only as many as pay for their verification: deep chains where text is being
copied, the root alone where no occurrence is likely to be followed (the cycle is then one plain decoding
step). The model, its fit and what it gained over count-ranked, fixed-size trees:
benchmarks/ngram_policy/README.md. These functions take plain token lists, not a session, so the same
trie can be grafted into a trained drafter's tree (:class:`NGramBranches`, without the size cut: the hybrid's
budgets decide there).

Why sampling stays exact. The tree is a deterministic function of the committed text, so
every candidate c_i of an expanded node u is a point-mass draft: q_i = delta(c_i). Trees
carry ``draft_probs = None`` for that, and :func:`hf_spec.verify.verify_tree` then accepts c_i
with probability p_i(c_i) and on rejection continues with p_{i+1} = p_i with c_i removed and
renormalised; the last step samples the residual. Step i emits c_i with probability
p_i(c_i) and, otherwise, a draw from p_{i+1}; so by induction over the candidates, each token
x is emitted with probability p_u(x) (x = c_i: prod_{j<i}(1 - p_j(c_j)) p_i(c_i) = p_u(c_i),
as p_i = p_u / (1 - sum_{j<i} p_u(c_j))). Whether u is in the tree and expanded depends on
the committed text only, never on the verifier's draws, so conditioning on reaching u keeps
this law: every emitted token follows the target's distribution exactly.

The package, by concern (its modules import each other by module, never this package, so remote code copies
them as they are):

- :mod:`.index`: :class:`NGramIndex` and the continuations it finds (:func:`find_continuations`, with a
  datastore :func:`continuations_with_datastore`);
- :mod:`.trie`: the acceptance model, :func:`ranked_continuations`, :func:`scored_trie` and its size cut
  (:func:`relative_node_costs`, :func:`best_size`), :func:`trie_to_draft_tree`, :func:`graft_trie`;
- :mod:`.branches`: :class:`NGramBranches`, the tries grafted into a trained drafter's trees (the hybrid,
  :mod:`hf_spec.drafters.hybrid`); :mod:`.gate`: its :class:`CycleGate`;
- :mod:`.config`, :mod:`.model`, :mod:`.session`: :class:`NGramDrafterConfig`, :class:`NGramDrafter` and
  :class:`NGramDraftingSession`, the weightless drafter.
"""

from .branches import NGramBranches
from .config import NGramDrafterConfig, NGramTreeShape
from .gate import CycleGate
from .index import Continuation, NGramIndex, continuations_with_datastore, find_continuations
from .model import NGramDrafter
from .session import NGramDraftingSession
from .trie import (
    COST_MARGIN,
    DEFAULT_DRAFT_BRANCHES,
    DEFAULT_DRAFT_DEPTH,
    DEFAULT_DRAFT_NODES,
    FALLBACK_NODE_COST,
    TrieNodes,
    best_size,
    copy_budget,
    graft_trie,
    match_acceptance,
    measure_match_lengths,
    ranked_continuations,
    relative_node_costs,
    scored_trie,
    trie_to_draft_tree,
)

__all__ = [
    "COST_MARGIN",
    "Continuation",
    "CycleGate",
    "DEFAULT_DRAFT_BRANCHES",
    "DEFAULT_DRAFT_DEPTH",
    "DEFAULT_DRAFT_NODES",
    "FALLBACK_NODE_COST",
    "NGramBranches",
    "NGramDrafter",
    "NGramDrafterConfig",
    "NGramDraftingSession",
    "NGramIndex",
    "NGramTreeShape",
    "TrieNodes",
    "best_size",
    "continuations_with_datastore",
    "copy_budget",
    "find_continuations",
    "graft_trie",
    "match_acceptance",
    "measure_match_lengths",
    "ranked_continuations",
    "relative_node_costs",
    "scored_trie",
    "trie_to_draft_tree",
]
