#!/usr/bin/env bash
# Session 30 (issue #14): NGramDrafter with copy cycles (copy=N: a cycle whose context repeats its whole 4-token
# suffix drafts up to N nodes, to depth N) beside the default NGramDrafter (8 nodes, depth 8) and transformers'
# prompt lookup, issue #13/#14 settings (benchmarks/bench_ranges.sh), alone. As run: OUT=runs/ngram30, copied here.
set -eu
cd /work/main
benchmarks/bench_ranges.sh ${OUT:-benchmarks/ngram_copy} plain prompt_lookup hf_spec:ngram hf_spec:ngram:copy=16 hf_spec:ngram:copy=24
