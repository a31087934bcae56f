#!/usr/bin/env bash
# EAGLE-3 at the shipped drafters' training budget (issue #17): the equal-data pilot (1 epoch over runs/features/distill-extra,
# 204 steps) resumed from its checkpoint-204 to 4 epochs = 816 steps of 8 turns (~1.3M loss tokens), against the shipped
# drafters' 800 steps of 8 turns (2 epochs over 3,200 turns, ~1.29M loss tokens). Half the unique turns (1,631): stated.
set -eu
cd /work/main
OMP_NUM_THREADS=2 python training_scripts/train_eagle3.py --target_model smollm2-135m-instruct \
  --feature_cache runs/features/distill-extra --max_length 512 --num_train_epochs 4 --per_device_train_batch_size 8 \
  --learning_rate 5e-4 --warmup_steps 20 --use_cpu --logging_steps 10 --save_steps 50 --save_total_limit 2 \
  --report_to none --hass_steps 3 --output_dir runs/train/e3_4ep > runs/train_e3_4ep.log 2>&1
touch runs/train/e3_4ep/DONE
