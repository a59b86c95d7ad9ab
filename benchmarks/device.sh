#!/usr/bin/env bash
# One call on the lent GPU machine (no registry there): install the carried wheels
# (this package built as a wheel, SGLang and its import closure for the hook test),
# unpack the trimmed sgl_kernel (SGLang's topk imports it on a GPU; the benchmarks time
# its C++ moe_align_block_size), run the GPU tests, then the benchmarks and the report.
# Results land in $OUT.
#
# Prepare here first:  make gpu-wheels   (fills the git-ignored .whl/ and benchmarks/_peers/)
# Then on the device:  bash benchmarks/device.sh [tests|bench|all|tune|profile]
# all: the GPU tests while every benchmark kernel compiles (in parallel processes), then
# the timed benchmarks alone on the machine. tune: benchmarks/tune.py's sweeps, then
# profile: Nsight Compute on tune.py's --profile targets. TUNE_ARGS, BENCH_ARGS and
# GPU_TESTS_ARGS pass options to tune.py, run.py and pytest; GPU_TESTS names the test
# files or folders (default tests/gpu); HOST_COST=1 runs benchmarks/host_cost.py after
# the benchmarks (bench, all); STATS_COST=1 runs benchmarks/stats_cost.py (the counters'
# cost: the guard and the mask with and without them) into $OUT/stats-cost.json.
set -uo pipefail
what=${1:-all}
# The results JSON and the logs go to $OUT as they are written; the report, the plots
# and the smaller files are packed into one $OUT/device-extras.tar.gz at the end (the lent
# machine returns at most 8 files from $OUT, and what is there when a call is stopped).
OUT=${OUT:-/tmp/out}
WORK=${WORK:-/tmp/device-results}
mkdir -p "$OUT" "$WORK"
repo=$(cd "$(dirname "$0")/.." && pwd)
jobs=${DEVICE_JOBS:-8}

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "$repo"/.whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
for packed in "$repo"/.whl/sgl_kernel-*.tar.xz; do
    [ -e "$packed" ] || continue
    mkdir -p /tmp/sgl_kernel_site && tar -xJf "$packed" -C /tmp/sgl_kernel_site || exit 1
    PYTHONPATH=$PYTHONPATH:/tmp/sgl_kernel_site
done
export PYTHONUNBUFFERED=1
# The SGLang hook test fails instead of skipping when SGLang or sgl_kernel is missing.
export SGLANG_AMD_MOE_TEST_REQUIRE_SGLANG=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$WORK/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$WORK/gpu.txt"
python3 -c "import sgl_kernel, sglang; print('sgl_kernel', sgl_kernel.__file__, 'sglang', sglang.__version__)" \
    2>&1 | tail -1 | tee -a "$WORK/gpu.txt"

rc=0
gpu_tests() {
    # Run from outside the checkout so the installed wheel (with kernels/ mapped into
    # sglang_amd_moe.kernels) is imported, not the source folder.
    local paths=()
    for t in ${GPU_TESTS:-tests/gpu}; do paths+=("$repo/$t"); done
    (cd /tmp && timeout "${TESTS_TIMEOUT:-300}" python3 -m pytest -q -rA -p no:cacheprovider -n "$jobs" "${paths[@]}" \
        ${GPU_TESTS_K:+-k "$GPU_TESTS_K"} ${GPU_TESTS_ARGS:-} >"$OUT/gpu-tests.log" 2>&1)
}
if [ "$what" = tune ]; then
    (cd /tmp && timeout "${TUNE_TIMEOUT:-330}" python3 "$repo/benchmarks/tune.py" --out "$WORK/tune.json" ${TUNE_ARGS:-} \
        2>&1 | tee "$WORK/tune.log") || rc=1
fi
if [ "$what" = tune ] || [ "$what" = profile ]; then
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    # --clock-control none: leave the clocks as the benchmarks see them; --cache-control
    # none: decode-sized inputs stay in L2 in a server, as they do here.
    (cd /tmp && timeout 150 "$ncu" --clock-control none --cache-control none -k 'regex:_sort|_mask' \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        --csv --page details python3 "$repo/benchmarks/tune.py" --profile >"$WORK/ncu.csv" 2>&1) || rc=1
fi
if [ "$what" = tests ]; then
    gpu_tests || rc=1
    tail -5 "$OUT/gpu-tests.log"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
    # Compile every kernel the benchmarks launch into Triton's disk cache in parallel
    # (and run the GPU tests meanwhile), so the timed run below loads them instead.
    # SORT_TUNE=1: also time tune.py's sort variants after the benchmarks.
    test_pid=
    if [ "$what" = all ]; then gpu_tests & test_pid=$!; fi
    warm_pids=()
    for i in $(seq 0 $((jobs - 1))); do
        (cd /tmp && { timeout "${WARM_TIMEOUT:-300}" python3 "$repo/benchmarks/run.py" --warm "$i/$jobs" ${BENCH_ARGS:-} \
            && if [ "${SORT_TUNE:-0}" = 1 ]; then timeout "${WARM_TIMEOUT:-300}" python3 "$repo/benchmarks/tune.py" --warm "$i/$jobs"; fi; } \
            >"/tmp/warm-$i.log" 2>&1 || { tail -20 "/tmp/warm-$i.log"; exit 1; }) &
        warm_pids+=($!)
    done
    for pid in "${warm_pids[@]}"; do wait "$pid" || rc=1; done
    echo "compiled in $SECONDS s"
    if [ -n "$test_pid" ]; then wait "$test_pid" || rc=1; tail -5 "$OUT/gpu-tests.log"; fi
    (cd /tmp && timeout "${BENCH_TIMEOUT:-400}" python3 "$repo/benchmarks/run.py" --out "$OUT/h200.json" \
        ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log") || rc=1
    if [ "${STATS_COST:-0}" = 1 ]; then
        (cd /tmp && timeout "${STATS_COST_TIMEOUT:-150}" python3 "$repo/benchmarks/stats_cost.py" \
            --out "$OUT/stats-cost.json" 2>&1 | tee "$WORK/stats-cost.log") || rc=1
    fi
    if [ "${HOST_COST:-0}" = 1 ]; then
        (cd /tmp && timeout "${HOST_COST_TIMEOUT:-240}" python3 "$repo/benchmarks/host_cost.py" \
            --out "$OUT/h200-host-cost.json" 2>&1 | tee "$WORK/host-cost.log") || rc=1
    fi
    (cd /tmp && python3 "$repo/benchmarks/report.py" --results "$OUT/h200.json" \
        --host-cost "$OUT/h200-host-cost.json" --stats-cost "$OUT/stats-cost.json" \
        --out "$WORK/benchmarks.md" --plots-dir "$WORK") || rc=1
    if [ "${SORT_TUNE:-0}" = 1 ]; then
        (cd /tmp && timeout "${TUNE_TIMEOUT:-120}" python3 "$repo/benchmarks/tune.py" --only sort \
            --out "$OUT/tune.json" 2>&1 | tee "$WORK/tune.log") || rc=1
    fi
fi
tar -czf "$OUT/device-extras.tar.gz" -C "$WORK" . && ls -la "$WORK" "$OUT"
echo "device.sh done in $SECONDS s"
exit $rc
