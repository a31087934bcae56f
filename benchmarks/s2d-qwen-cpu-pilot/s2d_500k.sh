#!/usr/bin/env bash
# Issue #16, the next step of benchmarks/s2d-qwen-cpu-pilot: the pilot's recipe at lr 2e-3 on ~480k labelled (1,000 conversations; its label shards are the first 4 of the 2,000-row run) tokens
# (<= 512 tokens each; labels ~250 tok/s, training ~300 tok/s on Zen 4: ~1 h). Resumable:
# the teacher labels by chunk (--labels_cache), training from its last Trainer checkpoint.
set -eu
cd /work/main
OUT=runs/s2d_500k
if [ ! -f $OUT/DONE ]; then
  echo "train $(date -u +%T)"
  OMP_NUM_THREADS=2 python training_scripts/train_s2d.py --source_model qwen2.5-coder-0.5b-instruct --num_layers 8 \
    --exits 4 6 8 --dataset sharegpt --limit 1000 --max_length 512 --distill_from qwen2.5-coder-0.5b-instruct \
    --teacher_dtype bfloat16 --labels_cache runs/s2d_1m-labels --draft_vocab_size 16384 --lora_rank 16 \
    --num_train_epochs 1 --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --learning_rate 2e-3 \
    --warmup_ratio 0.05 --use_cpu --logging_steps 10 --save_steps 25 --save_total_limit 2 --report_to none \
    --targets qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct --output_dir $OUT
  touch $OUT/DONE
fi
echo "exit accuracy $(date -u +%T)"
python benchmarks/s2d-qwen-cpu-pilot/s2d_exit_acc.py 2000 20 runs/s2d_lr2e3 $OUT > runs/s2d_500k_acc.log 2>&1
echo "S2D 500k DONE $(date -u +%T)"
