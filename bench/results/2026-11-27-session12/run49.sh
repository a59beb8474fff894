#!/usr/bin/env bash
# Issue 30, session 12 (run 49): the selective policy re-runs attention scores (matmuls cheap for their bytes): one eager layer's bytes and time, the selective GPU tests, then eager Llama at 0.8 and 0.6.
cd "$(dirname "$0")/snap"
export PYTHONPATH=$PWD/python ACTOFFLOAD_BUILD_DIR=$PWD/python/build MAX_JOBS=16 CUBLAS_WORKSPACE_CONFIG=:4096:8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/device.txt
python -c "import actoffload._common as c; c.ext()" > $OUT/build.txt 2>&1
timeout 80 python bench/results/2026-11-26-h100-selective/sac_layer.py > $OUT/sac_layer.txt 2>&1
grep -E "left|MUST|PREFER" $OUT/sac_layer.txt | head -30
(cd python && timeout 110 python -m pytest -q -p no:cacheprovider --timeout 100 --tb=short -W ignore tests/test_selective.py tests/test_gpu_budget.py -k "selective" 2>&1 | tail -15 > $OUT/pytest.txt)
tail -4 $OUT/pytest.txt
mkdir -p $OUT/eager
timeout 330 python -m actoffload.budget_bench --models llama-eager --fractions 0.8,0.6 --steps 8 --out $OUT/eager > $OUT/eager/bench.txt 2>&1
echo "eager rc $?" >> $OUT/eager/bench.txt
grep -v Warn $OUT/eager/bench.txt | grep -v "with wrap\|__enter__\|get_cpu_offload" | tail -9
grep -h "warm-up\|^unit\|^   0 \|^predicted" $OUT/eager/plans-*.txt
