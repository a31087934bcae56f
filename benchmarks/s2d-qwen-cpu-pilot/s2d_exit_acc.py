"""Teacher-forced top-1 of each exit against the 0.5B's greedy next token, on held-aside ShareGPT rows
(rows after the training --limit), for the untrained extraction and trained checkpoints given as args."""
import sys, json, torch
import hf_spec
from hf_spec import SortedDrafter, load_packaged_model
from hf_spec.bench.datasets import load_sharegpt
from hf_spec.training.sorted_trainer import tokenize_conversations, teacher_labels
torch.set_num_threads(2)
SKIP, N = int(sys.argv[1]), int(sys.argv[2])
teacher, tok = load_packaged_model("qwen2.5-coder-0.5b-instruct", dtype=torch.bfloat16)
teacher.eval()
rows = tokenize_conversations(tok, load_sharegpt(limit=SKIP + N), 512)[SKIP:]
with torch.inference_mode():
    rows = teacher_labels(teacher, rows)
def accuracy(drafter):
    hits, total = None, 0
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        for r in rows:
            ids = torch.tensor([r["input_ids"]]); labels = drafter.exit_labels(torch.tensor([r["labels"]]))
            out = drafter(input_ids=ids)
            target = labels[0, 1:]; keep = target != -100
            preds = [lg[0, :-1].argmax(-1)[keep] for lg in out.logits_per_exit]
            h = [int((p == target[keep]).sum()) for p in preds]
            hits = h if hits is None else [a + b for a, b in zip(hits, h)]
            total += int(keep.sum())
    return [round(h / total, 3) for h in hits], total
res = {}
del teacher
source, _ = load_packaged_model("qwen2.5-coder-0.5b-instruct", dtype=torch.float32)
base = SortedDrafter.from_source_model(source, num_layers=8, exits=[4, 6, 8]).eval()
res["extracted, untrained, full vocab"] = accuracy(base)
del base
for path in sys.argv[3:]:
    d = SortedDrafter.from_pretrained(path)
    d.bind(source); d.eval()
    res[path] = accuracy(d)
print(json.dumps(res, indent=1))
