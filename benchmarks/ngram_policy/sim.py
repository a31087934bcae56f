"""Offline replay of draft policies on greedy outputs: what each cycle would commit and verify.

Under greedy decoding a draft changes only how many target forwards the same text takes: a cycle commits the
longest drafted path that agrees with the target's greedy continuation, plus one token. So, given the plain
greedy output of a prompt (gen_plain.py), replaying the committed text cycle by cycle gives every policy's
tokens per cycle (τ) and verified nodes per cycle exactly (fp32; in bf16 the tree's verification can round
near-ties differently, a small drift). Policies: transformers' prompt lookup (its own candidate generator: the
earliest occurrence of the last 2-gram, else 1-gram, 10 tokens) and hf-spec's NGramDrafter (its own drafting
session, fed each cycle's committed tokens as generate() feeds it) with any options. Speed comes from a measured verification cost curve t(n) (ms per target
forward of n tokens) plus a fixed loop cost per cycle: predicted ms per token = sum(cycle costs) / tokens.

    python benchmarks/ngram_policy/sim.py PLAIN.json [PLAIN2.json ...]
"""
from __future__ import annotations

import json
import math
import sys
from collections import defaultdict

import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

import hf_spec
from hf_spec.shape_select import interpolate_cost

# SmolLM2-135M bf16, 2 threads, this Zen 4 (hf_spec shape-cost profile, session 32): ms per forward of n tokens
VERIFY_MS = {1: 34.5, 2: 36.8, 4: 39.1, 8: 42.3, 16: 49.4, 32: 63.2, 64: 95.7}
LOOP_MS = {"plain": 4.0, "pl": 5.0, "ngram": 5.0}


def verify_ms(n: int) -> float:
    return interpolate_cost(VERIFY_MS, n)


def accepted_length(tree, target: list[int]) -> int:
    """Longest root-to-node path of a :class:`~hf_spec.tree.tree.DraftTree` (root excluded) that equals a prefix
    of ``target``."""
    children = defaultdict(dict)
    for i, (token, parent) in enumerate(zip(tree.tokens.tolist(), tree.parents.tolist())):
        if i:
            children[parent][token] = i
    node, n = 0, 0
    for token in target:
        node = children[node].get(token)
        if node is None:
            break
        n += 1
    return n


def replay(prompt: list[int], output: list[int], policy) -> list[tuple[int, int]]:
    """[(tokens committed, tree nodes verified incl. the root)] per cycle; the prefill's first token is not a cycle.
    ``policy(prompt)`` starts a prompt and returns ``draft(context, committed)``, which gives a chain (list of
    tokens) or a DraftTree under the last context token."""
    ctx, committed = list(prompt) + output[:1], list(prompt[1:]) + output[:1]
    draft = policy(prompt)
    i, cycles = 1, []
    while i < len(output):
        proposal = draft(ctx, committed)
        target = output[i:]
        if isinstance(proposal, list):  # a chain
            a = next((k for k, (x, y) in enumerate(zip(proposal, target)) if x != y), min(len(proposal), len(target)))
            nodes = len(proposal) + 1
        else:
            a, nodes = accepted_length(proposal, target), proposal.tokens.numel()
        a = min(a, len(target) - 1)
        committed = output[i : i + a + 1]
        cycles.append((len(committed), nodes))
        ctx += committed
        i += len(committed)
    return cycles


def pl_policy(num_tokens=10, max_ngram=2):
    """transformers' own prompt-lookup candidate generator (earliest occurrence of the last 2-gram, else 1-gram)."""
    generator = PromptLookupCandidateGenerator(num_output_tokens=num_tokens, max_matching_ngram_size=max_ngram,
                                               max_length=1 << 30)  # fmt: skip

    def draft(ctx, committed):
        ids = torch.tensor([ctx])
        candidates, _ = generator.get_candidates(ids)
        return candidates[0, ids.shape[1]:].tolist()

    return lambda prompt: draft


def ngram_policy(datastore=None, **config):
    """hf-spec's :class:`~hf_spec.NGramDrafter` as shipped (``config``: its keyword arguments): one drafting
    session per prompt, fed the committed tokens of each cycle as ``generate()`` feeds it."""
    drafter = hf_spec.NGramDrafter(datastore=datastore, **config)
    shape = drafter.tree_shape()

    def start(prompt):
        session = drafter.new_drafting_session(None, shape, do_sample=False, prompt_ids=torch.tensor([prompt]))
        return lambda ctx, committed: session.propose(None, torch.tensor(committed))

    return start


def cost(cycles, method: str) -> float:
    return sum(LOOP_MS[method] + verify_ms(nodes) for _, nodes in cycles)


def evaluate(data: dict, policies: dict, datasets=None) -> dict:
    """Per data set and policy: τ, verified nodes per cycle, predicted speedup over plain (pooled ms)."""
    out = defaultdict(dict)
    per_prompt = defaultdict(lambda: defaultdict(list))
    for pid, rec in data.items():
        ds = rec["dataset"]
        if datasets and ds not in datasets:
            continue
        n_tokens = len(rec["output"]) - 1
        plain_ms = n_tokens * (LOOP_MS["plain"] + verify_ms(1))
        for name, (method, policy) in policies.items():
            cycles = replay(rec["prompt"], rec["output"], policy)
            per_prompt[ds][name].append((n_tokens, len(cycles), sum(nd for _, nd in cycles), cost(cycles, method), plain_ms))
    for ds, by_policy in per_prompt.items():
        for name, rows in by_policy.items():
            tok = sum(r[0] for r in rows); cyc = sum(r[1] for r in rows)
            out[ds][name] = {"tau": tok / cyc, "nodes": sum(r[2] for r in rows) / cyc,
                             "speedup": sum(r[4] for r in rows) / sum(r[3] for r in rows),
                             "geo_speedup": math.exp(sum(math.log(r[4] / r[3]) for r in rows) / len(rows))}
    return out


def table(result: dict, ref: str = "pl") -> str:
    """Markdown: per data set τ, predicted speedup over plain and over ``ref``; geometric mean over the sets."""
    names = list(next(iter(result.values())).keys())
    lines = ["| policy | " + " | ".join(f"{ds} τ / ×plain / ×PL" for ds in result) + " | geomean ×PL |",
             "|---|" + "---:|" * (len(result) + 1)]
    for name in names:
        cells, logs = [], []
        for ds, r in result.items():
            x = r[name]; rel = x["speedup"] / r[ref]["speedup"]
            logs.append(math.log(rel))
            cells.append(f"{x['tau']:.2f} / {x['speedup']:.2f} / {rel:.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {math.exp(sum(logs) / len(logs)):.3f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    from hf_spec.drafters.datastore import find_datastore

    data = {}
    for path in sys.argv[1:]:
        data.update(json.load(open(path)))
    ds = find_datastore("drafters/smollm2-135m-instruct-eagle")
    policies = {"pl": ("pl", pl_policy()), "ngram": ("ngram", ngram_policy()),
                "ngram+ds": ("ngram", ngram_policy(datastore=ds))}
    print(table(evaluate(data, policies)))
