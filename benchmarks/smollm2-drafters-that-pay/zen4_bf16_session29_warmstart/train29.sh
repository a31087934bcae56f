#!/usr/bin/env bash
# Session 29: warm-start each shipped SmolLM2 drafter for one epoch on 3,200 newly self-distilled ShareGPT first
# turns (usable prompts 3,200..6,399 of the recipe's shuffled order: none of the shipped drafters' 3,200), lr 2e-4
# (the HASS pilot of benchmarks/teacher_forced_accuracy: +1.6-2.0 points top-1 at every step).
set -eu
cd /work/main
CACHE=runs/features/smollm2-sharegpt-next3200
D=drafters/smollm2-135m-instruct
COMMON="--target_model smollm2-135m-instruct --dataset sharegpt --feature_cache $CACHE --max_length 512
  --num_train_epochs 1 --per_device_train_batch_size 8 --learning_rate 2e-4 --warmup_steps 10 --bf16 --use_cpu
  --logging_steps 10 --save_steps 50 --save_total_limit 2 --report_to none"
for method in ${METHODS:-eagle hass parallelspec coral}; do
  out=runs/train29/$method
  [ -f $out/DONE ] && continue
  case $method in
    coral) extra="--w_csra 0.05 --router_max_steps 60" ;;
    parallelspec) extra="--gradient_accumulation_steps 1" ;;
    *) extra="" ;;
  esac
  echo "$method start $(date -u +%T)"
  OMP_NUM_THREADS=2 python training_scripts/train_$method.py $COMMON --init_drafter $D-$method --output_dir $out $extra \
    && touch $out/DONE
  echo "$method done $(date -u +%T)"
done
