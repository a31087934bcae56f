#!/usr/bin/env bash
# Session 28 (Zen 4, AVX512-BF16): issue #13's bench in bf16, alone, one job at a time.
set -eu
cd /work/main
D=drafters/smollm2-135m-instruct
OUT=benchmarks/smollm2-drafters-that-pay/zen4_bf16_session28
methods="plain prompt_lookup hf_spec:ngram hf_spec:ngram:datastore=$D-hass hf_spec:$D-eagle hf_spec:$D-hass
  hf_spec:$D-coral hf_spec:$D-parallelspec"
common="--target smollm2-135m-instruct --max-new-tokens 128 --dtype bfloat16 --threads 2"
# the four ranges (as run, the same hf-spec bench calls inline; since session 30 in benchmarks/bench_ranges.sh)
benchmarks/bench_ranges.sh $OUT $methods
echo "papers $(date -u +%T)"
hf-spec bench $common --methods plain prompt_lookup hf_spec:$D-eagle:ngram=0 hf_spec:$D-hass:ngram=0 hf_spec:$D-coral:ngram=0 \
  hf_spec:$D-coral:no_router:ngram=0 hf_spec:$D-parallelspec:ngram=0 --skip 6 --limit 3 --output-dir $OUT/papers_heldout6
echo "BENCH DONE $(date -u +%T)"
