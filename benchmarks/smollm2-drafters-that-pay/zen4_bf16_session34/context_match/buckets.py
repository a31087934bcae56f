"""Per-cycle counterfactual of the hybrid drafter (shipped config, greedy, bf16, 2 threads, 128 new tokens): on each
drafted cycle, the tokens the hybrid tree committed vs the tokens the n-gram trie alone (NODES nodes, the tree's
branching, the n-gram depth) would have committed -- the committed tokens' longest path through that trie, plus
the bonus token (exact under greedy). Cycles are bucketed by their best continuation: (match length, in the
context) or None (no match). Copy and match cycles (already drafter-free) are left out. Usage: buckets.py DRAFTER SKIP
LIMIT NODES DATASET...; MATCH_NODES (environment) overrides the folder's ngram_match_nodes (0: session-32 defaults)."""
import itertools, os, sys, time, collections, torch
from hf_spec.resources import load_packaged_model
from hf_spec.bench.harness import build_prompts
from hf_spec.drafters.eagle import EagleDraftingSession
from hf_spec.drafters.parallel import ParallelDraftingSession
from hf_spec.drafters.ngram import TrieNodes, build_trie, continuations_with_datastore
from transformers import AutoModel

name, skip, limit, nodes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
pending, rows = {}, []  # rows: (bucket, hybrid tokens, n-gram-alone tokens, cycle seconds, drafting seconds)


def trie_accepts(trie, committed):
    children = {(p, t): i for i, (p, t) in enumerate(zip(trie.parents, trie.tokens))}
    node, accepted = -1, 0
    for token in committed:
        node = children.get((node, token))
        if node is None:
            break
        accepted += 1
    return accepted


def make_propose(original):
    def propose(self, features, next_tokens):
        start = time.perf_counter()
        last = pending.pop(id(self), None)
        committed = next_tokens.tolist()
        if last is not None:
            bucket, trie, began, drafting_before, overhead = last
            rows.append((bucket, len(committed), trie_accepts(trie, committed) + 1, start - began - overhead,
                         self.forward_seconds - drafting_before))
        skipped, drafting_before = self.skipped_cycles, self.forward_seconds
        tree = original(self, features, next_tokens)
        if self.skipped_cycles == skipped and self._ngram is not None:  # a drafted cycle: what would the trie alone do?
            t = time.perf_counter()
            ng, depth = self._ngram, max(self.shape.depth, self.drafter.config.ngram_depth or 0)
            conts = continuations_with_datastore(ng.index, ng.datastore, depth, ng.max_occurrences)
            first = next(conts, None)
            trie = build_trie(itertools.chain([first], conts), nodes, depth, self.shape.top_k) if first else TrieNodes()
            bucket = None if first is None else (min(first.match_length, ng.index.max_match), first.position >= 0)
            pending[id(self)] = (bucket, trie, start, drafting_before, time.perf_counter() - t)
        return tree

    return propose


for cls in (EagleDraftingSession, ParallelDraftingSession):
    cls.propose = make_propose(cls.propose)
model, tok = load_packaged_model("smollm2-135m-instruct", dtype=torch.bfloat16)
torch.set_num_threads(2)
dr = AutoModel.from_pretrained(f"drafters/smollm2-135m-instruct-{name}").eval()
if "MATCH_NODES" in os.environ:
    dr.config.ngram_match_nodes = int(os.environ["MATCH_NODES"])
for ds in sys.argv[5:]:
    rows.clear()
    ps = build_prompts(tok, [ds], limit=limit, skip=skip)[ds]
    for p in ps:
        model.generate(torch.tensor([p["input_ids"]]), max_new_tokens=128, do_sample=False, assistant_model=dr)
        pending.clear()
    cyc = sum(r[3] for r in rows) / len(rows)
    dra = sum(r[4] for r in rows) / len(rows)
    print(f"{name} {ds} prompts {skip}..{skip + limit - 1}: {len(rows)} drafted cycles, {1000 * cyc:.1f} ms per cycle "
          f"of which drafting {1000 * dra:.1f} ms ({dra / cyc:.1%})", flush=True)
    agg = collections.defaultdict(lambda: [0, 0, 0])
    for b, h, n, _, _ in rows:
        a = agg[b]; a[0] += 1; a[1] += h; a[2] += n
    for b, (c, h, n) in sorted(agg.items(), key=lambda kv: str(kv[0])):
        print(f"  {str(b):12s} cycles {c:4d}  hybrid {h / c:.2f}  n-gram alone {n / c:.2f}  drafter adds {(h - n) / n:+.1%}", flush=True)
