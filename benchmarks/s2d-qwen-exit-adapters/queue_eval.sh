#!/usr/bin/env bash
# After runs/s2d_exits.sh: exit accuracy/calibration, then the chain pilot on the 1.5B (one CPU job at a time).
set -eu
cd /work/main
REC=benchmarks/s2d-qwen-exit-adapters
while [ ! -f runs/s2d_exits/DONE ]; do sleep 20; done
echo "exit eval $(date -u +%T)"
python $REC/exit_eval.py runs/s2d_exits 2000 20 $REC/exit_eval.json
echo "chain pilot 1.5B $(date -u +%T)"
python $REC/chain_pilot.py runs/s2d_exits qwen2.5-coder-1.5b-instruct $REC/chain_pilot_1.5b.json 2,2,0 0.9,0.8,0
echo "QUEUE31 DONE $(date -u +%T)"
