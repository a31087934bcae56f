#!/usr/bin/env bash
# Session 33: the issue-#13/#14 bench, on the first 3 prompts of
# each set (the issues' run), on 30 held-out prompts (20..29 of each set: never used for tuning or for choosing a
# default; twice session 32's 15) and on the 4 code edits. All shipped SmolLM2 drafters, the weightless NGramDrafter
# (context only, and + the shipped datastore) and CORAL alone (n-gram off, no datastore: the hybrid's drafter part).
# bf16, 2 threads, T=0, 128 new tokens, methods interleaved per prompt. Run alone. As run: OUT=runs/bench34 with the
# session-32 defaults (before_match_cycles/), then OUT=runs/bench35 REPEAT_FIRST3=1 with match cycles (the record).
set -eu
cd /work/main
D=drafters/smollm2-135m-instruct
M="plain prompt_lookup hf_spec:$D-eagle hf_spec:$D-hass hf_spec:$D-coral hf_spec:$D-parallelspec hf_spec:ngram
   hf_spec:ngram:datastore=$D-eagle hf_spec:$D-coral:ngram=0:no_datastore"
common="--target smollm2-135m-instruct --max-new-tokens 128 --dtype bfloat16 --threads 2 --methods $M"
OUT=${OUT:-benchmarks/smollm2-drafters-that-pay/zen4_bf16_session33}
echo "first3 $(date -u +%T)"; hf-spec bench $common --limit 3 --output-dir $OUT/first3
echo "heldout20 $(date -u +%T)"; hf-spec bench $common --skip 20 --limit 10 --output-dir $OUT/heldout20
echo "code_edit $(date -u +%T)"; hf-spec bench $common --datasets code_edit --limit 4 --output-dir $OUT/code_edit
if [ -n "${REPEAT_FIRST3:-}" ]; then  # the issue's run twice more: its 9 prompts' timings are noisy
  for r in 2 3; do echo "first3 run $r $(date -u +%T)"; hf-spec bench $common --limit 3 --output-dir $OUT/first3_run$r; done
fi
echo "BENCH DONE $(date -u +%T)"
