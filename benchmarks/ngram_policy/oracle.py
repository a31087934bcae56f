"""Ceiling of context-only drafting (session 36): at each cycle draft the longest prefix (<= cap) of the target's own
next tokens that occurs in the context (a) anywhere, (b) right after an earlier occurrence of the last context token.
No real drafter can know which occurrence to follow; the gap between the oracle and `NGramDrafter` is what ranking
the occurrences could still win.

    python oracle.py plain40.json plain70.json
"""
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sim

def longest(ctx, target, cap, anchored):
    """Longest prefix (<= cap) of ``target`` found in ``ctx``: anywhere, or (anchored) right after an earlier
    occurrence of ``ctx[-1]``."""
    best = 0
    n = len(ctx)
    for s in range(n - 1 if anchored else n):
        if anchored and ctx[s] != ctx[-1]:
            continue
        start = s + 1 if anchored else s
        k = 0
        while k < cap and start + k < n and k < len(target) and ctx[start + k] == target[k]:
            k += 1
        best = max(best, k)
    return best

def oracle_policy(outputs, cap, anchored):
    """A replay policy (see ``sim.replay``) that drafts the chain :func:`longest` finds in the target's own output."""
    def start(prompt):
        out = outputs[tuple(prompt)]
        def draft(ctx, committed):
            i = len(ctx) - len(prompt)
            k = longest(ctx, out[i:], cap, anchored)
            return out[i:i + k]
        return draft
    return start

data = {}
for path in sys.argv[1:]:
    data.update(json.load(open(path)))
outputs = {tuple(r["prompt"]): r["output"] for r in data.values()}
policies = {"pl": ("pl", sim.pl_policy()), "ngram ctx": ("ngram", sim.ngram_policy()),
            "oracle any cap10": ("ngram", oracle_policy(outputs, 10, False)),
            "oracle anchored cap10": ("ngram", oracle_policy(outputs, 10, True)),
            "oracle anchored cap24": ("ngram", oracle_policy(outputs, 24, True))}
print(sim.table(sim.evaluate(data, policies)))
