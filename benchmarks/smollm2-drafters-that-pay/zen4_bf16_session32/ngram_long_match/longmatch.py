"""A/B: hybrid n-gram budget raised to N nodes when the context's best match has >= L tokens (not a copy)."""
import itertools, sys, time, torch
import hf_spec
import hf_spec.drafters.ngram as NG
from hf_spec.resources import load_packaged_model
from hf_spec.bench.harness import build_prompts
L, N = int(sys.argv[1]), int(sys.argv[2]); skips = [int(s) for s in sys.argv[3].split(",")]; name = sys.argv[4]
model, tok = load_packaged_model("smollm2-135m-instruct", dtype=torch.bfloat16)
torch.set_num_threads(2)
dr = hf_spec.EagleDrafter.from_pretrained(f"drafters/smollm2-135m-instruct-{name}")
ON = [False]
def graft(self, tree, shape, branches, sample, depth=None, copy_branches=0, datastore_copy_branches=0):
    if branches <= 0: return tree
    depth = max(shape.depth, depth or 0)
    conts = NG.continuations_with_datastore(self.index, self.datastore, depth, self.max_occurrences)
    first = next(conts, None)
    if first is None: return tree
    branches = max(branches, self._copy_budget(first, copy_branches, datastore_copy_branches))
    if ON[0] and first.position >= 0 and first.match_length >= L: branches = max(branches, N)
    num_nodes = branches if sample else branches + len(tree) - 1
    trie = NG.build_trie(itertools.chain([first], conts), num_nodes, depth, shape.top_k)
    return NG.graft_trie(tree, trie, max_new=None if sample else branches)
NG.NGramBranches.graft = graft
ids = []
for s in skips:
    ps = build_prompts(tok, ["mt_bench", "humaneval", "gsm8k"], limit=3, skip=s)
    ids += [(ds, torch.tensor([p["input_ids"]])) for ds, v in ps.items() for p in v]
model.generate(ids[0][1], max_new_tokens=16, do_sample=False, assistant_model=dr)
res = {False: [0, 0.0, 0, 0], True: [0, 0.0, 0, 0]}
for ds, x in ids:
    for on in ([False, True] if len(res) else []):
        ON[0] = on
        t = time.perf_counter(); o = model.generate(x, max_new_tokens=128, do_sample=False, assistant_model=dr); dt = time.perf_counter() - t
        s = dr.last_generation_stats
        r = res[on]; r[0] += s.new_tokens; r[1] += dt; r[2] += s.cycles; r[3] += sum(s.tree_sizes)
for on, (tok_, sec, cyc, nodes) in res.items():
    print(f"{name} long-match L={L} N={N} on={on}: {tok_/sec:.1f} tok/s tau {tok_/cyc:.2f} nodes/cycle {nodes/cyc:.1f}")
