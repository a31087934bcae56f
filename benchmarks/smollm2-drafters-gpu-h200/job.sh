#!/usr/bin/env bash
# GPU job: self-distil ShareGPT first turns with the target on the GPU (features kept, one pass), train the four
# SmolLM2 drafter families from scratch on that cache with the CPU recipe's settings, and write the results
# to $OUT. Every step is time-boxed against BUDGET_S so what finished comes back.
# Env: TARGET, DATA, N, DBATCH, MAXNEW, EPOCHS, BS, LR, MAX_STEPS (-1 = epochs), ROUTER_STEPS, BUDGET_S, METHODS
set -u
T0=$(date +%s)
W=${WORK:-/root/work}; mkdir -p $W $OUT
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
log() { echo "[job $(($(date +%s) - T0))s] $*" | tee -a $OUT/job.log; }
CACHE=$W/cache
log "distill N=$N batch=$DBATCH maxnew=$MAXNEW on $TARGET (left $(left)s)"
PYTHONUNBUFFERED=1 timeout $(( $(left) * ${DISTILL_SHARE:-45} / 100 )) ${PY:-python} -m hf_spec.training.distill \
  --target_model $TARGET --dataset $DATA --num_conversations $N --batch_size $DBATCH --shard_examples $DBATCH \
  --max_new_tokens $MAXNEW --device ${DEVICE:-auto} --output $CACHE > $W/distill.out 2>&1
log "distill rc=$? $(tail -c 300 $W/distill.out | tr '\r' '\n' | tail -2)"
for s in $CACHE/shard-*; do [ -f $s/dataset_info.json ] || { log "dropping unfinished $s"; rm -rf $s; }; done
cat $CACHE/hf_spec_features.json | tr -d "\n " | tee -a $OUT/job.log; echo
cp $CACHE/distill_log.jsonl $CACHE/hf_spec_features.json $W/ 2>/dev/null
gzip -c $CACHE/conversations.jsonl > $W/conversations.jsonl.gz 2>/dev/null
COMMON="--target_model $TARGET --dataset sharegpt --feature_cache $CACHE --max_length 512 --num_train_epochs $EPOCHS
  --max_steps ${MAX_STEPS:--1} --per_device_train_batch_size $BS --learning_rate $LR --warmup_steps 20 --bf16
  --logging_steps 20 --save_steps ${SAVE_STEPS:-100} --save_total_limit 1 --report_to none --dataloader_num_workers 2 ${USE_CPU:+--use_cpu}"
for m in $METHODS; do
  case $m in
    coral) extra="--w_csra 0.05 --router_max_steps $ROUTER_STEPS" ;;
    parallelspec) extra="--gradient_accumulation_steps 1" ;;
    *) extra="" ;;
  esac
  # an equal share of the time left to each method still to train (a cut run keeps its last checkpoint)
  set -- $METHODS; n=0; seen=0; for x in $METHODS; do [ $x = $m ] && seen=1; [ $seen = 1 ] && n=$((n + 1)); done
  budget=$(( ($(left) - 25) / n ))
  [ $budget -lt 20 ] && { log "no time left for $m"; continue; }
  log "train $m (timeout ${budget}s)"
  PYTHONUNBUFFERED=1 timeout $budget ${PY:-python} training_scripts/train_$m.py $COMMON --output_dir $W/train/$m $extra \
    > $W/train_$m.out 2>&1
  log "train $m rc=$? $(grep -o "train_runtime[^,]*\|train_steps_per_second[^,]*" $W/train_$m.out | tail -2 | tr "\n" " ")"
  # the final save, else the last checkpoint's weights (a run cut by the time box)
  f=$W/train/$m/model.safetensors
  [ -f $f ] || [ ! -f $W/train/$m/drafter/model.safetensors ] || f=$W/train/$m/drafter/model.safetensors
  [ -f $f ] || f=$(ls -d $W/train/$m/checkpoint-* $W/train/$m/drafter/checkpoint-* 2>/dev/null | sort -t- -k2 -n | tail -1)/model.safetensors
  # bf16 as publish_drafter.py ships them (fp32 weights are over the 16 MB a returned file may have)
  [ -f $f ] && ${PY:-python} -c "
import sys, torch; from safetensors.torch import load_file, save_file
w = load_file(sys.argv[1]); save_file({k: v.bfloat16() if v.is_floating_point() else v for k, v in w.items()}, sys.argv[2], {'format': 'pt'})
" $f $OUT/$m.safetensors && cp $(dirname $f)/config.json $W/train/$m.config.json && log "$m weights from $f"
done
cd $W && tar czf $OUT/results.tgz --exclude='*.safetensors' --exclude='optimizer.pt' --exclude='scheduler.pt' \
  --exclude='rng_state*' --exclude='checkpoint-*' --exclude='*.py' distill.out distill_log.jsonl hf_spec_features.json conversations.jsonl.gz train_*.out train 2>/dev/null
log "done, left $(left)s"; ls -la $OUT
