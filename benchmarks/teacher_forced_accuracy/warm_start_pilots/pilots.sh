#!/usr/bin/env bash
# Warm-start pilots from the shipped HASS drafter on human-written ShareGPT answers (features of the fp32 target):
# A = same objective, B = EAGLE-3-like weights (w_reg 0.1, w_cls 1.0), C = grown to 2 layers. Each runs to
# checkpoint-$STOP of a 1-epoch schedule (then is killed: the winner resumes from there), then teacher-forced
# accuracy on the held-out self-distilled cache.
set -u
cd /work/main
CACHE=${CACHE:-runs/features/human-2560}
STOP=${STOP:-80}
COMMON="--target_model smollm2-135m-instruct --feature_cache $CACHE --max_length 512 --num_train_epochs 1
  --per_device_train_batch_size 8 --learning_rate 5e-4 --warmup_steps 20 --use_cpu --logging_steps 10
  --save_steps 40 --save_total_limit 3 --report_to none --init_drafter drafters/smollm2-135m-instruct-hass"
for spec in "A:" "B:--w_reg 0.1 --w_cls 1.0" "C:--num_layers 2"; do
  name=${spec%%:*}; extra=${spec#*:}
  out=runs/train/hass_ft_$name
  if [ ! -f $out/checkpoint-$STOP/trainer_state.json ]; then
    OMP_NUM_THREADS=2 python training_scripts/train_hass.py $COMMON --output_dir $out $extra > runs/train_hass_ft_$name.log 2>&1 &
    pid=$!
    until [ -f $out/checkpoint-$STOP/trainer_state.json ] || ! kill -0 $pid 2>/dev/null; do sleep 5; done
    sleep 3; kill $pid 2>/dev/null; wait $pid 2>/dev/null
  fi
  echo "== pilot $name ($extra) at step $STOP" >> runs/pilots.log
  PYTHONPATH=. OMP_NUM_THREADS=2 python benchmarks/teacher_forced_accuracy/tf_acc.py runs/features/tfacc-heldout_sharegpt_4200 \
    $out/checkpoint-$STOP 2>&1 | grep -v Loading >> runs/pilots.log
done
echo PILOTS DONE >> runs/pilots.log
