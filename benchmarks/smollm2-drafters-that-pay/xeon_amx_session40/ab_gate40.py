"""Session 40: gated hybrids whose copy cycles go deep only while deep copies were accepted (CycleGate.copy_trie),
against their two parts (the trained drafter alone, ngram_branches=0; NGramDrafter with the same datastore), beside
plain greedy and transformers' prompt lookup; interleaved per prompt (order rotated, each arm timed REPEATS times,
the fastest kept; the first timing printed too). T=0, 128 new tokens.

    ARMS="plain pl ngram_ds hass_gate ..." DTYPE=float32 python ab_gate40.py DATASET SKIP LIMIT [...] > log

Arms: plain; pl (transformers' prompt lookup, 10 tokens); ngram_ds (NGramDrafter + the folders' datastore);
ngram_ds_raw / ngram_ds_cal (the same with calibrate=False / True; the default was True at 8e2633c only);
hass_alone (HASS with ngram_branches=0: the trained part alone); hass_gate / eagle_gate / pspec_gate / coral_gate
(the four SmolLM2 folders as shipped: ngram_cost_gate on). Only the arms named in ARMS are loaded.
"""
import math, os, random, sys, time

import torch
from transformers import AutoModel

import hf_spec
from hf_spec.bench.harness import build_prompts
from hf_spec.drafters.datastore import find_datastore
from hf_spec.resources import load_model

EAGLE = "drafters/smollm2-135m-instruct-eagle"
PAIRS = [("pl", "plain"), ("ngram_ds", "plain"), ("ngram_ds", "pl"), ("hass_gate", "ngram_ds"),
         ("hass_gate", "hass_alone"), ("hass_alone", "ngram_ds"), ("eagle_gate", "ngram_ds"), ("pspec_gate", "ngram_ds"),
         ("coral_gate", "ngram_ds"), ("hass_gate", "pl"), ("hass_gate", "plain"), ("ngram_ds", "ngram_ds_raw"),
         ("ngram_ds_raw", "pl"), ("hass_gate", "ngram_ds_raw")]
HASS = "drafters/smollm2-135m-instruct-hass"

torch.set_num_threads(2)
model, tok = load_model("smollm2-135m-instruct", dtype=getattr(torch, os.environ.get("DTYPE", "bfloat16")))
store = find_datastore(EAGLE)
FOLDERS = {"hass": HASS, "eagle": EAGLE, "pspec": "drafters/smollm2-135m-instruct-parallelspec",
           "coral": "drafters/smollm2-135m-instruct-coral"}
names = os.environ.get("ARMS", "plain pl ngram_ds hass_gate eagle_gate").split()


def folder(key):  # one object per arm: a gated drafter carries its gate over from one call to the next
    return AutoModel.from_pretrained(FOLDERS[key]).eval()


ARMS = {"plain": {}, "pl": {"prompt_lookup_num_tokens": 10}}
for name in names:
    if name == "ngram_ds":  # the default (8e2633c: calibrated; from the next commit on: not)
        ARMS[name] = {"assistant_model": hf_spec.NGramDrafter(datastore=store)}
    elif name == "ngram_ds_raw":  # without the measured-acceptance calibration
        ARMS[name] = {"assistant_model": hf_spec.NGramDrafter(datastore=store, calibrate=False)}
    elif name == "ngram_ds_cal":  # with it
        ARMS[name] = {"assistant_model": hf_spec.NGramDrafter(datastore=store, calibrate=True)}
    elif name.endswith("_alone"):
        ARMS[name] = {"assistant_model": folder(name[:-6]), "ngram_branches": 0}
    elif name.endswith("_gate"):
        ARMS[name] = {"assistant_model": folder(name[:-5])}
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
