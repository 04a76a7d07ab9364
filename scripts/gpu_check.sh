#!/usr/bin/env bash
# gpu_check.sh - the one script for a GPU machine (offline): build the
# CUDA-enabled library against the installed torch, run the CUDA tests,
# compute-sanitizer (memcheck, racecheck) on scripts/sanitize_cuda.py, and the
# side-by-side timing (scripts/cuda_timing.py). Logs go to $OUT (default
# ./gpu-check-out); a short table is printed last.
#
#   bash scripts/gpu_check.sh            # everything
#   SKIP_TIMING=1 bash scripts/gpu_check.sh
#
# Each stage has a time limit so the whole run ends within 10 minutes.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# Nothing we run needs NVLink multicast; keep it off (shared machines).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# A fresh build directory outside $OUT (only logs go there): the build is
# part of what is checked.
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
    tail -n 25 "$OUT/$log"
    return $rc
}

{
    nvidia-smi -L
    $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
    command -v nvcc && nvcc --version | tail -1
} 2>&1 | tee "$OUT/env.log"

stage build 120 build.log $PY -m lltm.build --cuda yes -v
stage load 60 load.log $PY -c "import torch, lltm; from lltm import _native; \
assert torch.cuda.is_available(), 'no GPU'; assert _native.has_cuda_kernels(), 'CUDA kernels not loaded'; \
print('CUDA kernels loaded:', _native._loaded['cuda']._name, torch.cuda.get_device_name())"
stage cuda-tests 170 cuda_tests.log $PY -m pytest -q -rs -s --durations=10 tests/test_cuda_cell.py
if [ -z "${SKIP_TIMING:-}" ]; then
    stage timing 150 timing.log $PY scripts/cuda_timing.py --json "$OUT/timing.json"
fi
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
stage memcheck 70 memcheck.log "$SAN" --tool memcheck --error-exitcode 9 --print-limit 20 \
    $PY scripts/sanitize_cuda.py
stage racecheck 70 racecheck.log "$SAN" --tool racecheck \
    --error-exitcode 9 --print-limit 20 $PY scripts/sanitize_cuda.py --quick

echo
echo "| stage | result | seconds |"
echo "|---|---|---|"
for i in "${!NAMES[@]}"; do
    echo "| ${NAMES[$i]} | ${STATUS[$i]} | ${SECONDS_TAKEN[$i]} |"
done
grep -E "passed|failed" "$OUT/cuda_tests.log" | tail -1
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|sanitize driver" "$OUT/memcheck.log" "$OUT/racecheck.log"
grep -E "^launches" "$OUT/cuda_tests.log"
grep -h "CUDA kernels loaded" "$OUT/load.log"
[ -f "$OUT/timing.log" ] && sed -n '/^| size/,$p' "$OUT/timing.log"
