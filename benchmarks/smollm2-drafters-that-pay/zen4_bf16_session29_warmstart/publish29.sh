#!/usr/bin/env bash
# Session 29: publish the warm-started drafters to runs/pub29 (shape candidates, n-gram settings and datastore of
# the shipped folders kept) for the side-by-side bench; drafters/ is replaced only if they measure faster.
set -eu
cd /work/main
D=drafters/smollm2-135m-instruct
for method in ${METHODS:-eagle hass parallelspec coral}; do
  [ -f runs/train29/$method/DONE ] || continue
  python training_scripts/publish_drafter.py runs/train29/$method runs/pub29/smollm2-135m-instruct-$method \
    --tree-from $D-$method --ngram-datastore $D-$method/ngram_datastore.safetensors \
    --command "training_scripts/recipes/smollm2_drafters.sh, then warm-started for 1 epoch on 3,200 new turns (drafters/README.md)"
done
