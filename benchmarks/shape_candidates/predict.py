"""Which candidate the run-time choice (hf_spec.shape_select) picks on each recorded machine's cost curve.

Verification curves t(n) are measured (this session's machine by `hf_spec.tune.measure_costs`; the others from
their records); drafting + loop ms per cycle on the older machines is scaled from this machine's calibration by
the ratio of their one-token step t(1) (an estimate: their drafting was not timed per candidate).

    python benchmarks/shape_candidates/predict.py benchmarks/shape_candidates/candidates.json PROFILE.json
"""
import json, sys
from hf_spec.shape_select import CostProfile, choose_candidate, predict_ms_per_token

measured = json.load(open(sys.argv[1]))
here = json.load(open(sys.argv[2]))  # {"verify_ms": {...}, "cycle_ms": {drafter: [...]}}
curves = {
    "this machine (Intel, AMX)": {int(k): v for k, v in here["verify_ms"].items()},
    "Intel without AMX (verify_cost_cpu)": {1: 42.4, 2: 47.4, 4: 49.9, 8: 58.9, 16: 76.3, 32: 110.8, 64: 173.7},
    "AMD EPYC (tune/hass.json)": {1: 61.8, 2: 67.0, 4: 69.9, 6: 71.3, 8: 77.9, 12: 82.7, 16: 90.8, 24: 103.4, 32: 109.0},
}
t1_here = curves["this machine (Intel, AMX)"][1]
for name, entry in measured["drafters"].items():
    candidates = entry["candidates"]
    for machine, curve in curves.items():
        scale = curve[1] / t1_here
        profile = CostProfile(curve, [ms * scale for ms in here["cycle_ms"][name]], machine)
        best = choose_candidate(candidates, profile)
        c = candidates[best]
        ms = predict_ms_per_token(c, curve, profile.cycle_ms[best])
        print(f"{name:13s} {machine:36s} -> d{c['tree_depth']}/k{c['tree_top_k']}/t{c['tree_total_tokens']}"
              f" + {c['ngram_branches']} n-gram  (tau {c['tau']:.2f}, {c['verified_nodes']:.1f} nodes; predicted "
              f"{curve[1] / ms:.2f}x a one-token step)")
