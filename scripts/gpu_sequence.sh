#!/usr/bin/env bash
# gpu_sequence.sh - one call on the GPU machine for the CUDA sequence kernels:
# build, then
#   all     tests/test_cuda_sequence.py, compute-sanitizer memcheck + racecheck
#           over scripts/sanitize_sequence.py, scripts/sequence_timing.py at
#           B16/I32/H128 (T=100 and T=1000) once per cluster shape (8 blocks,
#           16 blocks), and at B64/I256/H512/T100 (grid plan)
#   timing  the same timings, then sequence_timing.py's default sizes
#   grid    the grid plans at B64/I256/H512/T100: sequence_timing.py with the
#           default plan choice, LLTM_CUDA_GRID_SHAPE=32x16, and 32x16 with
#           LLTM_CUDA_GRID_GROUPS=1 (the layout before the batch split), the
#           per-kernel GPU time (scripts/sequence_profile.py --table), then
#           tests/test_cuda_sequence.py
#   layouts the 16-block cluster plan at B16/I32/H128 (T=100, T=1000): its
#           tests (tests/test_cuda_sequence.py -k cluster16), the forward's
#           batch splits side by side (sequence_timing.py --variant: default,
#           4-row clusters; LLTM_CUDA_CLUSTER_SPLIT=8; LLTM_CUDA_CLUSTER_FWD/
#           _BWD=nosplit), the per-kernel GPU time, and an Nsight Compute
#           profile of the cluster kernels as in final
#   final   all, then an Nsight Compute profile of the cluster kernels (warp
#           states, stall sampling per SASS line; clocks left alone), their
#           SASS, and sequence_timing.py's default sizes
# Logs, JSON and profiles go to $OUT/logs (default ./gpu-seq-out/logs), packed
# at the end into $OUT/gpu_sequence_logs.tgz; a short table is printed last.
# Each mode ends within 10 minutes.
#
#   bash scripts/gpu_sequence.sh [all|timing|grid|final]
set -u
cd "$(dirname "$0")/.."
MODE=${1:-all}
OUT=${OUT:-$PWD/gpu-seq-out}
LOGS=$OUT/logs
mkdir -p "$LOGS"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
export LLTM_BUILD_DIR=${LLTM_BUILD_DIR:-/tmp/lltm-gpu-seq-build}
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

STAGE_LOGS=$LOGS STAGE_TAIL=6
source scripts/gpu_stages.sh

nvidia-smi -L 2>&1 | tee "$LOGS/env.log"
build_stage 150 build.log
SMALL="16,32,128,100 16,32,128,1000"
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
profile_cluster() {  # warp states and stall sampling per SASS line of the cluster kernels
    stage profile 150 profile.log "$NCU" --clock-control none -k regex:cluster \
        --launch-count 2 --section LaunchStats --section WarpStateStats \
        --section SchedulerStats --section SourceCounters -f -o "$LOGS/cluster" \
        $PY scripts/sequence_profile.py 16 32 128 100
    "$NCU" -i "$LOGS/cluster.ncu-rep" --page details > "$LOGS/profile_details.txt" 2>&1
    "$NCU" -i "$LOGS/cluster.ncu-rep" --page source --csv --print-source sass \
        > "$LOGS/profile_source.csv" 2>&1
}
if [ "$MODE" = layouts ]; then
    stage tests-cluster16 200 tests.log $PY -m pytest -q -rs -p no:cacheprovider \
        tests/test_cuda_sequence.py -k cluster16
    export LLTM_CUDA_CLUSTER_BLOCKS=16
    stage timing-layouts 240 timing_layouts.log $PY scripts/sequence_timing.py --no-reference \
        --configs $SMALL --variant "split8:LLTM_CUDA_CLUSTER_SPLIT=8" \
        --variant "nosplit:LLTM_CUDA_CLUSTER_FWD=nosplit,LLTM_CUDA_CLUSTER_BWD=nosplit" \
        --json "$LOGS/timing_layouts.json"
    stage kernels 60 kernels.log $PY scripts/sequence_profile.py 16 32 128 1000 --table
    profile_cluster
    echo "--- timing_layouts"
    grep -hE "passed|failed" "$LOGS/tests.log" | tail -1
    grep -E "^\| (B|16)|check B" "$LOGS/timing_layouts.log" | grep -v "per-step"
    grep -E "sequence_|Self CUDA time total|===" "$LOGS/kernels.log" | cut -c1-60,150-
    grep -E "cluster|Warp Cycles Per Issued|Issued Warp Per Scheduler|Duration" \
        "$LOGS/profile_details.txt" | head -20
    stage_table
    tar czf "$OUT/gpu_sequence_logs.tgz" -C "$LOGS" . && rm -rf "$LOGS"
    stages_ok
    exit
fi
if [ "$MODE" = grid ]; then
    GRID=64,256,512,100
    stage timing-grid 100 timing_grid.log $PY scripts/sequence_timing.py --no-reference \
        --configs $GRID --json "$LOGS/timing_grid.json"
    stage timing-grid-32x16 100 timing_grid_32x16.log env LLTM_CUDA_GRID_SHAPE=32x16 \
        $PY scripts/sequence_timing.py --no-reference --configs $GRID
    stage timing-grid-32x16-1group 100 timing_grid_32x16_1group.log env \
        LLTM_CUDA_GRID_SHAPE=32x16 LLTM_CUDA_GRID_GROUPS=1 \
        $PY scripts/sequence_timing.py --no-reference --configs $GRID
    stage kernels-grid 60 kernels_grid.log $PY scripts/sequence_profile.py 64 256 512 100 --table
    grep -E "sequence_|gemm|Self CUDA time total|===" "$LOGS/kernels_grid.log" | cut -c1-60,150-
    stage tests 200 tests.log $PY -m pytest -q -rs -p no:cacheprovider -x \
        tests/test_cuda_sequence.py
    for log in timing_grid timing_grid_32x16 timing_grid_32x16_1group; do
        echo "--- $log"
        grep -E "^\| (B|64)|check B" "$LOGS/$log.log" | grep -v "per-step"
    done
    stage_table
    grep -hE "passed|failed" "$LOGS/tests.log" | tail -1
    tar czf "$OUT/gpu_sequence_logs.tgz" -C "$LOGS" . && rm -rf "$LOGS"
    stages_ok
    exit
fi
if [ "$MODE" = all ] || [ "$MODE" = final ]; then
    stage tests 200 tests.log $PY -m pytest -q -rs -p no:cacheprovider -x \
        tests/test_cuda_sequence.py
    stage memcheck 90 memcheck.log "$SAN" --tool memcheck --error-exitcode 9 \
        --print-limit 20 $PY scripts/sanitize_sequence.py
    stage racecheck 100 racecheck.log "$SAN" --tool racecheck --error-exitcode 9 \
        --print-limit 20 $PY scripts/sanitize_sequence.py --quick
fi
for blocks in 8 16; do
    stage "timing-cluster$blocks" 80 "timing$blocks.log" \
        env LLTM_CUDA_CLUSTER_BLOCKS=$blocks $PY scripts/sequence_timing.py --no-reference \
        --configs $SMALL \
        --json "$LOGS/timing$blocks.json"
done
stage timing-grid 100 timing_grid.log $PY scripts/sequence_timing.py --no-reference \
    --configs 64,256,512,100 --json "$LOGS/timing_grid.json"
if [ "$MODE" = final ]; then
    profile_cluster
    cuobjdump -sass "$($PY -c 'import lltm; print(lltm.build_info()["loaded_from"]["cuda"])')" 2>&1 | awk \
        '/Function : /{keep = /cluster_kernelIfLi32ELi4/} keep' > "$LOGS/sass_cluster_f32_32x4.txt"
fi
if [ "$MODE" = timing ] || [ "$MODE" = final ]; then
    stage timing-default 240 timing.log $PY scripts/sequence_timing.py \
        --json "$LOGS/timing.json"
fi

echo
for log in timing8 timing16 timing_grid timing; do
    echo "--- $log"
    [ -f "$LOGS/$log.log" ] && grep -E "^\| (B|16|64)|reference cells /" "$LOGS/$log.log" |
        grep -v "per-step"
done
stage_table
grep -hE "passed|failed" "$LOGS/tests.log" 2>/dev/null | tail -1
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|sanitize driver" "$LOGS"/memcheck.log \
    "$LOGS"/racecheck.log 2>/dev/null
if [ -f "$LOGS/profile_details.txt" ]; then
    grep -E "cluster|Warp Cycles Per Issued|Issued Warp Per Scheduler|Duration" \
        "$LOGS/profile_details.txt" | head -20
fi
tar czf "$OUT/gpu_sequence_logs.tgz" -C "$LOGS" . && rm -rf "$LOGS"
stages_ok
