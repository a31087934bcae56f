#!/usr/bin/env bash
# Does keeping freed memory in the process (glibc malloc settings) speed up drafter training on a CPU?
# Times the recipe's EAGLE and ParallelSpec training steps (training_scripts/recipes/smollm2_drafters.sh settings,
# its feature cache) with glibc's default malloc and with MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=64 GiB,
# alternating, each run in a fresh output folder; prints seconds per step and the share of CPU time spent in the
# kernel. Usage: bash benchmarks/cpu_training_memory/run.sh [OUT_DIR]   (run it alone: it is a timing)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-/tmp/cpu_training_memory}
CACHE=${CACHE:-runs/features/smollm2-sharegpt-distill}
mkdir -p "$OUT"
COMMON="--target_model smollm2-135m-instruct --dataset sharegpt --feature_cache $CACHE --max_length 512
  --per_device_train_batch_size 8 --learning_rate 5e-4 --warmup_steps 20 --bf16 --use_cpu --logging_steps 10
  --save_strategy no --eval_strategy no --report_to none --eval_examples 128"
run() {  # method steps mode
  local dir="$OUT/$1_$3"
  rm -rf "$dir"
  local malloc=()
  [ "$3" = keep ] && malloc=(MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736)
  local extra=""
  [ "$1" = parallelspec ] && extra="--gradient_accumulation_steps 1"
  /usr/bin/time -f "%e %U %S" -o "$dir.time" env "${malloc[@]}" OMP_NUM_THREADS=2 \
    python training_scripts/train_$1.py $COMMON --max_steps "$2" --output_dir "$dir" $extra > "$dir.log" 2>&1
  python - "$dir" "$1" "$3" "$2" <<'PY'
import json, sys
d, method, mode, steps = sys.argv[1:]
s = json.load(open(f"{d}/training_summary.json"))
wall, user, kernel = map(float, open(f"{d}.time").read().split()[-3:])
print(json.dumps({"method": method, "malloc": mode, "steps": int(steps), "train_runtime_s": s["train_runtime_s"],
                  "s_per_step": round(s["train_runtime_s"] / int(steps), 3),
                  "kernel_share_of_cpu": round(kernel / (user + kernel), 3), "process_wall_s": wall}))
PY
}
for round in 1 2; do
  for mode in default keep; do
    run eagle 40 $mode | tee -a "$OUT/results.jsonl"
    run parallelspec 20 $mode | tee -a "$OUT/results.jsonl"
  done
done
