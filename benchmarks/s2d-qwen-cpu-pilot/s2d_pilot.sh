#!/usr/bin/env bash
# S2D pilot (issue #16) on this Zen 4 (AVX512-BF16), bf16: one sorted drafter from Qwen2.5-Coder-0.5B's first 8 layers
# (exits 4/6/8), LoRA r16 + exit norm, 16k draft vocabulary, self-distilled labels from the 0.5B (bf16), then
# per-target thresholds on held-aside prompts and a bench on both targets beside plain, prompt lookup, assisted 0.5B
# and the fixed exits. Resumable: train_s2d resumes from checkpoints and the labels cache.
set -eu
cd /work/main
OUT=runs/s2d_pilot
REC=benchmarks/s2d-qwen-cpu-pilot
mkdir -p $REC
[ -f $REC/forward_ms.json ] || { echo "forward costs $(date -u +%T)"; python runs/prof/qfwd.py $REC/forward_ms.json; }
if [ ! -f $OUT/DONE ]; then
  echo "train $(date -u +%T)"
  OMP_NUM_THREADS=2 python training_scripts/train_s2d.py --source_model qwen2.5-coder-0.5b-instruct --num_layers 8 \
    --exits 4 6 8 --dataset sharegpt --limit ${LIMIT:-240} --max_length 512 --distill_from qwen2.5-coder-0.5b-instruct \
    --teacher_dtype bfloat16 --draft_vocab_size 16384 --lora_rank 16 --num_train_epochs 1 \
    --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --learning_rate 5e-4 --warmup_ratio 0.05 \
    --use_cpu --logging_steps 5 --save_steps 10 --save_total_limit 2 --report_to none \
    --targets qwen2.5-coder-1.5b-instruct qwen2.5-coder-0.5b-instruct --output_dir $OUT
  touch $OUT/DONE
fi
echo "thresholds $(date -u +%T)"
python training_scripts/search_s2d_thresholds.py --drafter $OUT --targets qwen2.5-coder-1.5b-instruct \
  qwen2.5-coder-0.5b-instruct --offset 10 --per-dataset 1 --max-new-tokens 32 --grid 0.0 0.6 0.8 1.01 \
  --threads 2 --out $REC/thresholds.json
common="--max-new-tokens 64 --dtype bfloat16 --threads 2 --skip 6 --limit 2"
echo "bench 1.5B $(date -u +%T)"
hf-spec bench --target qwen2.5-coder-1.5b-instruct $common --methods plain prompt_lookup \
  assisted:qwen2.5-coder-0.5b-instruct hf_spec:$OUT hf_spec:$OUT:exit=4 hf_spec:$OUT:exit=6 hf_spec:$OUT:exit=8 \
  --output-dir $REC/qwen1.5b
echo "bench 0.5B $(date -u +%T)"
hf-spec bench --target qwen2.5-coder-0.5b-instruct $common --methods plain prompt_lookup \
  hf_spec:$OUT hf_spec:$OUT:exit=4 hf_spec:$OUT:exit=6 hf_spec:$OUT:exit=8 --output-dir $REC/qwen0.5b
echo "S2D PILOT DONE $(date -u +%T)"
