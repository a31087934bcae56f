#!/usr/bin/env bash
# Equal-data pilot: EAGLE-3 (training-time test unrolled 3 depths, the CPU recipe) vs HASS, both from scratch on the
# same 1,631 self-distilled turns (runs/features/distill-extra), 1 epoch, the recipe's optimiser settings, float32.
set -eu
cd /work/main
COMMON="--target_model smollm2-135m-instruct --feature_cache runs/features/distill-extra --max_length 512
  --num_train_epochs 1 --per_device_train_batch_size 8 --learning_rate 5e-4 --warmup_steps 20 --use_cpu
  --logging_steps 10 --save_steps 50 --save_total_limit 2 --report_to none"
[ -f runs/train/e3_pilot/DONE ] || { OMP_NUM_THREADS=2 python training_scripts/train_eagle3.py $COMMON --hass_steps 3 \
  --output_dir runs/train/e3_pilot > runs/train_e3_pilot.log 2>&1 && touch runs/train/e3_pilot/DONE; }
[ -f runs/train/hass_pilot/DONE ] || { OMP_NUM_THREADS=2 python training_scripts/train_hass.py $COMMON \
  --output_dir runs/train/hass_pilot > runs/train_hass_pilot.log 2>&1 && touch runs/train/hass_pilot/DONE; }
D=drafters/smollm2-135m-instruct
for m in e3 hass; do
  python training_scripts/publish_drafter.py runs/train/${m}_pilot runs/pub/${m}-pilot --command "bash runs/pilot_e3_vs_hass.sh" \
    --tree-from $D-hass --ngram-datastore $D-hass/ngram_datastore.safetensors > runs/publish_${m}_pilot.log 2>&1
done
methods="plain prompt_lookup hf_spec:$D-hass hf_spec:runs/pub/hass-pilot hf_spec:runs/pub/e3-pilot"
common="--target smollm2-135m-instruct --max-new-tokens 128 --dtype auto --threads 2 --methods $methods"
hf-spec bench $common --skip 6 --limit 3 --output-dir runs/bench_pilot/heldout6
hf-spec bench $common --skip 9 --limit 3 --output-dir runs/bench_pilot/heldout9
echo PILOT DONE
