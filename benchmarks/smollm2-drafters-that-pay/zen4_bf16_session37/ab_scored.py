"""Session 37: NGramDrafter's scored trees (this commit) against its session-36 trees (`ngram_before.py`, the
library's n-gram module at 29dce00), beside plain greedy, transformers' prompt lookup and a drafter folder; interleaved
per prompt (order rotated, each arm timed REPEATS times per prompt, the fastest kept). bf16, 2 threads, T=0, 128 new
tokens. (session 35's ab_folders.py plus the `plain`, `before:` and `before_hybrid:` arms, and a second pooling over
the prompts whose texts all equal the first arm's: give `plain` first.)

    python ab_scored.py SKIP LIMIT ARM...

ARM: name=<drafter folder> | name=ngram:<datastore folder or none>[:key=value,...] (NGramDrafter kwargs) | pl |
plain | name=before:<datastore folder or none> (session 36's NGramDrafter: 8 nodes, depth 8, count-ranked trie) |
name=before_hybrid:<drafter folder> (the folder with session 36's n-gram branches, count-ranked, swapped in for its
calls only).
DATASETS (environment): default "mt_bench humaneval gsm8k code_edit"; DTYPE: default bfloat16 (float32: every arm
writes plain's text). Prints per prompt tokens/s, then per data
set each arm's geometric mean of tokens/s over the first arm's, τ and verified nodes per cycle, and the shape
each folder chose on this machine.
"""
import math, os, sys, time

import torch
from transformers import AutoModel

import hf_spec
from hf_spec.bench.harness import build_prompts
from hf_spec.drafters.datastore import find_datastore
from hf_spec.resources import load_model



sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ngram_before  # noqa: E402

before = ngram_before.load()
BEFORE_HYBRIDS = set()  # drafters whose calls run with session 36's NGramBranches


def before_drafter(folder):
    """An NGramDrafter whose drafting sessions are session 36's (ngram_before.py, loaded inside the package)."""
    drafter = hf_spec.NGramDrafter(datastore=None if folder == "none" else find_datastore(folder),
                                   num_draft_tokens=8, max_depth=8)  # session 36's defaults

    def new_drafting_session(target, shape, do_sample, temperature=1.0, prompt_ids=None):
        return before.NGramDraftingSession(drafter.config, shape, prompt_ids, datastore=drafter.ngram_datastore)

    drafter.new_drafting_session = new_drafting_session
    return drafter


skip, limit = int(sys.argv[1]), int(sys.argv[2])
repeats = int(os.environ.get("REPEATS", "2"))
datasets = os.environ.get("DATASETS", "mt_bench humaneval gsm8k code_edit").split()
torch.set_num_threads(2)
model, tok = load_model("smollm2-135m-instruct", dtype=getattr(torch, os.environ.get("DTYPE", "bfloat16")))
arms = []
for spec in sys.argv[3:]:
    name, _, what = spec.partition("=")
    if name in ("pl", "plain"):
        arms.append((name, name))
    elif what.startswith("before:"):
        arms.append((name, before_drafter(what[len("before:"):])))
    elif what.startswith("before_hybrid:"):
        arms.append((name, AutoModel.from_pretrained(what[len("before_hybrid:"):]).eval()))
        BEFORE_HYBRIDS.add(id(arms[-1][1]))
    elif what.startswith("ngram:"):
        folder, _, options = what[len("ngram:"):].partition(":")
        kw = {k: float(v) if k == "node_cost" else int(v) for k, v in (kv.split("=") for kv in options.split(",") if kv)}
        arms.append((name, hf_spec.NGramDrafter(datastore=None if folder == "none" else find_datastore(folder), **kw)))
    else:
        arms.append((name, AutoModel.from_pretrained(what).eval()))
prompts = build_prompts(tok, datasets, limit=limit, skip=skip)
jobs = [(ds, torch.tensor([p["input_ids"]])) for ds, items in prompts.items() for p in items]


NGRAM_BRANCHES = hf_spec.drafters.ngram.NGramBranches


def run(drafter, ids, new=128):
    kw = {"pl": {"prompt_lookup_num_tokens": 10}, "plain": {}}.get(drafter) if isinstance(drafter, str) else {"assistant_model": drafter}
    import hf_spec.drafters.eagle as eagle_module

    eagle_module.NGramBranches = before.NGramBranches if id(drafter) in BEFORE_HYBRIDS else NGRAM_BRANCHES
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False, **kw)
    return out.shape[1] - ids.shape[1], time.perf_counter() - start, out[0, ids.shape[1]:].tolist()


for _, d in arms:  # warm-up (and each folder's run-time shape choice)
    run(d, jobs[0][1], 16)
logs, totals, choice = {}, {}, {}
for i, (ds, ids) in enumerate(jobs):
    order = arms[i % len(arms):] + arms[:i % len(arms)]
    best, texts = {}, {}
    for r in range(repeats):
        for name, d in (order if r % 2 == 0 else order[::-1]):
            n, s, text = run(d, ids)
            best[name] = max(best.get(name, 0.0), n / s)
            texts.setdefault(name, text)
            if r == 0 and not isinstance(d, str):
                st = d.last_generation_stats
                for key in (ds, "all"):
                    t = totals.setdefault((name, key), [0, 0, 0])
                    t[0] += st.new_tokens; t[1] += st.cycles; t[2] += sum(st.tree_sizes)
                if st.shape_choice is not None:
                    choice[name] = {k: v for k, v in st.shape_choice.items() if k.startswith(("tree", "ngram", "tau"))}
    # bf16: an arm's text can leave plain's at a near-tie (its tree's forward rounds differently), and a text that
    # leaves a repetition loop decodes at another speed; "same text" pools only prompts where every arm wrote plain's.
    differ = [name for name, _ in arms if texts[name] != texts[arms[0][0]]]
    for name, _ in arms:
        for key in (ds, "all") + (() if differ else ("same text " + ds, "same text")):
            logs.setdefault((name, key), []).append(math.log(best[name] / best[arms[0][0]]))
    print(i, ds, " ".join(f"{k}={v:.1f}" for k, v in best.items()), "| text differs from the first arm's:",
          ",".join(differ) or "none", flush=True)
for (name, key), v in sorted(logs.items(), key=lambda kv: (kv[0][1], [a for a, _ in arms].index(kv[0][0]))):  # noqa: E501
    t = totals.get((name, key))
    extra = f"  tau {t[0] / t[1]:.2f}  nodes {t[2] / t[1]:.1f}" if t else ""
    print(f"{key:9s} {name:12s} geomean over {arms[0][0]} {math.exp(sum(v) / len(v)):.3f} ({len(v)} prompts){extra}", flush=True)
for name, c in choice.items():
    print("shape", name, c, flush=True)
