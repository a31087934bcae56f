#!/usr/bin/env bash
# GPU call 1 of 3: stash the first GGUF piece and the EAGLE folder, install the pinned wheels, run the CUDA tests.
set -u; W=/root/work; mkdir -p $W/d $OUT; T0=$(date +%s)
cp .gpu/g1/gpart00 $W/ && cp -r .gpu/d/eagle $W/d/
pip install -q --no-deps .gpu/whl/*.whl .gpu/whl2/*.whl > $OUT/pip.log 2>&1; echo "pip rc=$?" | tee -a $OUT/call1.log
python -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))" 2>&1 | tee -a $OUT/call1.log
PYTHONPATH=$PWD timeout 150 python -m pytest -q -m cuda -p no:cacheprovider tests/test_compat.py tests/test_bench.py 2>&1 | tail -15 | tee -a $OUT/call1.log
nvidia-smi > $OUT/nvidia-smi.txt 2>&1; echo "call1 $(( $(date +%s) - T0 ))s" | tee -a $OUT/call1.log; ls $W $W/d
