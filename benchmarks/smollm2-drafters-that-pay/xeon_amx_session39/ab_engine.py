"""Session 39: hybrids with the per-bucket cost gate (ngram_cost_gate, exact counterfactual gain) against their two
parts (the trained drafter alone, ngram_branches=0; NGramDrafter with the same datastore) and against the folders'
copy/match-cycle rules, beside plain greedy and transformers' prompt lookup; interleaved per prompt (order rotated,
each arm timed REPEATS times, the fastest kept). T=0, 128 new tokens.

    python ab_engine.py DATASET SKIP LIMIT [DATASET SKIP LIMIT ...] > log

Arms: plain; pl (transformers' prompt lookup, 10 tokens); ngram (NGramDrafter, context only); ngram_ds (+ the
folders' datastore); hass / eagle (the folders as shipped before this session, loaded with ngram_cost_gate=False: their n-gram branches
and copy/match-cycle rules);
hass_alone / eagle_alone (the same drafters, ngram_branches=0: the trained part alone); hass_gate / eagle_gate
(the folders loaded with ngram_cost_gate=True); pspec / pspec_gate and coral / coral_gate (the
ParallelSpec and CORAL folders, the same two ways).
A gated drafter object carries its gate's measurements over from one call to the next (this session's change).
DTYPE (environment): default bfloat16; ARMS: the arms to run (default all, plain first). Prints per prompt tokens/s
and which arms' texts differ from plain's; at the end, per pair and data set, the geometric mean of per-prompt
ratios with a 90% bootstrap interval, and per arm and set tau, nodes per cycle and the share of cycles without the
drafter.
"""
import math, os, random, sys, time

import torch
from transformers import AutoModel

import hf_spec
from hf_spec.bench.harness import build_prompts
from hf_spec.drafters.datastore import find_datastore
from hf_spec.resources import load_model

EAGLE = "drafters/smollm2-135m-instruct-eagle"
PAIRS = [("pl", "plain"), ("ngram", "pl"), ("ngram_ds", "pl"), ("hass_gate", "ngram_ds"), ("hass_gate", "hass_alone"),
         ("hass_gate", "hass"), ("hass", "ngram_ds"), ("hass_alone", "ngram_ds"), ("eagle_gate", "ngram_ds"),
         ("eagle_gate", "eagle_alone"), ("eagle_gate", "eagle"), ("eagle", "ngram_ds"), ("eagle_alone", "ngram_ds"),
         ("hass_gate", "pl"), ("eagle_gate", "pl"), ("hass_gate", "plain"), ("pspec_gate", "ngram_ds"),
         ("pspec_gate", "pspec"), ("pspec", "ngram_ds"), ("coral_gate", "ngram_ds"), ("coral_gate", "coral"),
         ("coral", "ngram_ds")]
HASS = "drafters/smollm2-135m-instruct-hass"

torch.set_num_threads(2)
model, tok = load_model("smollm2-135m-instruct", dtype=getattr(torch, os.environ.get("DTYPE", "bfloat16")))
store = find_datastore(EAGLE)
eagle = AutoModel.from_pretrained(EAGLE, ngram_cost_gate=False).eval()  # the rules (folders before 39)
eagle_gate = AutoModel.from_pretrained(EAGLE, ngram_cost_gate=True).eval()
hass = AutoModel.from_pretrained(HASS, ngram_cost_gate=False).eval()  # the rules (folders before 39)
hass_gate = AutoModel.from_pretrained(HASS, ngram_cost_gate=True).eval()
PSPEC = "drafters/smollm2-135m-instruct-parallelspec"
pspec = AutoModel.from_pretrained(PSPEC, ngram_cost_gate=False).eval()  # the rules (folders before 39)
pspec_gate = AutoModel.from_pretrained(PSPEC, ngram_cost_gate=True).eval()
CORAL = "drafters/smollm2-135m-instruct-coral"
coral = AutoModel.from_pretrained(CORAL, ngram_cost_gate=False).eval()  # the rules (folders before 39)
coral_gate = AutoModel.from_pretrained(CORAL, ngram_cost_gate=True).eval()
ARMS = {  # name: generate kwargs
    "plain": {},
    "pl": {"prompt_lookup_num_tokens": 10},
    "ngram": {"assistant_model": hf_spec.NGramDrafter()},
    "ngram_ds": {"assistant_model": hf_spec.NGramDrafter(datastore=store)},
    "hass": {"assistant_model": hass},
    "hass_alone": {"assistant_model": hass, "ngram_branches": 0},
    "hass_gate": {"assistant_model": hass_gate},
    "eagle": {"assistant_model": eagle},
    "eagle_alone": {"assistant_model": eagle, "ngram_branches": 0},
    "eagle_gate": {"assistant_model": eagle_gate},
    "pspec": {"assistant_model": pspec},
    "pspec_gate": {"assistant_model": pspec_gate},
    "coral": {"assistant_model": coral},
    "coral_gate": {"assistant_model": coral_gate},
}
jobs = []
args = sys.argv[1:]
for ds, skip, limit in zip(args[::3], args[1::3], args[2::3]):
    for p in build_prompts(tok, [ds], limit=int(limit), skip=int(skip))[ds]:
        jobs.append((ds, torch.tensor([p["input_ids"]])))
repeats = int(os.environ.get("REPEATS", "2"))


def run(name, ids, new=128):
    kwargs = ARMS[name]
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False, **kwargs)
    seconds = time.perf_counter() - start
    drafter = kwargs.get("assistant_model")
    stats = drafter.last_generation_stats if drafter is not None else None
    return out.shape[1] - ids.shape[1], seconds, out[0, ids.shape[1]:].tolist(), stats


names = os.environ.get("ARMS", " ".join(ARMS)).split()
for name in names:  # warm-up (and the n-gram drafter's one-time cost measurement)
    run(name, jobs[0][1], 16)
speed, stats_total = [], {}
for i, (ds, ids) in enumerate(jobs):
    order = names[i % len(names):] + names[:i % len(names)]
    best, texts, first = {}, {}, {}
    for r in range(repeats):
        for name in (order if r % 2 == 0 else order[::-1]):
            n, s, text, st = run(name, ids)
            best[name] = max(best.get(name, 0.0), n / s)
            first.setdefault(name, n / s)
            texts.setdefault(name, text)
            if r == 0 and st is not None:
                t = stats_total.setdefault((name, ds), [0, 0, 0, 0])
                t[0] += st.new_tokens; t[1] += st.cycles; t[2] += sum(st.tree_sizes)
                t[3] += getattr(st, "drafter_skipped_cycles", 0)
    speed.append((ds, best))
    differ = [name for name in names if texts[name] != texts["plain"]]
    print(i, ds, " ".join(f"{k}={best[k]:.1f}" for k in names), "| text differs from plain's:", ",".join(differ) or "none",
          flush=True)
    # the first timing alone: a gate carried over between calls has not yet seen this prompt
    print(f"first {i} {ds}", " ".join(f"{k}={first[k]:.1f}" for k in names), "|", flush=True)


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


rng = random.Random(0)
sets = list(dict.fromkeys(ds for ds, _ in speed))
print("\n| arm / reference | " + " | ".join(sets) + " | geomean of sets | prompts |")
print("|---|" + "---:|" * (len(sets) + 2))
for a, b in [(a, b) for a, b in PAIRS if a in names and b in names]:
    cells, means = [], []
    for ds in sets:
        ratios = [best[a] / best[b] for d, best in speed if d == ds]
        draws = sorted(geomean([rng.choice(ratios) for _ in ratios]) for _ in range(2000))
        means.append(geomean(ratios))
        cells.append(f"{means[-1]:.3f} [{draws[100]:.2f}, {draws[1899]:.2f}]")
    print(f"| {a} / {b} | " + " | ".join(cells) + f" | **{geomean(means):.3f}** | {len(speed)} |")
for (name, ds), t in sorted(stats_total.items()):
    print(f"{ds:10s} {name:12s} tau {t[0] / t[1]:.2f}  nodes {t[2] / t[1]:.1f}  drafter skipped {t[3] / t[1]:.0%} of cycles")
