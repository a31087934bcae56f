"""Predict tokens/s of each swept config on three measured CPU cost curves; pick the config whose
worst ratio to each machine's best is highest. tau/nodes from the sweep (machine-independent)."""
import json, sys, numpy as np
sweep = json.load(open(sys.argv[1]))["results"]
curves = {  # ms of one verification forward of n tokens
    "intel_avx512bf16_this": {1: 40.6, 2: 46.3, 4: 51.3, 8: 60.2, 16: 75.1, 32: 109.3},
    "amd_epyc_tune": {1: 61.8, 2: 67.0, 4: 69.9, 6: 71.3, 8: 77.9, 12: 82.7, 16: 90.8, 24: 103.4, 32: 109.0},
    "amx_resources": {1: 21, 4: 21, 8: 23, 16: 27, 32: 35},
}
if len(sys.argv) > 2:
    curves.update(json.load(open(sys.argv[2])))
DRAFT_RATIO = 0.13  # d2 drafting / t(1), measured on the AMD machine (8 ms / 62 ms)
def t(curve, n):
    xs = sorted(curve); return float(np.interp(n, xs, [curve[x] for x in xs]))
rows = {}
for name, r in sweep.items():
    if not r["cycles"]: continue
    tau = 1 + r["accepted"] / r["cycles"]; nodes = r["nodes"] / r["cycles"]
    draft = DRAFT_RATIO if name.startswith("hass") else 0.01
    rows[name] = {m: tau / (t(c, nodes) + draft * c[1]) * 1000 / (1000 / c[1]) for m, c in curves.items()}  # speedup vs t(1)
    rows[name]["tau"], rows[name]["nodes"] = tau, nodes
best = {m: max(v[m] for v in rows.values()) for m in curves}
for name, v in sorted(rows.items(), key=lambda kv: -min(kv[1][m] / best[m] for m in curves)):
    print(f"{name:22s} tau {v['tau']:4.2f} nodes {v['nodes']:5.1f} " + " ".join(f"{m[:5]} {v[m]:4.2f}x" for m in curves)
          + f"  worst/best {min(v[m] / best[m] for m in curves):.3f}")
