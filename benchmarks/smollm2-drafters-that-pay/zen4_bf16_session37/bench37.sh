#!/bin/sh
# Session 37: scored n-gram trees vs session 36's, interleaved per prompt, alone on the machine (run from the repo root).
D=drafters/smollm2-135m-instruct-eagle
R=benchmarks/smollm2-drafters-that-pay/zen4_bf16_session37
python $R/ab_scored.py 58 5 plain=plain pl=pl before=before:none scored=ngram:none \
  before+ds=before:$D scored+ds=ngram:$D eagle=$D > $R/ab58.log 2>&1
# Second run: the hybrids' n-gram branches too (ranked by scored_trie since this commit; before_hybrid: session 36's).
P=drafters/smollm2-135m-instruct-parallelspec
python $R/ab_scored.py 64 5 plain=plain pl=pl before=before:none scored=ngram:none before+ds=before:$D scored+ds=ngram:$D \
  eagle_before=before_hybrid:$D eagle=$D ps_before=before_hybrid:$P ps=$P > $R/ab64.log 2>&1
# Third run, the committed code (b17039d), prompts 52..56 of the four sets.
python $R/ab_scored.py 52 5 plain=plain pl=pl before=before:none scored=ngram:none before+ds=before:$D scored+ds=ngram:$D \
  eagle_before=before_hybrid:$D eagle=$D ps_before=before_hybrid:$P ps=$P > $R/ab52.log 2>&1
# Fourth run: float32, where every arm writes plain's text (lossless), context only, prompts 64..67.
DTYPE=float32 python $R/ab_scored.py 64 4 plain=plain pl=pl before=before:none scored=ngram:none > $R/ab64_fp32.log 2>&1
