"""Replay of per-cycle trees recorded by collect.py: tau and predicted cost of keeping the top-t1 depth-1 nodes and
extending deeper only below nodes whose cumulative draft probability is >= theta (up to depth D), n-gram off.
Cost model: this machine's verification curve and drafter cost per depth (fitted from the two recorded shapes).
    python sim.py collect_3.json collect_12.json"""
import json, math, sys
from collections import defaultdict
def V(n):  # verify ms for n tree tokens (incl. root), this machine, 200-token context (medians)
    return 39.6 + 0.85 * (n - 1)
def simulate(cycles, t1, theta, D, a, b, kmax=4):
    tok = cost = 0.0
    for c in cycles:
        depth, score, parent, acc = c["depths"], c["scores"], c["parents"], c["accepted"]
        n = len(depth)
        d1 = sorted([i for i in range(n) if depth[i] == 1], key=lambda i: -score[i])[:t1]
        kept = set(d1) | {0}
        expanded_depths = set()
        for d in range(1, D):
            # expand kept nodes at depth d whose cum prob >= theta
            exp = [i for i in kept if depth[i] == d and math.exp(score[i]) >= theta]
            if not exp: break
            expanded_depths.add(d)
            for i in exp:
                kids = sorted([j for j in range(n) if parent[j] == i], key=lambda j: -score[j])[:kmax]
                kept |= set(kids)  # the recorded children of an expanded node
        accepted = 0
        for node in acc[1:]:
            if node in kept: accepted += 1
            else: break
        forwards = 1 + len(expanded_depths)
        tok += accepted + 1
        cost += V(len(kept)) + a + b * forwards
    return tok / len(cycles), cost / len(cycles), tok / cost * 1000
data = {}
for f in sys.argv[1:]:
    d = json.load(open(f))
    for k, v in d.items():
        e = data.setdefault(k, {"cycles": [], "draft_s": 0, "forwards": 0, "target_s": 0})
        e["cycles"] += v["cycles"]; e["draft_s"] += v["draft_s"]; e["forwards"] += v["forwards"]; e["target_s"] += v["target_s"]
for k, v in data.items():
    print(k, "cycles", len(v["cycles"]), "draft ms/cycle %.2f target ms/cycle %.2f tau %.2f" % (
        v["draft_s"] / v["forwards"] * 1e3, v["target_s"] / v["forwards"] * 1e3,
        sum(len(c["accepted"]) for c in v["cycles"]) / len(v["cycles"])))
c5 = data["d5t12"]["draft_s"] / data["d5t12"]["forwards"] * 1e3
c1 = data["d1t4"]["draft_s"] / data["d1t4"]["forwards"] * 1e3
b = (c5 - c1) / 4; a = c1 - b
print("drafter cost a=%.2f b=%.2f ms" % (a, b))
cyc = data["d5t12"]["cycles"]
print("baseline d1 t2:", simulate(cyc, 2, 1.1, 1, a, b))
print("d1 t4:", simulate(cyc, 4, 1.1, 1, a, b))
for t1 in [2, 3, 4]:
    for D in [2, 3, 5]:
        for theta in [0.3, 0.4, 0.5, 0.6, 0.7, 0.8]:
            r = simulate(cyc, t1, theta, D, a, b)
            print(f"t1={t1} D={D} theta={theta}: tau {r[0]:.3f} cost {r[1]:.1f} ms tok/s {r[2]:.2f}")
