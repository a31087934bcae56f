#!/usr/bin/env bash
# Continue the shipped HASS drafter on newly self-distilled answers (float32 target on this CPU), then teacher-forced
# accuracy on the held-out cache.
set -eu
cd /work/main
OMP_NUM_THREADS=2 python training_scripts/train_hass.py --target_model smollm2-135m-instruct \
  --feature_cache runs/features/distill-extra --max_length 512 --num_train_epochs 1 --per_device_train_batch_size 8 \
  --learning_rate 2e-4 --warmup_steps 10 --use_cpu --logging_steps 10 --save_steps 40 --save_total_limit 2 \
  --report_to none --init_drafter drafters/smollm2-135m-instruct-hass --output_dir runs/train/hass_ft_sd \
  > runs/train_hass_ft_sd.log 2>&1
PYTHONPATH=. OMP_NUM_THREADS=2 python benchmarks/teacher_forced_accuracy/tf_acc.py runs/features/tfacc-heldout_sharegpt_4200 \
  runs/train/hass_ft_sd 2>&1 | grep -v Loading > runs/tfacc_ft_sd.log
echo FT DONE >> runs/tfacc_ft_sd.log
