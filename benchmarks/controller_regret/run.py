"""Does the speed controller find the best arm? A shipped folder through its controller (default) against each of
its shape candidates fixed for the whole call (controller off) and plain greedy, interleaved per prompt.

    python benchmarks/controller_regret/run.py float32 eagle
    python benchmarks/controller_regret/run.py bfloat16 eagle

Reports, as geometric means over prompts of the speedup over plain: the controller, every fixed candidate, the
best single candidate (chosen after the fact, over all prompts) and the best candidate per prompt (an oracle no
controller can beat without luck). Regret = how far the controller lies below each. Prompts: the held-aside set
of ``benchmarks/fresh_machine/cost_gate_prompts.json`` (not fresh_machine's, which no choice may use). 128 new
tokens, greedy, one timed run per prompt and method, order rotated per prompt; one process, the controller
warm from the earlier prompts as a user's would be. Public API only."""

import json
import sys
import time
from pathlib import Path

import torch

import hf_spec

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fresh_machine import geomean  # noqa: E402

dtype, family = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "eagle"
out = Path(sys.argv[3]) if len(sys.argv) > 3 else Path(__file__).parent / f"{family}_{dtype}"
folder = Path(__file__).resolve().parents[2] / "drafters" / f"smollm2-135m-instruct-{family}"
torch.set_num_threads(2)
model, tok = hf_spec.load_packaged_model("smollm2-135m-instruct", dtype=getattr(torch, dtype))
drafter = hf_spec.AutoDrafter.from_pretrained(folder, target=model)
candidates = drafter.config.tree_shape_candidates
methods = {"plain": {}, "controller": {"assistant_model": drafter}}
for i, candidate in enumerate(candidates):
    shape = {k: v for k, v in candidate.items() if k not in ("tau", "verified_nodes") and v is not None}
    methods[f"fixed{i}"] = {"assistant_model": drafter, **shape}
saved = json.loads((Path(__file__).parents[1] / "fresh_machine" / "cost_gate_prompts.json").read_text())["prompts"]
prompts = [(row["kind"], torch.tensor([row["input_ids"]])) for row in saved]
for kwargs in methods.values():  # warm-up, untimed (the controller's first call, kernels)
    model.generate(prompts[0][1], max_new_tokens=16, do_sample=False, **kwargs)

names, rows = list(methods), []
for p, (kind, ids) in enumerate(prompts):
    order = names[p % len(names):] + names[: p % len(names)]
    seconds, outs, arms = {}, {}, None
    for name in order:
        start = time.perf_counter()
        outs[name] = model.generate(ids, max_new_tokens=128, do_sample=False, **methods[name])
        seconds[name] = time.perf_counter() - start
        if name == "controller":
            arms = list(drafter.last_generation_stats.arm_per_cycle)
    speed = {name: seconds["plain"] / seconds[name] for name in names}
    fixed = {n: s for n, s in speed.items() if n.startswith("fixed")}
    rows.append({"prompt": p, "kind": kind, "new_tokens": outs["plain"].shape[1] - ids.shape[1], "x_plain": speed,
                 "best_fixed": max(fixed, key=fixed.get), "controller_arms": {a: arms.count(a) for a in sorted(set(arms))},
                 "identical": all(torch.equal(outs["plain"], o) for o in outs.values())})  # fmt: skip
    r = rows[-1]
    print(f"{p} {kind}: controller {speed['controller']:.2f}x, best fixed {r['best_fixed']} {fixed[r['best_fixed']]:.2f}x,"
          f" arms {r['controller_arms']}, identical {r['identical']}", flush=True)  # fmt: skip

summary = {name: geomean([r["x_plain"][name] for r in rows]) for name in names}
best_single = max((n for n in names if n.startswith("fixed")), key=summary.get)
per_prompt = geomean([r["x_plain"][r["best_fixed"]] for r in rows])
result = {"command": " ".join(["python", *sys.argv]), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
          "dtype": dtype, "folder": folder.name, "torch": torch.__version__, "threads": torch.get_num_threads(),
          "candidates": candidates, "x_plain": summary, "best_single_fixed": best_single,
          "best_fixed_per_prompt_x_plain": per_prompt,
          "controller_over_best_single": summary["controller"] / summary[best_single],
          "controller_over_best_per_prompt": summary["controller"] / per_prompt,
          "all_identical": all(r["identical"] for r in rows), "rows": rows}  # fmt: skip
out.mkdir(parents=True, exist_ok=True)
(out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
print(json.dumps({k: v for k, v in result.items() if k not in ("rows", "candidates")}, indent=1))
