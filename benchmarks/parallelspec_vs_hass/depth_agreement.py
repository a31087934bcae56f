"""Teacher-forced top-1 agreement with the target per draft depth of a ParallelSpec drafter.

On rows of a feature cache, runs the group-wise training layout (random anchors) and counts,
at every counted position, whether the drafter's argmax equals the target's greedy token
(the argmax of the target's LM head on the cached feature): depth 0 is the root pair (as an
EAGLE drafter's first step), depth j the ``[MASK]_j`` output (j tokens further).

    python benchmarks/parallelspec_vs_hass/depth_agreement.py \\
        --drafter drafters/smollm2-135m-instruct-parallelspec --feature-cache runs/features/sd256-512 --rows 24
"""

from __future__ import annotations

import argparse
import json

import torch

import hf_spec
from hf_spec.training.data import features_from_storage, load_feature_cache
from hf_spec.training.parallel import build_parallel_layout, parallel_forward, sample_anchors


@torch.no_grad()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--feature-cache", required=True)
    parser.add_argument("--rows", type=int, default=24, help="the last N rows of the cache")
    parser.add_argument("--groups", type=int, default=16, help="parallel groups (anchors) per row")
    args = parser.parse_args()

    torch.manual_seed(0)
    dataset, storage = load_feature_cache(args.feature_cache)
    target, _ = hf_spec.load_packaged_model(args.target, dtype=torch.float32)
    drafter = hf_spec.ParallelDrafter.from_pretrained(args.drafter, dtype=torch.float32).bind(target).eval()
    k = drafter.num_mask_tokens
    hits, counts = torch.zeros(k + 1), torch.zeros(k + 1)
    for r in range(len(dataset) - args.rows, len(dataset)):
        row = dataset[r]
        ids = torch.as_tensor(row["input_ids"]).view(1, -1)
        feats = features_from_storage(row["hidden_states"], storage).float().unsqueeze(0)
        loss_mask = torch.as_tensor(row["loss_mask"]).view(1, -1)
        pairs = ids.shape[1] - 1
        layout = build_parallel_layout(pairs, sample_anchors(pairs, args.groups, k), k)
        out = parallel_forward(drafter, ids, feats, layout, output_logits=False)
        predicted = drafter.draft_log_probs(out.last_hidden_state[0]).argmax(-1)  # what it drafts (draft vocab too)
        index = layout.target_index[0].clamp(min=0)
        valid = (layout.target_index[0] >= 0) & loss_mask[0, 2:].bool()[index.clamp(max=loss_mask.shape[1] - 3)]
        greedy = drafter.lm_logits(feats[0, 1:][index]).argmax(-1)  # the target's token after f_{t+1}
        for depth in range(k + 1):
            selected = valid & (layout.mask_ids[0] == depth)
            hits[depth] += (predicted[selected] == greedy[selected]).sum()
            counts[depth] += selected.sum()
    print(json.dumps({"drafter": args.drafter, "rows": args.rows, "positions": counts.int().tolist(),
                      "top1_agreement_by_depth": [round(x, 3) for x in (hits / counts).tolist()]}))  # fmt: skip


if __name__ == "__main__":
    main()
