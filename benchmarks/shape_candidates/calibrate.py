"""Time this machine for each shipped SmolLM2 drafter (what the first generate() call does) and print the
choice; writes the profile (verification curve + each drafter's drafting/loop ms per candidate) as JSON for
predict.py. Run it alone: the timings are cached in $HF_SPEC_CACHE/shape_costs/ and used by every later call.

    python benchmarks/shape_candidates/calibrate.py benchmarks/shape_candidates/profile_<machine>.json
"""
import json, sys, time
import torch
import hf_spec
from hf_spec.bench.harness import machine_info
from hf_spec.resources import load_model
from hf_spec.tune import cost_profile, select_shape

torch.set_num_threads(2)
target, _ = load_model("smollm2-135m-instruct", dtype=torch.bfloat16)
out = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "machine": machine_info(torch.bfloat16), "cycle_ms": {}, "choice": {}, "seconds": {}}
for name in ("hass", "eagle", "coral", "parallelspec"):
    drafter = hf_spec.AutoDrafter.from_pretrained(f"drafters/smollm2-135m-instruct-{name}").to(torch.bfloat16).bind(target)
    start = time.perf_counter()
    choice = select_shape(target, drafter)
    out["seconds"][name] = round(time.perf_counter() - start, 2)
    profile = cost_profile(target, drafter, drafter.config.tree_shape_candidates)
    out["verify_ms"] = profile.verify_ms
    out["cycle_ms"][name] = [round(x, 3) for x in profile.cycle_ms]
    out["choice"][name] = {**choice.candidate, "predicted_ms_per_token": choice.predicted_ms_per_token}
    print(name, out["seconds"][name], "s", out["cycle_ms"][name], "->", out["choice"][name], flush=True)
print("verify_ms", out["verify_ms"])
json.dump(out, open(sys.argv[1], "w"), indent=1)
