#!/usr/bin/env bash
# Session 29 (Zen 4, AVX512-BF16): the warm-started drafters (runs/pub29/*) beside the shipped ones, issue #13's
# settings, alone, one job at a time.
set -eu
cd /work/main
D=drafters/smollm2-135m-instruct
N=runs/pub29/smollm2-135m-instruct
OUT=${OUT:-benchmarks/smollm2-drafters-that-pay/zen4_bf16_session29_warmstart}  # as run: runs/bench29, copied here
methods="plain prompt_lookup hf_spec:$N-eagle hf_spec:$N-hass hf_spec:$N-coral
  hf_spec:$D-eagle hf_spec:$D-hass hf_spec:$D-coral"
common="--target smollm2-135m-instruct --max-new-tokens 128 --dtype bfloat16 --threads 2"
echo "first3 $(date -u +%T)"; hf-spec bench $common --methods $methods --limit 3 --output-dir $OUT/first3
for skip in 6 9; do
  echo "heldout$skip $(date -u +%T)"; hf-spec bench $common --methods $methods --skip $skip --limit 3 --output-dir $OUT/heldout$skip
done
echo "code_edit $(date -u +%T)"; hf-spec bench $common --methods $methods --datasets code_edit --limit 4 --output-dir $OUT/code_edit
echo "BENCH DONE $(date -u +%T)"
