#!/usr/bin/env bash
# S2D on Qwen2.5-Coder-1.5B and -0.5B: the sorted drafter and the exit-adapter drafter, each with per-target
# thresholds searched on measured speed, beside plain generate(), prompt lookup and assisted decoding; bf16.
# 0. the cost of a draft step at each candidate exit depth beside each target's step (cost_per_exit.json);
# 1. both folders' thresholds per target at a depth-3 chain (held-out prompts 10 of each set, 32 tokens,
#    thresholds-<folder>.json);
# 2. both folders' chain-depth ladders (the speed controller's arms), measured on the 0.5B, prompts 33..34;
# 3. hf-spec bench on each target, prompts 6..7 of MT-bench, HumanEval and GSM8K, 64 new tokens, greedy,
#    methods interleaved per prompt (qwen1.5b/, qwen0.5b/).
# Usage: SORTED=<folder> EXITS=<folder> bash benchmarks/s2d-qwen/run.sh   (one CPU job at a time)
#   SEARCH="<folders>" (default both) limits steps 1-2 to the folders whose weights changed since their last search.
set -eu
cd "$(dirname "$0")/../.."
REC=benchmarks/s2d-qwen
SORTED=${SORTED:-drafters/qwen2.5-coder-instruct-s2d-sorted}
EXITS=${EXITS:-drafters/qwen2.5-coder-instruct-s2d}
echo "cost per exit $(date -u +%T)"
python $REC/cost_per_exit.py --dtype bfloat16 > $REC/cost_per_exit.json
SEARCH=${SEARCH:-$SORTED $EXITS}
for D in $SEARCH; do
  echo "thresholds $D $(date -u +%T)"
  python training_scripts/search_s2d_thresholds.py --drafter $D --targets qwen2.5-coder-1.5b-instruct \
    qwen2.5-coder-0.5b-instruct --offset 10 --per-dataset 1 --max-new-tokens 32 --grid 0.0 0.7 0.9 2.0 --tree-depth 3 \
    --threads 2 --out $REC/thresholds-$(basename $D).json
done
echo "chain ladder $(date -u +%T)"
python training_scripts/measure_shape_candidates.py $SEARCH --target qwen2.5-coder-0.5b-instruct --dtype bfloat16 \
  --skip 33 --prompts 2 --max-new-tokens 64
common="--max-new-tokens 64 --dtype bfloat16 --threads 2 --skip 6 --limit 2"
s2d="hf_spec:$SORTED hf_spec:$SORTED:exit=4 hf_spec:$SORTED:exit=6 hf_spec:$SORTED:exit=8 hf_spec:$EXITS hf_spec:$EXITS:exit=24"
echo "bench 1.5B $(date -u +%T)"
hf-spec bench --target qwen2.5-coder-1.5b-instruct $common --methods plain prompt_lookup \
  assisted:qwen2.5-coder-0.5b-instruct $s2d --output-dir $REC/qwen1.5b
echo "bench 0.5B $(date -u +%T)"
hf-spec bench --target qwen2.5-coder-0.5b-instruct $common --methods plain prompt_lookup $s2d --output-dir $REC/qwen0.5b
echo "done $(date -u +%T)"
