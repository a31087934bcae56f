"""A/B on one machine moment: the EAGLE-family tree grown over the draft vocabulary's D columns (new) vs over
full-vocabulary (R, V) rows (old: set vocab_ids None), same drafter and fixed shape, greedy, bf16, 2 threads.
Prompts 3..5 of each bench set (tuning prompts), interleaved A/B, best of 2 per prompt."""
import sys, time, torch, hf_spec
from hf_spec.bench.datasets import bench_prompt_ids
from hf_spec.drafters import eagle
torch.set_num_threads(2)
target, tok = hf_spec.load_packaged_model("smollm2-135m-instruct", dtype=torch.bfloat16)
d = hf_spec.AutoDrafter.from_pretrained(sys.argv[1])
shape = dict(tree_depth=int(sys.argv[2]), tree_top_k=int(sys.argv[3]), tree_total_tokens=int(sys.argv[4]))
init = eagle.EagleDraftingSession.__init__
def old_init(self, *a, **k):
    init(self, *a, **k); self.vocab_ids = None
prompts = bench_prompt_ids(tok, 3, skip=3)
tot = {"new": [0.0, 0.0, 0], "old": [0.0, 0.0, 0]}
for ids in [prompts[0]] + prompts:
    for mode in ("new", "old", "new", "old"):
        eagle.EagleDraftingSession.__init__ = init if mode == "new" else old_init
        t = time.perf_counter()
        out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=d, max_new_tokens=128, do_sample=False, ngram_branches=0, **shape)
        wall = time.perf_counter() - t
        st = d.last_generation_stats
        tot[mode][0] += wall; tot[mode][1] += st.drafter_forward_seconds; tot[mode][2] += st.new_tokens
for mode, (wall, draft, n) in tot.items():
    print(f"{mode}: {n / wall:.1f} tok/s, drafter {1000 * draft / n:.2f} ms per token, wall {wall:.1f}s")
