#!/usr/bin/env bash
# One call on the lent GPU machine (no registry there): install the carried wheels
# (this package built as a wheel, SGLang and its import closure for the hook test),
# run the GPU tests, then the benchmarks and the report. Results land in $OUT.
#
# Prepare here first:  make gpu-wheels   (fills the git-ignored .whl/ and benchmarks/_peers/)
# Then on the device:  bash benchmarks/device.sh [tests|bench|all]
set -uo pipefail
what=${1:-all}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
repo=$(cd "$(dirname "$0")/.." && pwd)

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$repo"/.whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"

rc=0
if [ "$what" = bench ] || [ "$what" = all ]; then
    (cd /tmp && python3 "$repo/benchmarks/run.py" --out "$OUT/h200.json" 2>&1 | tee "$OUT/bench.log") || rc=1
    (cd /tmp && python3 "$repo/benchmarks/report.py" --results "$OUT/h200.json" \
        --out "$OUT/benchmarks.md" --plots-dir "$OUT") || rc=1
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
    # Run from outside the checkout so the installed wheel (with kernels/ mapped into
    # sglang_amd_moe.kernels) is imported, not the source folder.
    (cd /tmp && python3 -m pytest -q -rA -p no:cacheprovider "$repo/tests/gpu" ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} \
        --junitxml="$OUT/gpu-tests.xml" 2>&1 | tee "$OUT/gpu-tests.log"; exit "${PIPESTATUS[0]}") || rc=1
fi
exit $rc
