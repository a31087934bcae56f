"""Teacher-forced accuracy of feature drafters, per drafting step, on a self-distilled feature cache.

    python benchmarks/teacher_forced_accuracy/tf_acc.py CACHE DRAFTER [DRAFTER ...]

Step 1 is EAGLE's setting (the drafter reads the target's features); step s > 1 reads the features the
drafter itself predicted s - 1 steps earlier, as at drafting depth s (HASS's unrolled context,
:func:`hf_spec.training.losses.hass_loss`). Every step predicts the same token: the target's greedy next
token, which in a self-distilled cache is the data's next token. Prints top-1 / top-4 accuracy per step
over the answer positions. Comparing a cache of training conversations with one of held-out
conversations separates overfitting (train >> held-out) from underfitting (both alike).
"""

import os
import sys

import torch

import hf_spec
from hf_spec.training.collators import FeatureCollator
from hf_spec.training.data import load_feature_cache, load_target
from hf_spec.training.losses import hass_loss, next_token_ids, shift_for_drafter

STEPS = 3


@torch.no_grad()
def accuracy(drafter, dataset, storage: str, batch_size: int = 16) -> dict:
    collate = FeatureCollator(storage=storage, max_length=512)
    hits = {step: [0, 0, 0] for step in range(1, STEPS + 1)}  # top-1 hits, top-4 hits, positions
    for start in range(0, len(dataset), batch_size):
        batch = collate([dataset[i] for i in range(start, min(start + batch_size, len(dataset)))])
        ids, feats_in, feats_target, mask = shift_for_drafter(batch["input_ids"], batch["hidden_states"],
                                                              batch["loss_mask"], batch["attention_mask"])  # fmt: skip
        next_ids = next_token_ids(ids)[mask.bool()]
        out = hass_loss(drafter, ids, feats_in, feats_target, mask, num_steps=STEPS, return_predictions=True)
        for step, predicted in enumerate(out["predictions"], 1):
            top = drafter.draft_logits(predicted[mask.bool()]).float().topk(4, dim=-1).indices
            if drafter.has_draft_vocab:  # draft index -> target id
                top = top + drafter.d2t[top]
            hits[step][0] += int((top[:, 0] == next_ids).sum())
            hits[step][1] += int((top == next_ids[:, None]).any(-1).sum())
            hits[step][2] += int(next_ids.numel())
    return {step: {"top1": round(a / n, 3), "top4": round(b / n, 3), "positions": n} for step, (a, b, n) in hits.items()}


def main(cache: str, drafters: list[str]) -> None:
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    dataset, storage = load_feature_cache(cache)
    target, _ = load_target("smollm2-135m-instruct", torch.float32)
    for path in drafters:
        drafter = hf_spec.AutoDrafter.from_pretrained(path, target=target).float().eval()
        print(path, cache, accuracy(drafter, dataset.with_format("numpy"), storage), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
