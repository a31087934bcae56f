#!/usr/bin/env bash
# Session 30: does capacity help? The shipped EAGLE grown to 2 decoder layers (the new layer's residual branches start
# at zero, so it starts as the shipped drafter: hf_spec.training.pipeline.grow_layers), one epoch on the 3,200
# self-distilled turns of session 29 (runs/features/smollm2-sharegpt-next3200, none of the shipped drafter's data),
# the recipe's lr 5e-4 / 20 warmup steps, batch 8, bf16 autocast, 2 threads. Then published beside the shipped one
# with the shipped folder's shape candidates, n-gram settings and datastore, so only the weights differ.
set -eu
cd /work/main
D=drafters/smollm2-135m-instruct
out=runs/train30/eagle2
if [ ! -f $out/DONE ]; then
  echo "train start $(date -u +%T)"
  OMP_NUM_THREADS=2 python training_scripts/train_eagle.py --target_model smollm2-135m-instruct --dataset sharegpt \
    --feature_cache runs/features/smollm2-sharegpt-next3200 --max_length 512 --num_train_epochs 1 \
    --per_device_train_batch_size 8 --learning_rate 5e-4 --warmup_steps 20 --bf16 --use_cpu --logging_steps 10 \
    --save_steps 50 --save_total_limit 2 --report_to none --init_drafter $D-eagle --num_layers 2 --output_dir $out
  touch $out/DONE
  echo "train done $(date -u +%T)"
fi
python training_scripts/publish_drafter.py $out runs/pub30/smollm2-135m-instruct-eagle2 --tree-from $D-eagle \
  --ngram-datastore $D-eagle/ngram_datastore.safetensors \
  --command "training_scripts/recipes/smollm2_drafters.sh, then grown to 2 layers and trained 1 epoch on 3,200 new turns (benchmarks/eagle_two_layers)"
