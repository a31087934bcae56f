"""How often the target follows a drafted n-gram node (session 37): the data behind `scored_trie`'s acceptance model.

Along each prompt's replay (sim.py: NGramDrafter's trajectory on the plain greedy output), every node of the full
context trie (continuations of every match length, 16 deep, match lengths measured up to 32 tokens) whose parent
lies on the target's path is one row: m = match length + depth - 1 (context tokens the occurrence has matched when
the draft reaches the node), share = the fraction of that length's occurrences through the parent that continue
with this token, and whether the target's next token is the node's. Prints the observed rate per (m, share) bucket
beside the model share * (1 - 0.7 m^-0.75) of `hf_spec.drafters.ngram.match_acceptance`, and the mean log-loss.

    python acceptance.py plain0.json plain40.json [more PLAIN.json]
"""
import collections, json, math, sys

import torch

import hf_spec
from hf_spec.drafters.ngram import NGramIndex, find_continuations, match_acceptance, measure_match_lengths
from sim import accepted_length


def rows_of(prompt, output, depth=16):
    """(m, share, on_path) for every node whose parent is on the target's path, cycle by cycle."""
    drafter = hf_spec.NGramDrafter()
    session = drafter.new_drafting_session(None, drafter.tree_shape(), do_sample=False, prompt_ids=torch.tensor([prompt]))
    index = NGramIndex(1, 4)
    index.extend(prompt[:1])
    committed, i, rows = list(prompt[1:]) + output[:1], 1, []
    while i < len(output):
        tree = session.propose(None, torch.tensor(committed))
        index.extend(committed)
        target = output[i:]
        found = measure_match_lengths(index, list(find_continuations(index, depth, 16)))
        best, count, ended, root = {}, collections.defaultdict(collections.Counter), collections.defaultdict(collections.Counter), collections.Counter()
        for c in found:
            root[c.match_length] += 1
            for d in range(1, len(c.tokens) + 1):
                best.setdefault(tuple(c.tokens[:d]), c.match_length)
                count[tuple(c.tokens[:d])][c.match_length] += 1
            if len(c.tokens) < depth:
                ended[tuple(c.tokens)][c.match_length] += 1
        for path, length in best.items():
            d = len(path)
            if d > len(target) - 1 or tuple(target[: d - 1]) != path[:-1]:
                continue  # parent not on the target's path (or past the output's end)
            through = count[path[:-1]][length] - ended[path[:-1]][length] if d > 1 else root[length]
            live = max((n for n, c in count[path[:-1]].items() if c > ended[path[:-1]][n]), default=0) if d > 1 else max(root)
            rows.append((length + d - 1, count[path][length] / through, length < live, path == tuple(target[:d])))
        a = min(accepted_length(tree, target), len(target) - 1)
        committed = output[i : i + a + 1]
        i += len(committed)
    return rows


def m_bucket(m):
    return m if m <= 4 else (6 if m <= 6 else (11 if m <= 11 else (19 if m <= 19 else 32)))


def share_bucket(s):
    return "1" if s >= 0.999 else ("(.5,1)" if s > 0.5 else ("(.25,.5]" if s > 0.25 else "<=.25"))


if __name__ == "__main__":
    data = {}
    for path in sys.argv[1:]:
        data.update(json.load(open(path)))
    rows = [r for rec in data.values() for r in rows_of(rec["prompt"], rec["output"])]
    table = collections.defaultdict(lambda: [0, 0, 0.0])
    loss = 0.0
    for m, share, shorter, on in rows:
        q = share * match_acceptance(m) * (0.25 if shorter else 1.0)
        loss -= math.log(min(max(q if on else 1 - q, 1e-4), 1.0))
        if not shorter:
            t = table[(m_bucket(m), share_bucket(share))]
            t[0] += 1; t[1] += on; t[2] += q
    print(f"{len(rows)} nodes on {len(data)} prompts; mean log-loss of the model {loss / len(rows):.4f}")
    print("| m (up to) | share | nodes | observed | model |\n|---:|---|---:|---:|---:|")
    for (m, s), (n, a, q) in sorted(table.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        if n >= 30:
            print(f"| {m} | {s} | {n} | {a / n:.2f} | {q / n:.2f} |")
