"""Offline replay of draft policies on greedy outputs: what each cycle would commit and verify.

Under greedy decoding a draft changes only how many target forwards the same text takes: a cycle commits the
longest drafted path that agrees with the target's greedy continuation, plus one token. So, given the plain
greedy output of a prompt (gen_plain.py), replaying the committed text cycle by cycle gives every policy's
tokens per cycle (τ) and verified nodes per cycle exactly (fp32; in bf16 the tree's verification can round
near-ties differently, a small drift). Policies: transformers' prompt lookup (its algorithm: the earliest
occurrence of the last 2-gram, else 1-gram, 10 tokens) and hf-spec's NGramDrafter (its own index, datastore
and trie code) with any options. Speed comes from a measured verification cost curve t(n) (ms per target
forward of n tokens) plus a fixed loop cost per cycle: predicted ms per token = sum(cycle costs) / tokens.

    python benchmarks/ngram_policy/sim.py PLAIN.json [PLAIN2.json ...]
"""
from __future__ import annotations

import itertools
import json
import math
import sys
from collections import defaultdict

from hf_spec.drafters.ngram import NGramIndex, build_trie, continuations_with_datastore

# SmolLM2-135M bf16, 2 threads, this Zen 4 (hf_spec shape-cost profile, session 32): ms per forward of n tokens
VERIFY_MS = {1: 34.5, 2: 36.8, 4: 39.1, 8: 42.3, 16: 49.4, 32: 63.2, 64: 95.7}
LOOP_MS = {"plain": 4.0, "pl": 5.0, "ngram": 5.0}


def verify_ms(n: int) -> float:
    points = sorted(VERIFY_MS.items())
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if n <= x1:
            return y0 + (y1 - y0) * (max(n, x0) - x0) / (x1 - x0)
    return points[-1][1]


def accepted_in_trie(trie, target: list[int]) -> int:
    """Longest trie path (from the root) that equals a prefix of ``target``."""
    children = defaultdict(dict)
    for i, (tok, parent) in enumerate(zip(trie.tokens, trie.parents)):
        children[parent][tok] = i
    node, n = -1, 0
    for tok in target:
        node = children[node].get(tok)
        if node is None:
            break
        n += 1
    return n


def prompt_lookup_draft(ctx: list[int], num_tokens: int = 10, max_ngram: int = 2) -> list[int]:
    """transformers' PromptLookupCandidateGenerator: earliest occurrence of the longest suffix n-gram (n <= 2)."""
    length = len(ctx)
    for n in range(min(max_ngram, length - 1), 0, -1):
        suffix = ctx[-n:]
        for idx in range(0, length - n + 1):
            if ctx[idx : idx + n] == suffix:
                start = idx + n
                if start < length:
                    return ctx[start : min(start + num_tokens, length)]
    return []


def replay(prompt: list[int], output: list[int], draft) -> list[tuple[int, int]]:
    """[(tokens committed, tree nodes verified incl. the root)] per cycle; the prefill's first token is not a cycle."""
    ctx = list(prompt) + output[:1]
    i, cycles = 1, []
    state = draft("start", ctx)
    while i < len(output):
        proposal = draft("propose", ctx, state)
        target = output[i:]
        if isinstance(proposal, list):  # a chain
            a = next((k for k, (x, y) in enumerate(zip(proposal, target)) if x != y), min(len(proposal), len(target)))
            nodes = len(proposal) + 1
        else:
            a, nodes = accepted_in_trie(proposal, target), len(proposal) + 1
        a = min(a, len(target) - 1)
        commit = output[i : i + a + 1]
        cycles.append((len(commit), nodes))
        ctx += commit
        i += len(commit)
        draft("extend", commit, state)
    return cycles


def pl_policy(num_tokens=10, max_ngram=2):
    def draft(op, arg, state=None):
        if op == "propose":
            return prompt_lookup_draft(arg, num_tokens, max_ngram)
        return None

    return draft


def ngram_policy(nodes=8, depth=8, branches=4, max_match=4, min_match=1, occurrences=16, datastore=None,
                 trie_builder=build_trie, copy_nodes=0, copy_depth=None):
    def draft(op, arg, state=None):
        if op == "start":
            index = NGramIndex(min_match, max_match)
            index.extend(arg)
            return index
        if op == "extend":
            state.extend(arg)
            return None
        longest = max(depth, copy_depth or copy_nodes) if copy_nodes else depth
        conts = continuations_with_datastore(state, datastore, longest, occurrences)
        first = next(conts, None)
        if first is None:
            return []
        n, d = nodes, depth
        if copy_nodes and first.match_length >= max_match and first.position >= 0:
            n, d = max(nodes, copy_nodes), longest
        return trie_builder(itertools.chain([first], conts), n, d, branches)

    return draft


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
