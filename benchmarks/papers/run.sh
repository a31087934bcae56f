#!/usr/bin/env bash
# The paper comparison (issue "Faithful recipes", item 7); README.md holds the table and the claims.
# Each group compares drafters trained on the same self-distilled data at the same budget, with
# training_scripts/compare_papers.py: teacher-forced top-1 at steps 1-4 on held-out turns, τ at each paper's own
# tree and at a depth-5 chain on prompts 40..44 of MT-bench, HumanEval and GSM8K, float32, n-gram candidates off;
# each compared folder's model card gets its row (--cards).
#   PAPER_GROUPS="two_epochs ten_epochs" (default both) picks the groups; each writes benchmarks/papers/<group>/.
set -euo pipefail
cd "$(dirname "$0")/../.."
GROUPS_TO_RUN=${PAPER_GROUPS:-two_epochs ten_epochs}
HELDOUT=runs/features/smollm2-sharegpt-heldout
D=drafters/smollm2-135m-instruct
# 128 ShareGPT turns no drafter trained on (conversations 6,400..), answered by the target in float32; EAGLE-3 reads
# the inputs of the target layers it fuses, so the cache gets a copy with them beside it
[ -f $HELDOUT/hf_spec_features.json ] || python -m hf_spec.training.distill --target_model smollm2-135m-instruct \
  --dataset sharegpt --num_conversations 128 --skip_conversations 6400 --batch_size 64 --shard_examples 128 \
  --threads 2 --dtype float32 --output $HELDOUT
[ -f $HELDOUT+layers-2-15-27/hf_spec_features.json ] || python -m hf_spec.training.data layers \
  --target_model smollm2-135m-instruct --dtype float32 --feature_cache $HELDOUT --layers 2 15 27
COMMON="--target smollm2-135m-instruct --prompts-per-set 5 --max-new-tokens 128 --tf-cache $HELDOUT --dtype float32"
for group in $GROUPS_TO_RUN; do
  case $group in
    two_epochs)  # EAGLE and HASS as shipped before their 10-epoch successors (git 3fd78c7^), EAGLE-3 before its (b35528b)
      old=runs/two-epoch-folders
      for m in eagle hass; do
        [ -d $old/$D-$m ] || { mkdir -p $old && git archive 3fd78c7^ $D-$m | tar -x -C $old; }
      done
      [ -d $old/$D-eagle3 ] || { mkdir -p $old && git archive b35528b $D-eagle3 | tar -x -C $old; }
      drafters="$old/$D-eagle $old/$D-hass $old/$D-eagle3" ;;
    ten_epochs) drafters="$D-eagle $D-hass $D-coral $D-parallelspec $D-eagle3" ;;
    *) echo "unknown group $group (two_epochs, ten_epochs)" >&2; exit 2 ;;
  esac
  python training_scripts/compare_papers.py --drafters $drafters $COMMON --output-dir benchmarks/papers/$group --cards
done
