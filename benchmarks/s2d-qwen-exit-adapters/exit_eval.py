"""Held-aside accuracy and calibration of a sorted drafter's exits against Qwen2.5-Coder-0.5B's greedy next token.

    python benchmarks/s2d-qwen-exit-adapters/exit_eval.py DRAFTER_DIR SKIP N OUT.json

ShareGPT rows SKIP..SKIP+N-1 (<= 512 tokens; after the training rows), labelled by the 0.5B (bf16, teacher-forced
greedy). Per exit: teacher-forced top-1 on positions whose label is in the draft vocabulary, and for confidence
floors c (the S2D threshold: the exit's max probability over the draft vocabulary) the share of positions at or
above c and the top-1 among them: what an exit threshold of c would fire on and how often it would be right.
"""
import json, sys, time
import torch
from hf_spec import SortedDrafter, load_packaged_model
from hf_spec.bench.datasets import load_sharegpt
from hf_spec.training.sorted_trainer import teacher_labels, tokenize_conversations

torch.set_num_threads(2)
PATH, SKIP, N, OUT = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
FLOORS = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95)
source, tok = load_packaged_model("qwen2.5-coder-0.5b-instruct", dtype=torch.bfloat16)
source.eval()
source.config._name_or_path = "qwen2.5-coder-0.5b-instruct"
rows = tokenize_conversations(tok, load_sharegpt(limit=SKIP + N), 512)[SKIP:]
with torch.inference_mode():
    rows = teacher_labels(source, rows)
drafter = SortedDrafter.from_pretrained(PATH, dtype=torch.bfloat16).eval()
drafter.bind(source)
num_exits = len(drafter.config.exits)
hits, confs, total = [[] for _ in range(num_exits)], [[] for _ in range(num_exits)], 0
start = time.time()
with torch.inference_mode():
    for r in rows:
        ids = torch.tensor([r["input_ids"]])
        target = drafter.exit_labels(torch.tensor([r["labels"]]))[0, 1:]
        keep = target != -100
        for e, logits in enumerate(drafter(input_ids=ids).logits_per_exit):
            probs = torch.softmax(logits[0, :-1].float(), -1)[keep]
            confidence, pred = probs.max(-1)
            hits[e].append(pred == target[keep])
            confs[e].append(confidence)
        total += int(keep.sum())
report = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
          "drafter": PATH, "exits": drafter.config.exits, "positions": total, "exits_report": {}}
for e, layer in enumerate(drafter.config.exits):
    h, c = torch.cat(hits[e]).float(), torch.cat(confs[e])
    floors = {f: {"share": round(float((c >= f).float().mean()), 3),
                  "top1": round(float(h[c >= f].mean()), 3) if bool((c >= f).any()) else None} for f in FLOORS}
    report["exits_report"][layer] = {"top1": round(float(h.mean()), 3), "at_confidence": floors}
    print(layer, report["exits_report"][layer], flush=True)
print(f"{total} positions in {time.time() - start:.0f}s")
json.dump(report, open(OUT, "w"), indent=1)
