#!/usr/bin/env bash
# The two S2D drafters of Qwen2.5-Coder-0.5B, trained on the same 1,000 ShareGPT conversations (<= 512 tokens,
# 476,593 positions labelled with the 0.5B's own greedy next token, bf16), 16k draft vocabulary, batches of 4,
# lr 1e-3. Resumable: Trainer checkpoints, and the teacher labels are cached in shards.
#   sorted (S2D's recipe): the first 8 layers, exits after 4 / 6 / 8 trained jointly by the sorted loss (mean CE over
#     the exits, one shared head), LoRA rank 64 on every linear map of the 8 layers (full fine-tuning would ship the
#     8 layers, ~240 MB in bf16, against ~24 MB of adapters), two epochs; the last 32 conversations held out for
#     the curves (each exit's top-1 every 50 steps) -> runs/s2d-sorted-r64
#   (one epoch at LoRA rank 16, the first shipped version: runs/s2d-sorted)
#   exit adapters (frozen backbone): all 24 layers, exits after 8 / 16 / 24, one linear map + norm per early exit,
#     distilled from the last exit (the 0.5B itself) -> runs/s2d_exits (the shipped qwen2.5-coder-instruct-s2d)
# Usage: bash benchmarks/s2d-qwen/train.sh [sorted|exits ...] (default: both). One CPU job at a time.
set -eu
cd "$(dirname "$0")/../.."
common="--source_model qwen2.5-coder-0.5b-instruct --dataset sharegpt --limit 1000 --max_length 512
  --distill_from qwen2.5-coder-0.5b-instruct --teacher_dtype bfloat16 --labels_cache runs/s2d-labels
  --draft_vocab_size 16384 --per_device_train_batch_size 4 --gradient_accumulation_steps 1
  --learning_rate 1e-3 --use_cpu --report_to none --save_total_limit 2
  --targets qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct"
for variant in ${@:-sorted exits}; do
  case $variant in
    sorted) python training_scripts/train_s2d.py $common --num_layers 8 --exits 4 6 8 --lora_rank 64 \
              --num_train_epochs 2 --lr_scheduler_type cosine --warmup_steps 20 --logging_steps 5 --save_steps 50 \
              --eval_examples 32 --eval_strategy steps --eval_steps 50 --output_dir runs/s2d-sorted-r64 ;;
    exits) python training_scripts/train_s2d.py $common --num_layers 24 --exits 8 16 24 --exit_adapters \
              --num_train_epochs 1 --warmup_ratio 0.05 --logging_steps 10 --save_steps 25 --output_dir runs/s2d_exits ;;
    *) echo "unknown variant $variant (sorted | exits)"; exit 2 ;;
  esac
done
