"""Would a frozen backbone with small per-exit adapters make better S2D exits than LoRA'd early layers?

    python benchmarks/s2d-qwen-cpu-pilot/probe_exits.py TRAIN_ROWS EPOCHS OUT.json

Qwen2.5-Coder-0.5B-Instruct (bf16 forward, 2 threads), frozen. For ShareGPT rows 0..TRAIN_ROWS-1 (<= 512 tokens) one
forward caches the hidden states after layers 4, 8, 12, 16 and the model's greedy next token (the labels a sorted
drafter is trained on). Per layer, an exit = a trainable linear map (896 x 896, initialised to the identity) + a
trainable copy of the final norm + the frozen tied head over the 16,384 most frequent label ids; trained EPOCHS
epochs with AdamW (lr 1e-3, batch 256 positions, float32). Reported: teacher-forced top-1 on the held-aside rows
2000..2019 (the rows of exit_accuracy_500k.json), positions whose label is in the draft vocabulary, before
(identity map: the raw layer state through norm + head) and after training.
"""
import json, sys, time
import torch
from hf_spec import load_packaged_model
from hf_spec.bench.datasets import load_sharegpt
from hf_spec.training.sorted_trainer import tokenize_conversations

torch.set_num_threads(2)
torch.manual_seed(0)
TRAIN_ROWS, EPOCHS, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
LAYERS, VOCAB = (4, 8, 12, 16), 16384
model, tok = load_packaged_model("qwen2.5-coder-0.5b-instruct", dtype=torch.bfloat16)
model.eval().requires_grad_(False)
conversations = load_sharegpt(limit=2020)
train_rows = tokenize_conversations(tok, conversations[:TRAIN_ROWS], 512)
test_rows = tokenize_conversations(tok, conversations[2000:2020], 512)


@torch.inference_mode()
def cache(rows):
    states, labels, start = {l: [] for l in LAYERS}, [], time.time()
    for r in rows:
        out = model(input_ids=torch.tensor([r["input_ids"]]), output_hidden_states=True)
        for l in LAYERS:
            states[l].append(out.hidden_states[l][0, :-1].float())
        labels.append(out.logits[0, :-1].argmax(-1))
    n = sum(len(x) for x in labels)
    print(f"cached {n} positions of {len(rows)} rows in {time.time() - start:.0f}s", flush=True)
    return {l: torch.cat(v) for l, v in states.items()}, torch.cat(labels)


train_states, train_labels = cache(train_rows)
test_states, test_labels = cache(test_rows)
counts = torch.bincount(train_labels, minlength=model.config.vocab_size)
draft_ids = counts.topk(VOCAB).indices
t2d = torch.full((model.config.vocab_size,), -100, dtype=torch.long)
t2d[draft_ids] = torch.arange(VOCAB)
head = model.lm_head.weight[draft_ids].detach().float()  # (D, H), frozen
final_norm = model.model.norm
results = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "train_positions": int(len(train_labels)), "test_positions": None,
           "draft_vocab_coverage_train": float((t2d[train_labels] >= 0).float().mean()), "layers": {}}


class Exit(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.map = torch.nn.Linear(hidden, hidden, bias=False)
        torch.nn.init.eye_(self.map.weight)
        self.norm_weight = torch.nn.Parameter(final_norm.weight.detach().float().clone())
        self.eps = final_norm.variance_epsilon

    def forward(self, h):
        h = self.map(h)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm_weight
        return h @ head.T


def accuracy(exit_, states, labels):
    target = t2d[labels]
    keep = target >= 0
    with torch.no_grad():
        pred = torch.cat([exit_(s).argmax(-1) for s in states[keep].split(2048)])
    return float((pred == target[keep]).float().mean()), int(keep.sum())


for layer in LAYERS:
    exit_ = Exit(train_states[layer].shape[-1])
    before, n_test = accuracy(exit_, test_states[layer], test_labels)
    target = t2d[train_labels]
    keep = target >= 0
    x, y = train_states[layer][keep], target[keep]
    opt = torch.optim.AdamW(exit_.parameters(), lr=1e-3, weight_decay=0.0)
    start = time.time()
    for epoch in range(EPOCHS):
        order = torch.randperm(len(y))
        for i in range(0, len(y), 256):
            idx = order[i : i + 256]
            loss = torch.nn.functional.cross_entropy(exit_(x[idx]), y[idx])
            opt.zero_grad(); loss.backward(); opt.step()
    after, _ = accuracy(exit_, test_states[layer], test_labels)
    train_acc, _ = accuracy(exit_, train_states[layer], train_labels)
    results["test_positions"] = n_test
    results["layers"][layer] = {"identity_top1": round(before, 3), "trained_top1": round(after, 3),
                                "train_top1": round(train_acc, 3), "train_seconds": round(time.time() - start)}
    print(layer, results["layers"][layer], flush=True)
    json.dump(results, open(OUT, "w"), indent=1)
