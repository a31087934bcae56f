#!/usr/bin/env bash
# Same recipe as s2d_pilot.sh, 3 epochs (90 steps) over the same 240 labelled conversations (labels cache reused):
# does held-aside exit accuracy keep rising with steps? Then a short 1.5B bench.
set -eu
cd /work/main
OUT=runs/s2d_3ep
REC=benchmarks/s2d-qwen-cpu-pilot
if [ ! -f $OUT/DONE ]; then
  echo "train $(date -u +%T)"
  OMP_NUM_THREADS=2 python training_scripts/train_s2d.py --source_model qwen2.5-coder-0.5b-instruct --num_layers 8 \
    --exits 4 6 8 --dataset sharegpt --limit 240 --max_length 512 --distill_from qwen2.5-coder-0.5b-instruct \
    --teacher_dtype bfloat16 --labels_cache runs/s2d_pilot/teacher_labels --draft_vocab_size 16384 --lora_rank 16 \
    --num_train_epochs 3 --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --learning_rate 5e-4 \
    --warmup_ratio 0.05 --use_cpu --logging_steps 5 --save_steps 10 --save_total_limit 2 --report_to none \
    --targets qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct --output_dir $OUT
  touch $OUT/DONE
fi
echo "exit accuracy $(date -u +%T)"
python runs/prof/s2d_exit_acc.py 240 20 runs/s2d_pilot $OUT > $REC/exit_accuracy.log 2>&1  # its final JSON is exit_accuracy.json
echo "bench 1.5B $(date -u +%T)"
hf-spec bench --target qwen2.5-coder-1.5b-instruct --max-new-tokens 64 --dtype bfloat16 --threads 2 --skip 6 --limit 2 \
  --methods plain prompt_lookup assisted:qwen2.5-coder-0.5b-instruct hf_spec:$OUT:exit=4 hf_spec:$OUT:exit=8 \
  --output-dir $REC/qwen1.5b_3ep
echo "S2D 3EP DONE $(date -u +%T)"
