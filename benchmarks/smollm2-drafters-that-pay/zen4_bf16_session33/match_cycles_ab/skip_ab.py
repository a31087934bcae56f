"""A/B (ngram_match_nodes=B, ngram_match_min_length=L vs off): the hybrid skips its drafter forward on cycles whose best n-gram continuation (context or datastore) matches
>= L tokens of the suffix, drafting the n-gram trie alone (B nodes) as NGramDrafter would; interleaved per prompt."""
import sys, time, torch
import hf_spec
from hf_spec.resources import load_packaged_model
from hf_spec.bench.harness import build_prompts
L, B = int(sys.argv[1]), int(sys.argv[2]); skips = [int(s) for s in sys.argv[3].split(",")]; name = sys.argv[4]
model, tok = load_packaged_model("smollm2-135m-instruct", dtype=torch.bfloat16)
torch.set_num_threads(2)
from transformers import AutoModel
dr = AutoModel.from_pretrained(f"drafters/smollm2-135m-instruct-{name}").eval()
ON = [False]
dr.config.ngram_match_min_length = L  # hf_spec's ngram_match_nodes option (session 33), toggled per run
ids = []
for s in skips:
    ps = build_prompts(tok, ["mt_bench", "humaneval", "gsm8k"], limit=3, skip=s)
    ids += [(ds, torch.tensor([p["input_ids"]])) for ds, v in ps.items() for p in v]
model.generate(ids[0][1], max_new_tokens=16, do_sample=False, assistant_model=dr)
res = {(on, ds): [0, 0.0, 0, 0] for on in (False, True) for ds in ("mt_bench", "humaneval", "gsm8k", "all")}
for i, (ds, x) in enumerate(ids):
    for on in ([False, True] if i % 2 == 0 else [True, False]):
        ON[0] = on
        dr.config.ngram_match_nodes = B if on else 0
        t = time.perf_counter(); o = model.generate(x, max_new_tokens=128, do_sample=False, assistant_model=dr); dt = time.perf_counter() - t
        s = dr.last_generation_stats
        for key in ((on, ds), (on, "all")):
            r = res[key]; r[0] += s.new_tokens; r[1] += dt; r[2] += s.cycles; r[3] += sum(s.tree_sizes)
for (on, ds), (tok_, sec, cyc, nodes) in res.items():
    print(f"{name} skip L={L} B={B} on={on} {ds}: {tok_/sec:.1f} tok/s tau {tok_/cyc:.2f} nodes/cycle {nodes/cyc:.1f} tokens {tok_}", flush=True)
