#!/usr/bin/env bash
# The SmolLM2 issue-#13/#14 bench over its four prompt ranges (first 3, held-out 6..8 and 9..11 of MT-bench, HumanEval
# and GSM8K, and 4 code edits): bf16, 2 threads, T=0, 128 new tokens, methods interleaved per prompt. Run alone.
#   benchmarks/bench_ranges.sh OUT_DIR METHOD [METHOD ...]
# Tables: python benchmarks/smollm2-drafters-that-pay/tables.py OUT_DIR
set -eu
OUT=$1; shift
common="--target smollm2-135m-instruct --max-new-tokens 128 --dtype bfloat16 --threads 2 --methods $*"
echo "first3 $(date -u +%T)"; hf-spec bench $common --limit 3 --output-dir $OUT/first3
for skip in 6 9; do
  echo "heldout$skip $(date -u +%T)"; hf-spec bench $common --skip $skip --limit 3 --output-dir $OUT/heldout$skip
done
echo "code_edit $(date -u +%T)"; hf-spec bench $common --datasets code_edit --limit 4 --output-dir $OUT/code_edit
echo "BENCH DONE $(date -u +%T)"
