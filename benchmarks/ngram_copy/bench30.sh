#!/usr/bin/env bash
# Session 30 (issue #14): NGramDrafter with copy cycles (copy=N: a cycle whose context repeats its whole 4-token
# suffix drafts up to N nodes, to depth N) beside the default NGramDrafter (8 nodes, depth 8) and transformers'
# prompt lookup, issue #13/#14 settings (SmolLM2-135M-Instruct, bf16, 2 threads, T=0, 128 new tokens), alone.
set -eu
cd /work/main
OUT=${OUT:-benchmarks/ngram_copy}
methods="plain prompt_lookup hf_spec:ngram hf_spec:ngram:copy=16 hf_spec:ngram:copy=24"
common="--target smollm2-135m-instruct --max-new-tokens 128 --dtype bfloat16 --threads 2"
echo "first3 $(date -u +%T)"; hf-spec bench $common --methods $methods --limit 3 --output-dir $OUT/first3
for skip in 6 9; do
  echo "heldout$skip $(date -u +%T)"; hf-spec bench $common --methods $methods --skip $skip --limit 3 --output-dir $OUT/heldout$skip
done
echo "code_edit $(date -u +%T)"; hf-spec bench $common --methods $methods --datasets code_edit --limit 4 --output-dir $OUT/code_edit
echo "BENCH DONE $(date -u +%T)"
