#!/usr/bin/env bash
# Session 36: the issue-#14 verdict run on prompts that no earlier run used (every range any record used for a
# decision or a report was left out: 0..37, 40..51, 54..57, 64..79, 90..110): MT-bench 38, 39, 52, 53, 58..63 (its
# last 10 unused), the same numbers of HumanEval, GSM8K and the code edits, and 80..85 of HumanEval, GSM8K and the
# code edits. With session 35's fresh 64..69 (same code) that is 16 prompts a data set (22 for three of them).
# Every method timed twice per prompt (--repeats 2, fastest kept), interleaved per prompt; bf16, 2 threads, T=0,
# 128 new tokens. The drafters alone (:ngram=0, the hybrids' other part) run on 58..63 only. Run alone.
set -eu
cd /work/main
D=drafters/smollm2-135m-instruct
M="plain prompt_lookup hf_spec:$D-eagle hf_spec:$D-hass hf_spec:$D-coral hf_spec:$D-parallelspec hf_spec:ngram
   hf_spec:ngram:datastore=$D-eagle"
ALONE="hf_spec:$D-eagle:ngram=0 hf_spec:$D-hass:ngram=0 hf_spec:$D-coral:ngram=0 hf_spec:$D-parallelspec:ngram=0"
common="--target smollm2-135m-instruct --max-new-tokens 128 --dtype bfloat16 --threads 2 --repeats 2"
ALL="--datasets mt_bench humaneval gsm8k code_edit"
OUT=${OUT:-benchmarks/smollm2-drafters-that-pay/zen4_bf16_session36}
echo "p58 $(date -u +%T)"; hf-spec bench $common --methods $M $ALONE $ALL --skip 58 --limit 6 --output-dir $OUT/p58
echo "p52 $(date -u +%T)"; hf-spec bench $common --methods $M $ALL --skip 52 --limit 2 --output-dir $OUT/p52
echo "p38 $(date -u +%T)"; hf-spec bench $common --methods $M $ALL --skip 38 --limit 2 --output-dir $OUT/p38
echo "p80 $(date -u +%T)"; hf-spec bench $common --methods $M --datasets humaneval gsm8k code_edit --skip 80 --limit 6 \
    --output-dir $OUT/p80
echo "BENCH DONE $(date -u +%T)"
