#!/usr/bin/env bash
# The one launcher for a bare GPU machine (torch and an older transformers preinstalled, no network), run from
# anywhere; it works in the repository root. Steps, each time-boxed so one call of the device tool (600 s at
# most) brings back whatever finished:
#   1. install the wheels carried in benchmarks/gpu/wheels/ (transformers 5.23, the version hf-spec pins), if any;
#   2. make hf_spec importable (editable install without dependencies, and PYTHONPATH as a fallback);
#   3. the cuda-marked tests: python -m pytest -q -m cuda tests/ > $OUT/cuda_tests.txt (short; first, so a long
#      benchmark cannot cost them);
#   4. benchmarks/gpu/engine_bench.py --out $OUT with the time left (it writes results.json and README.md after
#      every measurement; if it is cut, README.md and engine_bench.png are re-rendered from the JSON).
# Env: OUT (default benchmarks/gpu/results), PY (default python), CALL_LIMIT_S (default 570: the whole script),
# TESTS_TIMEOUT_S (default 100), SKIP_TESTS=1, SKIP_BENCH=1. Extra arguments go to engine_bench.py, e.g.
#   OUT=$OUT bash benchmarks/gpu/run_gpu.sh --targets llama-3.1-8b
set -u
cd "$(dirname "$0")/../.." || exit 1
T0=$(date +%s)
OUT=${OUT:-benchmarks/gpu/results}
mkdir -p "$OUT"
PY=${PY:-python}
CALL_LIMIT_S=${CALL_LIMIT_S:-570}
LOG="$OUT/run_gpu.log"
elapsed() { echo $(( $(date +%s) - T0 )); }
log() { echo "[run_gpu $(elapsed)s] $*" | tee -a "$LOG"; }

# 1. wheels (no index, no dependencies: the machine has no network)
shopt -s nullglob
WHEELS=(benchmarks/gpu/wheels/*.whl)
if [ ${#WHEELS[@]} -gt 0 ]; then
  log "installing ${#WHEELS[@]} wheel(s): $(for w in "${WHEELS[@]}"; do basename "$w"; done | tr '\n' ' ')"
  $PY -m pip install --no-index --no-deps --quiet "${WHEELS[@]}" >> "$LOG" 2>&1 || log "wheel install FAILED (see $LOG)"
else
  log "no wheels in benchmarks/gpu/wheels/: using the preinstalled transformers"
fi

# 2. hf_spec importable
$PY -m pip install --no-deps --no-build-isolation --quiet -e . >> "$LOG" 2>&1 || log "editable install failed; PYTHONPATH only"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
if ! $PY - >> "$LOG" 2>&1 <<'EOF'
import torch, transformers, hf_spec
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
print("transformers", transformers.__version__, "hf_spec", hf_spec.__version__, "from", hf_spec.__file__)
EOF
then
  log "import check FAILED: $(tail -3 "$LOG" | tr '\n' ' ')"
  log "Fix: carry the missing wheels in benchmarks/gpu/wheels/ (benchmarks/gpu/README.md)"
  exit 2
fi
log "$(tail -2 "$LOG" | tr '\n' ' ')"
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >> "$LOG" 2>&1

# 3. the cuda-marked tests
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout "${TESTS_TIMEOUT_S:-100}" $PY -m pytest -q -o addopts="" -m cuda -p no:cacheprovider tests/ > "$OUT/cuda_tests.txt" 2>&1
  rc=$?
  log "cuda tests rc=$rc$([ $rc = 124 ] && echo ' (timed out)'): $(tail -1 "$OUT/cuda_tests.txt")"
fi

# 4. the engine benchmark, in the time left (its budget stops new measurements ~40 s before the hard timeout)
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  left=$(( CALL_LIMIT_S - $(elapsed) ))
  budget=$(( left - 45 ))
  if [ $budget -lt 60 ]; then
    log "only ${left}s left: no time for the benchmark"
    exit 3
  fi
  log "engine_bench: budget ${budget}s, hard timeout $(( left - 5 ))s"
  timeout $(( left - 5 )) $PY benchmarks/gpu/engine_bench.py --out "$OUT" --budget-s "$budget" "$@" \
    > "$OUT/engine_bench.log" 2>&1
  rc=$?
  log "engine_bench rc=$rc$([ $rc = 124 ] && echo ' (timed out)'): $(grep -v '^\s*$' "$OUT/engine_bench.log" | tail -1)"
  if [ $rc != 0 ] && [ -f "$OUT/results.json" ]; then
    $PY benchmarks/gpu/engine_bench.py --replot "$OUT/results.json" >> "$OUT/engine_bench.log" 2>&1 \
      && log "README.md and engine_bench.png re-rendered from results.json"
  fi
fi
log "done; $OUT: $(ls "$OUT" | tr '\n' ' ')"
