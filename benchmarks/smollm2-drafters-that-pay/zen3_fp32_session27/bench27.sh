#!/usr/bin/env bash
# Session 27 benches, one job at a time, each alone (float32 via --dtype auto on this Zen 3):
# 1. tuning prompts 3..5: does ngram_copy_from_datastore help HASS? (decides the default)
# 2. held-out prompts 6..8 and 9..11: the four shipped drafters, EAGLE-3 at their budget (issue #17), HASS with
#    datastore copy cycles, beside plain, prompt lookup and NGramDrafter + datastore
# 3. drafters alone (n-gram off, d4/k4/t8) on 6..8: EAGLE, HASS, EAGLE-3
set -eu
cd /work/main
D=drafters/smollm2-135m-instruct
[ -d runs/pub/e3-4ep ] || python training_scripts/publish_drafter.py runs/train/e3_4ep runs/pub/e3-4ep --command "bash runs/e3_4ep.sh" \
    --tree-from $D-hass --ngram-datastore $D-hass/ngram_datastore.safetensors > runs/publish_e3_4ep.log 2>&1
common="--target smollm2-135m-instruct --max-new-tokens 128 --dtype auto --threads 2"
OUT=benchmarks/smollm2-drafters-that-pay/zen3_fp32_session27
echo "tuning $(date -u +%T)"
hf-spec bench $common --methods plain hf_spec:ngram:datastore=$D-hass hf_spec:$D-hass hf_spec:runs/pub/hass-dscopy \
  --skip 3 --limit 3 --output-dir $OUT/tuning3
methods="plain prompt_lookup hf_spec:ngram:datastore=$D-hass hf_spec:$D-eagle hf_spec:$D-hass hf_spec:$D-coral
  hf_spec:$D-parallelspec hf_spec:runs/pub/e3-4ep hf_spec:runs/pub/hass-dscopy"
for skip in 6 9; do
  echo "heldout$skip $(date -u +%T)"
  hf-spec bench $common --methods $methods --skip $skip --limit 3 --output-dir $OUT/heldout$skip
done
echo "alone $(date -u +%T)"
hf-spec bench $common --tree-depth 4 --tree-top-k 4 --tree-total-tokens 8 --methods plain \
  hf_spec:$D-eagle:fixed_shape:ngram=0 hf_spec:$D-hass:fixed_shape:ngram=0 hf_spec:runs/pub/e3-4ep:fixed_shape:ngram=0 \
  --skip 6 --limit 3 --output-dir $OUT/heldout6_d4t8_no_ngram
echo "BENCH DONE $(date -u +%T)"
