#!/usr/bin/env bash
# Session 32: issue #13/#14 bench with the format-2 cost profiles (verification curve of 7 rounds, non-decreasing):
# the first 3 prompts of MT-bench/HumanEval/GSM8K (the issues' run), held-out prompts 15..19 of each set (never used
# for tuning or for choosing a default) and 4 code edits; all shipped SmolLM2 drafters, the weightless NGramDrafter
# (context only, and + the shipped datastore) and CORAL alone (n-gram off, no datastore: the hybrid's drafter part).
# bf16, 2 threads, T=0, 128 new tokens, methods interleaved per prompt. Run alone. As run: OUT=runs/bench32.
set -eu
cd /work/main
D=drafters/smollm2-135m-instruct
M="plain prompt_lookup hf_spec:$D-eagle hf_spec:$D-hass hf_spec:$D-coral hf_spec:$D-parallelspec hf_spec:ngram
   hf_spec:ngram:datastore=$D-eagle hf_spec:$D-coral:ngram=0:no_datastore"
common="--target smollm2-135m-instruct --max-new-tokens 128 --dtype bfloat16 --threads 2 --methods $M"
OUT=${OUT:-benchmarks/smollm2-drafters-that-pay/zen4_bf16_session32}
echo "first3 $(date -u +%T)"; hf-spec bench $common --limit 3 --output-dir $OUT/first3
echo "heldout15 $(date -u +%T)"; hf-spec bench $common --skip 15 --limit 5 --output-dir $OUT/heldout15
echo "code_edit $(date -u +%T)"; hf-spec bench $common --datasets code_edit --limit 4 --output-dir $OUT/code_edit
echo "BENCH DONE $(date -u +%T)"
