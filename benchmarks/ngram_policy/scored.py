"""Session 37's replay table: NGramDrafter's scored, cost-sized trees (the library as checked out) against its
session-36 trees (`../smollm2-drafters-that-pay/zen4_bf16_session37/ngram_before.py`) and transformers' prompt lookup.

    python scored.py plain0.json plain40.json plain70.json
"""
import json, os, sys

import torch

import hf_spec
from hf_spec.drafters.datastore import find_datastore
from sim import evaluate, ngram_policy, pl_policy, table

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "../smollm2-drafters-that-pay/zen4_bf16_session37"))
import ngram_before  # noqa: E402

before = ngram_before.load()


def before_policy(datastore=None):
    """Session 36's NGramDrafter (8 nodes, depth 8, count-ranked trie) as sim.ngram_policy replays it."""
    drafter = hf_spec.NGramDrafter(num_draft_tokens=8, max_depth=8)
    shape = drafter.tree_shape()

    def start(prompt):
        session = before.NGramDraftingSession(drafter.config, shape, torch.tensor([prompt]), datastore=datastore)
        return lambda ctx, committed: session.propose(None, torch.tensor(committed))

    return start


data = {}
for path in sys.argv[1:]:
    data.update(json.load(open(path)))
store = find_datastore(os.path.join(here, "../../drafters/smollm2-135m-instruct-eagle"))
policies = {"prompt lookup": ("pl", pl_policy()),
            "session 36 (context)": ("ngram", before_policy()),
            "scored, fixed 8 nodes depth 8 (node_cost 0)": ("ngram", ngram_policy(node_cost=0, num_draft_tokens=8, max_depth=8)),
            "scored, node_cost 0.02": ("ngram", ngram_policy(node_cost=0.02)),
            "scored, node_cost 0.035 (default)": ("ngram", ngram_policy()),
            "scored, node_cost 0.05": ("ngram", ngram_policy(node_cost=0.05)),
            "session 36 + datastore": ("ngram", before_policy(store)),
            "scored + datastore (default)": ("ngram", ngram_policy(datastore=store))}
print(table(evaluate(data, policies), ref="prompt lookup"))
