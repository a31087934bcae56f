#!/usr/bin/env bash
# Session 35: the issue-#14 bench after the context-first n-gram ranking and HASS's re-measured shape candidates, on
# 24 prompts never used before (64..69 of MT-bench, HumanEval, GSM8K and the code edits) and on the first 3 of each
# set + the first 3 code edits (the run), each method timed twice per prompt (--repeats 2, fastest kept).
# All shipped SmolLM2 drafters, the weightless NGramDrafter (context only, and + the shipped datastore), prompt lookup,
# plain. bf16, 2 threads, T=0, 128 new tokens, methods interleaved per prompt. Run alone.
set -eu
cd /work/main
D=drafters/smollm2-135m-instruct
M="plain prompt_lookup hf_spec:$D-eagle hf_spec:$D-hass hf_spec:$D-coral hf_spec:$D-parallelspec hf_spec:ngram
   hf_spec:ngram:datastore=$D-eagle"
common="--target smollm2-135m-instruct --max-new-tokens 128 --dtype bfloat16 --threads 2 --repeats 2 --methods $M
        --datasets mt_bench humaneval gsm8k code_edit"
OUT=${OUT:-benchmarks/smollm2-drafters-that-pay/zen4_bf16_session35}
echo "fresh64 $(date -u +%T)"; hf-spec bench $common --skip 64 --limit 6 --output-dir $OUT/fresh64
echo "first3 $(date -u +%T)"; hf-spec bench $common --limit 3 --output-dir $OUT/first3
echo "BENCH DONE $(date -u +%T)"
