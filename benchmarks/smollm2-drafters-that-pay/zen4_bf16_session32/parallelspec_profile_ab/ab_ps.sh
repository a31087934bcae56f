#!/usr/bin/env bash
# ParallelSpec: run-time shape chosen from the robust cost curve (format 2) vs the shape the old noisy profile chose
# (16 n-gram nodes), held-out prompts 15..19, alone.
set -eu
cd /work/main
P=drafters/smollm2-135m-instruct-parallelspec
hf-spec bench --target smollm2-135m-instruct --max-new-tokens 128 --dtype bfloat16 --threads 2 --skip 15 --limit 5 \
  --methods plain prompt_lookup hf_spec:$P hf_spec:$P:ngram=16 --output-dir runs/ds33/ab_ps
echo "AB_PS DONE $(date -u +%T)"
