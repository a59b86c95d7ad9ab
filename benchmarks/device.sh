#!/usr/bin/env bash
# One call on the lent GPU machine (no registry there): install the carried wheels
# (this package built as a wheel, SGLang and its import closure for the hook test),
# run the GPU tests, then the benchmarks and the report. Results land in $OUT.
#
# Prepare here first:  make gpu-wheels   (fills the git-ignored .whl/ and benchmarks/_peers/)
# Then on the device:  bash benchmarks/device.sh [tests|bench|all|tune|profile]
# tune: benchmarks/tune.py's sweeps (with benchmarks/_baseline/kernels_base, an older
# kernels/ from `git archive`, as a baseline when present), then profile: Nsight Compute
# on tune.py's --profile targets. TUNE_ARGS and GPU_TESTS_ARGS pass options to tune.py and pytest.
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
if [ "$what" = tune ]; then
    (cd /tmp && timeout "${TUNE_TIMEOUT:-330}" python3 "$repo/benchmarks/tune.py" --out "$OUT/tune.json" ${TUNE_ARGS:-} \
        2>&1 | tee "$OUT/tune.log") || rc=1
fi
if [ "$what" = tune ] || [ "$what" = profile ]; then
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    # --clock-control none: leave the clocks as the benchmarks see them; --cache-control
    # none: decode-sized inputs stay in L2 in a server, as they do here.
    (cd /tmp && timeout 150 "$ncu" --clock-control none --cache-control none -k 'regex:_sort|_mask' \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        --csv --page details python3 "$repo/benchmarks/tune.py" --profile >"$OUT/ncu.csv" 2>&1) || rc=1
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    (cd /tmp && python3 "$repo/benchmarks/run.py" --out "$OUT/h200.json" 2>&1 | tee "$OUT/bench.log") || rc=1
    (cd /tmp && python3 "$repo/benchmarks/report.py" --results "$OUT/h200.json" \
        --out "$OUT/benchmarks.md" --plots-dir "$OUT") || rc=1
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
    # Run from outside the checkout so the installed wheel (with kernels/ mapped into
    # sglang_amd_moe.kernels) is imported, not the source folder.
    (cd /tmp && python3 -m pytest -q -rA -p no:cacheprovider "$repo/tests/gpu" ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} \
        ${GPU_TESTS_ARGS:-} 2>&1 | tee "$OUT/gpu-tests.log"; exit "${PIPESTATUS[0]}") || rc=1
fi
exit $rc
