#!/usr/bin/env bash
# The continued HASS drafter beside the shipped one, on prompts never used for tuning (6..8 and 9..11 of each set).
set -eu
cd /work/main
NEW=${NEW:-runs/pub/smollm2-135m-instruct-hass-ft}
OLD=drafters/smollm2-135m-instruct-hass
methods="plain prompt_lookup hf_spec:ngram:datastore=$OLD hf_spec:ngram:datastore=$NEW hf_spec:$OLD hf_spec:$NEW"
common="--target smollm2-135m-instruct --max-new-tokens 128 --dtype auto --threads 2 --methods $methods"
hf-spec bench $common --skip 6 --limit 3 --output-dir ${OUT:-runs/bench_ft}/heldout6
hf-spec bench $common --skip 9 --limit 3 --output-dir ${OUT:-runs/bench_ft}/heldout9
echo BENCH DONE
