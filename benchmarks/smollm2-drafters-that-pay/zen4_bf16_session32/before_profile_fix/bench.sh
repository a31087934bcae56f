#!/usr/bin/env bash
# Session 32: the issue-#13/#14 bench on the first 3 prompts of each set (the run) and on a larger held-out
# range never used for tuning or choosing (prompts 15..19 of each set), all shipped SmolLM2 drafters + anchors. Alone.
set -eu
cd /work/main
D=drafters/smollm2-135m-instruct
M="plain prompt_lookup hf_spec:$D-eagle hf_spec:$D-hass hf_spec:$D-coral hf_spec:$D-parallelspec hf_spec:ngram hf_spec:ngram:datastore=$D-eagle"
common="--target smollm2-135m-instruct --max-new-tokens 128 --dtype bfloat16 --threads 2 --methods $M"
OUT=${OUT:-runs/bench33}  # as run; its results are copied to before_profile_fix/
echo "first3 $(date -u +%T)"; hf-spec bench $common --limit 3 --output-dir $OUT/first3
echo "heldout15 $(date -u +%T)"; hf-spec bench $common --skip 15 --limit 5 --output-dir $OUT/heldout15
echo "BENCH DONE $(date -u +%T)"
