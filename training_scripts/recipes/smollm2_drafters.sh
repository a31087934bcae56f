#!/usr/bin/env bash
# The shipped SmolLM2-135M drafters, end to end on a 2-core CPU (drafters/README.md):
#   1. self-distil 4,480 ShareGPT first turns, keeping the target's features (one target pass)
#   2. train EAGLE, HASS, ParallelSpec and CORAL on that cache, EPOCHS (default 2) epochs each, same settings, 128
#      examples held out: training_summary.json's log_history holds the training and held-out top-1 curves
#      (METHODS=eagle3 trains EAGLE-3 alike; its folder takes EAGLE's fallback shape and n-gram settings)
#   3. publish each into drafters/; measure each drafter's shape candidates (tau, verified nodes) on held-aside
#      prompts (33..37 of each set): the rungs the online speed controller chooses among
#   4. benchmark: first 3 prompts of each set, then held-out prompts 6..8, all methods interleaved; then
#      input-grounded code editing (plain, prompt lookup, n-gram, HASS, HASS + n-gram branches)
# Every step resumes: the distillation by shard, training from its last checkpoint (a DONE file marks a
# finished run; raising EPOCHS continues a finished run from its last checkpoint). Run one step at a time with
# STEPS="distill train publish bench".
set -euo pipefail
cd "$(dirname "$0")/../.."
STEPS=${STEPS:-distill train publish bench}
METHODS=${METHODS:-hass eagle parallelspec coral}
EPOCHS=${EPOCHS:-2}
CACHE=runs/features/smollm2-sharegpt-distill
D=drafters/smollm2-135m-instruct
RECIPE="training_scripts/recipes/smollm2_drafters.sh (drafters/README.md)"
# glibc's malloc gives every freed buffer over 32 MB back to the kernel, which zeroes it again when the next training
# step asks for it: a quarter of a ParallelSpec step's CPU time went to the kernel. Keeping freed memory in the
# process makes the steps faster (benchmarks/cpu_training_memory/); your own values, or a preloaded jemalloc or
# tcmalloc, take precedence.
export MALLOC_MMAP_MAX_=${MALLOC_MMAP_MAX_:-0} MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_:-68719476736}
# bf16 only where this CPU computes it natively (hf_spec.hardware): emulated bf16 made the distillation 3x slower
# than float32 on an AVX2-only AMD EPYC (30-37 vs 100 generated tokens/s)
DTYPE=${DTYPE:-$(python -c "from hf_spec.hardware import dtype_name, resolve_dtype; print(dtype_name(resolve_dtype('auto')))")}
BF16=$([ "$DTYPE" = bfloat16 ] && echo --bf16 || true)
COMMON="--target_model smollm2-135m-instruct --dataset sharegpt --feature_cache $CACHE --max_length 512
  --num_train_epochs $EPOCHS --per_device_train_batch_size 8 --learning_rate 5e-4 --warmup_steps 20 $BF16 --use_cpu
  --logging_steps 10 --save_steps 50 --save_total_limit 2 --report_to none
  --eval_examples 128 --eval_strategy steps --eval_steps 250 --per_device_eval_batch_size 8"

if [[ " $STEPS " == *" distill "* ]]; then
  OMP_NUM_THREADS=2 python -m hf_spec.training.distill --target_model smollm2-135m-instruct --dataset sharegpt \
    --num_conversations 4480 --batch_size 64 --shard_examples 128 --threads 2 --dtype $DTYPE --output $CACHE
fi
if [[ " $STEPS " == *" train "* ]]; then
  for method in $METHODS; do
    out=runs/train/$method
    [ -f $out/DONE_${EPOCHS}ep ] && continue
    case $method in
      coral) extra="--w_csra 0.05 --router_max_steps 60" ;;
      parallelspec) extra="--gradient_accumulation_steps 1" ;;
      # EAGLE-3's training-time test unrolls 7 depths; the shipped folder unrolled 3 (HASS's alignment depth) for 2
      # epochs, what a 2-core CPU session afforded (TTT_STEPS=7 for the paper's)
      eagle3) extra="--hass_steps ${TTT_STEPS:-3}" ;;
      *) extra="" ;;
    esac
    OMP_NUM_THREADS=2 python training_scripts/train_$method.py $COMMON --output_dir $out $extra && touch $out/DONE_${EPOCHS}ep
  done
fi
if [[ " $STEPS " == *" publish "* ]]; then
  # Each folder ships the n-gram datastore of the cache's answers (the target's own greedy text); a re-published
  # folder keeps its shape and n-gram fields (fallback tree, ParallelSpec widths 2/1, n-gram nodes and depth, copy
  # chains, candidates: publish_drafter.py TUNED_FIELDS).
  for method in $METHODS; do
    python training_scripts/publish_drafter.py runs/train/$method $D-$method --command "$RECIPE" \
      --ngram-datastore $CACHE $([ "$method" = parallelspec ] && echo --tree-widths 2 1) \
      $([ "$method" = eagle3 ] && echo --tree-from $D-eagle)
  done
  # the shape candidates each drafter's speed controller chooses among at run time, then the cards again (they list
  # the candidates)
  python training_scripts/measure_shape_candidates.py $(for method in $METHODS; do echo $D-$method; done)
  for method in $METHODS; do
    python training_scripts/publish_drafter.py $D-$method $D-$method --command "$RECIPE"
  done
fi
if [[ " $STEPS " == *" bench "* ]]; then
  # every drafter with its run-time shape and the folder's n-gram settings, beside plain, prompt lookup and the
  # weightless NGramDrafter; HASS once more with its fixed fallback shape
  methods="plain prompt_lookup hf_spec:ngram hf_spec:ngram:datastore=$D-hass hf_spec:$D-eagle hf_spec:$D-hass
    hf_spec:$D-coral hf_spec:$D-parallelspec hf_spec:$D-hass:fixed_shape"
  out=${BENCH_OUT:-benchmarks/smollm2-drafters-that-pay/latest}
  common="--target smollm2-135m-instruct --max-new-tokens 128 --dtype bfloat16 --threads 2 --methods $methods"
  hf-spec bench $common --limit 3 --output-dir $out/first3
  hf-spec bench $common --skip 6 --limit 3 --output-dir $out/heldout
  hf-spec bench $common --datasets code_edit --limit 4 --output-dir $out/code_edit
  # cards carry the first run's results
  for method in $METHODS; do
    python training_scripts/publish_drafter.py $D-$method $D-$method --bench $out/first3/results.json \
      --command "$RECIPE"
  done
fi
