#!/usr/bin/env bash
# (second run: config tree_depth 2, tree_min_prob 0, the chain pilot's proxy choice) Thresholds per target (held-out prompts 10), then the two-target bench on prompts 6..7 (one CPU job at a time).
set -eu
cd /work/main
REC=benchmarks/s2d-qwen-exit-adapters
D=runs/s2d_exits
echo "thresholds $(date -u +%T)"
python training_scripts/search_s2d_thresholds.py --drafter $D --targets qwen2.5-coder-1.5b-instruct \
  qwen2.5-coder-0.5b-instruct --offset 10 --per-dataset 1 --max-new-tokens 32 --grid 0.0 0.7 0.9 2.0 \
  --threads 2 --out $REC/thresholds.json
common="--max-new-tokens 64 --dtype bfloat16 --threads 2 --skip 6 --limit 2"
echo "bench 1.5B $(date -u +%T)"
hf-spec bench --target qwen2.5-coder-1.5b-instruct $common --methods plain prompt_lookup \
  assisted:qwen2.5-coder-0.5b-instruct hf_spec:$D hf_spec:$D:exit=8 hf_spec:$D:exit=16 hf_spec:$D:exit=24 \
  --output-dir $REC/qwen1.5b
echo "bench 0.5B $(date -u +%T)"
hf-spec bench --target qwen2.5-coder-0.5b-instruct $common --methods plain prompt_lookup \
  hf_spec:$D hf_spec:$D:exit=8 hf_spec:$D:exit=16 hf_spec:$D:exit=24 --output-dir $REC/qwen0.5b
echo "QUEUE31B DONE $(date -u +%T)"
