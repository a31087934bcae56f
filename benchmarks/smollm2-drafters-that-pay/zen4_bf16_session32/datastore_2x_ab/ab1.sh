#!/usr/bin/env bash
# A/B on tuning prompts 3..5: shipped datastore (649k tokens) vs 2x (1.30M tokens), drafter and weightless.
set -eu
cd /work/main
E=drafters/smollm2-135m-instruct-eagle; B=runs/ds33/eagle-ds2
hf-spec bench --target smollm2-135m-instruct --max-new-tokens 128 --dtype bfloat16 --threads 2 --skip 3 --limit 3 \
  --methods plain prompt_lookup hf_spec:$E hf_spec:$B hf_spec:ngram:datastore=$E hf_spec:ngram:datastore=$B \
  --output-dir runs/ds33/ab1
echo "AB1 DONE $(date -u +%T)"
