#!/usr/bin/env bash
# The pilot's 30 steps at lr 2e-3 instead of 5e-4 (labels cache reused): does a higher LoRA lr learn faster?
set -eu
cd /work/main
OUT=runs/s2d_lr2e3
OMP_NUM_THREADS=2 python training_scripts/train_s2d.py --source_model qwen2.5-coder-0.5b-instruct --num_layers 8 \
  --exits 4 6 8 --dataset sharegpt --limit 240 --max_length 512 --distill_from qwen2.5-coder-0.5b-instruct \
  --teacher_dtype bfloat16 --labels_cache runs/s2d_pilot/teacher_labels --draft_vocab_size 16384 --lora_rank 16 \
  --num_train_epochs 1 --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --learning_rate 2e-3 \
  --warmup_ratio 0.05 --use_cpu --logging_steps 5 --save_steps 10 --save_total_limit 2 --report_to none \
  --targets qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct --output_dir $OUT
echo "exit accuracy $(date -u +%T)"
python runs/prof/s2d_exit_acc.py 240 20 $OUT > runs/s2d_lr_acc.log 2>&1
echo "S2D LR DONE $(date -u +%T)"
