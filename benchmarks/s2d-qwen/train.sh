#!/usr/bin/env bash
# Issue #16, frozen-backbone recipe: all 24 layers of Qwen2.5-Coder-0.5B, exits 8/16/24, per-exit adapters
# distilled from the last exit (= the 0.5B), 16k draft vocabulary, 1,000 ShareGPT rows (476,593 positions), 1 epoch.
# Resumable (Trainer checkpoints every 25 steps; the labels cache is complete).
set -eu
cd /work/main
OUT=runs/s2d_exits
if [ ! -f $OUT/DONE ]; then
  echo "train $(date -u +%T)"
  OMP_NUM_THREADS=2 python training_scripts/train_s2d.py --source_model qwen2.5-coder-0.5b-instruct --num_layers 24 \
    --exits 8 16 24 --exit_adapters --dataset sharegpt --limit 1000 --max_length 512 \
    --distill_from qwen2.5-coder-0.5b-instruct --teacher_dtype bfloat16 --labels_cache runs/s2d_1m-labels \
    --draft_vocab_size 16384 --num_train_epochs 1 --per_device_train_batch_size 4 --gradient_accumulation_steps 1 \
    --learning_rate 1e-3 --warmup_ratio 0.05 --use_cpu --logging_steps 10 --save_steps 25 --save_total_limit 2 \
    --report_to none --targets qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct --output_dir $OUT
  touch $OUT/DONE
fi
echo "S2D exits DONE $(date -u +%T)"
