"""The policies compared in this folder's README: transformers' prompt lookup, NGramDrafter's default
and the variants around it (with the library as checked out), replayed (sim.py) on plain greedy outputs.

    python benchmarks/ngram_policy/sweep.py benchmarks/ngram_policy/plain40.json
"""
import json
import sys

from sim import evaluate, ngram_policy, pl_policy, table

from hf_spec.drafters.datastore import find_datastore

data = {}
for path in sys.argv[1:]:
    data.update(json.load(open(path)))
store = find_datastore("drafters/smollm2-135m-instruct-eagle")
policies = {"prompt lookup": ("pl", pl_policy()),
            "context only (max_match 4)": ("ngram", ngram_policy(max_match=4)),
            "context only, max_match 6, copy 24": ("ngram", ngram_policy(max_match=6, copy_nodes=24)),
            "+ datastore (the default)": ("ngram", ngram_policy(max_match=4, datastore=store))}
for nodes, depth in [(6, 6), (12, 8), (12, 12)]:
    policies[f"+ datastore, {nodes} nodes depth {depth}"] = ("ngram", ngram_policy(max_match=4, num_draft_tokens=nodes, max_depth=depth, datastore=store))
policies["+ datastore, 1 branch (a chain)"] = ("ngram", ngram_policy(max_match=4, max_branches=1, datastore=store))
policies["+ datastore, min_match 2"] = ("ngram", ngram_policy(max_match=4, min_match=2, datastore=store))
for copy in (16, 24):
    policies[f"+ datastore, copy {copy}"] = ("ngram", ngram_policy(max_match=4, copy_nodes=copy, datastore=store))
for max_match in (6, 8, 12):
    policies[f"+ datastore, max_match {max_match}"] = ("ngram", ngram_policy(max_match=max_match, datastore=store))
    for copy in (16, 24):
        policies[f"+ datastore, max_match {max_match}, copy {copy}"] = (
            "ngram", ngram_policy(max_match=max_match, copy_nodes=copy, datastore=store))
print(table(evaluate(data, policies), ref="prompt lookup"))
