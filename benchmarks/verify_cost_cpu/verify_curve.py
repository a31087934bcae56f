"""Verification cost curve t(k), k = 1..128, of real packaged targets on this CPU (bf16, 2 threads)."""
import json, sys, time, platform, torch
from hf_spec.resources import load_model
from hf_spec.tune import measure_verify_cost
from hf_spec.bench.harness import machine_info
torch.set_num_threads(2)
out = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "machine": machine_info(torch.bfloat16), "what": "ms of one target forward of k tree tokens (tree mask) on a "
       "256-token cached prefix + the LM head over the k rows, median of 5 (hf_spec.tune.measure_verify_cost)", "curves": {}}
for name in sys.argv[2:]:
    model, _ = load_model(name, dtype=torch.bfloat16)
    out["curves"][name] = measure_verify_cost(model, [1, 2, 4, 8, 16, 32, 64, 128], prefix_length=256, repeats=5)
    print(name, out["curves"][name], flush=True)
    del model
json.dump(out, open(sys.argv[1], "w"), indent=1)
