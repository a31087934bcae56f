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
# the four ranges (as run, the same hf-spec bench calls inline; since session 30 in benchmarks/bench_ranges.sh)
benchmarks/bench_ranges.sh $OUT $methods
