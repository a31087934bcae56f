"""Session 38: masked-GQA verification (hf_spec.compat.masked_sdpa_gqa) and machine-measured n-gram tree sizes
(NGramDrafter node_cost=None) against session 37's library behaviour, beside plain greedy and transformers' prompt
lookup; interleaved per prompt (order rotated, each arm timed REPEATS times, the fastest kept). T=0, 128 new tokens.

    python ab_engine.py DATASET SKIP LIMIT [DATASET SKIP LIMIT ...] > log

Arms (the suffix says how attention ran: "_rep" = transformers' default, key/value heads repeated under a mask, as
every hf-spec verification ran before this session; "_gqa" = TRANSFORMERS_SDPA_FORCE_GQA=1 for that arm's calls):
plain; pl (transformers' prompt lookup, 10 tokens, default attention); pl_gqa (the same with the switch, what
transformers itself would gain); ngram37_rep (NGramDrafter node_cost=0.035, session 37's default, repeated heads:
session 37 as shipped); ngram37_gqa; ngram (this commit's default: measured costs, masked GQA); ngram_ds (+ the EAGLE
folder's datastore); eagle_rep / eagle (the EAGLE folder, its hybrid n-gram branches, default options); eagle_gate,
hass, hass_gate (the EAGLE and HASS folders, "_gate": loaded with ngram_cost_gate=True).
DTYPE (environment): default bfloat16; ARMS: the arms to run (default all, plain first). Prints per prompt tokens/s and which arms' texts differ from plain's; at the
end, per pair and data set, the geometric mean of per-prompt ratios with a 90% bootstrap interval.
"""
import math, os, random, sys, time

import torch
from transformers import AutoModel

import hf_spec
from hf_spec.bench.harness import build_prompts
from hf_spec.drafters.datastore import find_datastore
from hf_spec.resources import load_model

EAGLE = "drafters/smollm2-135m-instruct-eagle"
PAIRS = [("pl", "plain"), ("pl_gqa", "pl"), ("ngram37_gqa", "ngram37_rep"), ("ngram", "ngram37_gqa"),
         ("ngram", "ngram37_rep"), ("ngram37_rep", "pl"), ("ngram", "pl"), ("ngram", "pl_gqa"), ("ngram_ds", "pl"),
         ("eagle", "eagle_rep"), ("eagle", "pl"), ("eagle", "ngram_ds"), ("eagle_gate", "eagle"),
         ("eagle_gate", "ngram_ds"), ("hass", "ngram_ds"), ("hass_gate", "hass"), ("hass_gate", "ngram_ds"),
         ("eagle_gate", "pl"), ("hass_gate", "pl")]
HASS = "drafters/smollm2-135m-instruct-hass"

torch.set_num_threads(2)
model, tok = load_model("smollm2-135m-instruct", dtype=getattr(torch, os.environ.get("DTYPE", "bfloat16")))
store = find_datastore(EAGLE)
eagle = AutoModel.from_pretrained(EAGLE).eval()
eagle_gate = AutoModel.from_pretrained(EAGLE, ngram_cost_gate=True).eval()
hass = AutoModel.from_pretrained(HASS).eval()
hass_gate = AutoModel.from_pretrained(HASS, ngram_cost_gate=True).eval()
ARMS = {  # name: (generate kwargs, TRANSFORMERS_SDPA_FORCE_GQA for the call or None)
    "plain": ({}, None),
    "pl": ({"prompt_lookup_num_tokens": 10}, None),
    "pl_gqa": ({"prompt_lookup_num_tokens": 10}, "1"),
    "ngram37_rep": ({"assistant_model": hf_spec.NGramDrafter(node_cost=0.035)}, "0"),
    "ngram37_gqa": ({"assistant_model": hf_spec.NGramDrafter(node_cost=0.035)}, "1"),
    "ngram": ({"assistant_model": hf_spec.NGramDrafter()}, None),
    "ngram_ds": ({"assistant_model": hf_spec.NGramDrafter(datastore=store)}, None),
    "eagle_rep": ({"assistant_model": eagle}, "0"),
    "eagle": ({"assistant_model": eagle}, None),
    "eagle_gate": ({"assistant_model": eagle_gate}, None),  # ngram_cost_gate=True (session 38)
    "hass": ({"assistant_model": hass}, None),
    "hass_gate": ({"assistant_model": hass_gate}, None),
}
jobs = []
args = sys.argv[1:]
for ds, skip, limit in zip(args[::3], args[1::3], args[2::3]):
    for p in build_prompts(tok, [ds], limit=int(limit), skip=int(skip))[ds]:
        jobs.append((ds, torch.tensor([p["input_ids"]])))
repeats = int(os.environ.get("REPEATS", "2"))


def run(name, ids, new=128):
    kwargs, switch = ARMS[name]
    if switch is not None:
        os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = switch
    try:
        start = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False, **kwargs)
        seconds = time.perf_counter() - start
    finally:
        os.environ.pop("TRANSFORMERS_SDPA_FORCE_GQA", None)
    drafter = kwargs.get("assistant_model")
    stats = drafter.last_generation_stats if drafter is not None else None
    return out.shape[1] - ids.shape[1], seconds, out[0, ids.shape[1]:].tolist(), stats


names = os.environ.get("ARMS", " ".join(ARMS)).split()
for name in names:  # warm-up (and the n-gram drafter's one-time cost measurement)
    run(name, jobs[0][1], 16)
speed, stats_total = [], {}
for i, (ds, ids) in enumerate(jobs):
    order = names[i % len(names):] + names[:i % len(names)]
    best, texts = {}, {}
    for r in range(repeats):
        for name in (order if r % 2 == 0 else order[::-1]):
            n, s, text, st = run(name, ids)
            best[name] = max(best.get(name, 0.0), n / s)
            texts.setdefault(name, text)
            if r == 0 and st is not None:
                t = stats_total.setdefault((name, ds), [0, 0, 0, 0])
                t[0] += st.new_tokens; t[1] += st.cycles; t[2] += sum(st.tree_sizes)
                t[3] += getattr(st, "drafter_skipped_cycles", 0)
    speed.append((ds, best))
    differ = [name for name in names if texts[name] != texts["plain"]]
    print(i, ds, " ".join(f"{k}={best[k]:.1f}" for k in names), "| text differs from plain's:", ",".join(differ) or "none",
          flush=True)


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
