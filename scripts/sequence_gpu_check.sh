#!/usr/bin/env bash
# sequence_gpu_check.sh - the sequence layer on a GPU machine (offline): build
# the CUDA-enabled library against the installed torch, run the CUDA sequence
# tests, the side-by-side timing (scripts/sequence_timing.py) and
# compute-sanitizer (memcheck, racecheck) on scripts/sanitize_sequence.py.
# Logs go to $OUT (default ./gpu-check-out); a short table is printed last.
#
#   bash scripts/sequence_gpu_check.sh
#   SKIP_SANITIZER=1 SKIP_TIMING=1 bash scripts/sequence_gpu_check.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export LLTM_BUILD_DIR=${LLTM_BUILD_DIR:-/tmp/lltm-gpu-check-build}

declare -a NAMES STATUS SECONDS_TAKEN
stage() {  # stage NAME LIMIT_SECONDS LOGFILE CMD...
    local name=$1 limit=$2 log=$3
    shift 3
    local t0=$SECONDS
    echo "=== $name: $*" | tee "$OUT/$log"
    timeout "$limit" "$@" >>"$OUT/$log" 2>&1
    local rc=$?
    NAMES+=("$name")
    STATUS+=("$([ $rc -eq 0 ] && echo ok || { [ $rc -eq 124 ] && echo "TIMEOUT" || echo "FAIL($rc)"; })")
    SECONDS_TAKEN+=($((SECONDS - t0)))
    tail -n 15 "$OUT/$log"
    return $rc
}

{
    nvidia-smi -L
    $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} 2>&1 | tee "$OUT/env.log"

stage build ${BUILD_LIMIT:-180} build.log $PY -m lltm.build --cuda yes -v
stage tests ${TEST_LIMIT:-200} tests.log $PY -m pytest -q --maxfail=8 -rs --durations=8 \
    tests/test_cuda_sequence.py
if [ -z "${SKIP_TIMING:-}" ]; then
    stage timing ${TIMING_LIMIT:-150} timing.log $PY scripts/sequence_timing.py \
        --json "$OUT/sequence_timing.json"
fi
if [ -z "${SKIP_SANITIZER:-}" ]; then
    SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    stage memcheck ${SAN_LIMIT:-90} memcheck.log "$SAN" --tool memcheck --error-exitcode 9 --print-limit 20 \
        $PY scripts/sanitize_sequence.py
    stage racecheck ${SAN_LIMIT:-90} racecheck.log "$SAN" --tool racecheck --error-exitcode 9 \
        --print-limit 20 $PY scripts/sanitize_sequence.py --quick
fi

echo
echo "| stage | result | seconds |"
echo "|---|---|---|"
for i in "${!NAMES[@]}"; do
    echo "| ${NAMES[$i]} | ${STATUS[$i]} | ${SECONDS_TAKEN[$i]} |"
done
grep -E "passed|failed|error" "$OUT/tests.log" | tail -3
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|sanitize driver" "$OUT"/memcheck.log "$OUT"/racecheck.log 2>/dev/null
[ -f "$OUT/timing.log" ] && sed -n '/^| B, I, H, T/,$p' "$OUT/timing.log"
if [ -n "${PROFILE:-}" ]; then
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    for size in "16 32 128 100" "64 256 512 100"; do
        timeout 120 "$NCU" -k regex:sequence_ --launch-count 2 --section SpeedOfLight \
            --section WarpStateStats --section Occupancy --section LaunchStats \
            $PY scripts/sequence_profile.py $size >"$OUT/ncu_${size// /_}.log" 2>&1
        grep -E "sequence_|Duration|Warp Cycles Per Issued|Stall|Achieved Occupancy|Registers" \
            "$OUT/ncu_${size// /_}.log" | head -40
    done
fi
