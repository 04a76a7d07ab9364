#!/usr/bin/env bash
# gpu_check.sh - the one script for the GPU machine (offline, torch preinstalled).
#
#   bash scripts/gpu_check.sh tests   build the CUDA library against the installed torch, run
#                                     every test (CPU and CUDA), compute-sanitizer memcheck and
#                                     racecheck over the cell and sequence kernels
#   bash scripts/gpu_check.sh bench   the project's benchmark on CUDA (lltm.bench): the default
#                                     table, the large cell size in float32 and bfloat16, T=1000;
#                                     then scripts/host_floor.py (autograd's cost per step)
#   bash scripts/gpu_check.sh multi   what needs 2 GPUs: cuda:1 tests, DDP over NCCL
#   bash scripts/gpu_check.sh cell    the cell alone: fused-kernel tile timings (scripts/cell_tiles.cu),
#                                     the cell's CUDA tests, launch counts, the cell benchmark table
#   bash scripts/gpu_check.sh timing  the kernel-level timing scripts (cuda_timing, sequence_timing)
#
# Logs and JSON/PNG results go to $OUT (default ./gpu-check-out); a short table
# is printed last. Each stage has a time limit so one mode ends within 10 minutes.
set -u
cd "$(dirname "$0")/.."
MODE=${1:-tests}
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# Nothing here needs NVLink multicast; keep it off (shared machines).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The build is part of what is checked: a fresh directory outside $OUT.
export LLTM_BUILD_DIR=${LLTM_BUILD_DIR:-/tmp/lltm-gpu-check-build}
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

STAGE_LOGS=$OUT STAGE_TAIL=12
source scripts/gpu_stages.sh

{
    nvidia-smi -L
    $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
    command -v nvcc && nvcc --version | tail -1
} 2>&1 | tee "$OUT/env.log"

build_stage 240 build.log
stage load 60 load.log $PY -c "import torch, lltm; from lltm import _native; \
assert torch.cuda.is_available(), 'no GPU'; assert _native.has_cuda_kernels(), 'CUDA kernels not loaded'; \
print('loaded on torch', torch.__version__, _native._loaded['cuda']._name, torch.cuda.get_device_name())"

case "$MODE" in
tests)
    stage tests 420 tests.log $PY -m pytest -q -rs -p no:cacheprovider --durations=12 tests
    stage launch-counts 60 launches.log $PY -m pytest -q -s -p no:cacheprovider \
        tests/test_cuda_cell.py -k launch_counts
    stage memcheck-cell 90 memcheck_cell.log "$SAN" --tool memcheck --error-exitcode 9 \
        --print-limit 20 $PY scripts/sanitize_cuda.py
    stage racecheck-cell 90 racecheck_cell.log "$SAN" --tool racecheck --error-exitcode 9 \
        --print-limit 20 $PY scripts/sanitize_cuda.py --quick
    stage memcheck-sequence 90 memcheck_seq.log "$SAN" --tool memcheck --error-exitcode 9 \
        --print-limit 20 $PY scripts/sanitize_sequence.py
    stage racecheck-sequence 90 racecheck_seq.log "$SAN" --tool racecheck --error-exitcode 9 \
        --print-limit 20 $PY scripts/sanitize_sequence.py --quick
    ;;
bench)
    stage bench-default 300 bench_default.log $PY -m lltm.bench --device cuda --no-progress \
        --json "$OUT/bench_default.json" --plot "$OUT/bench_default.png"
    stage bench-large 150 bench_large.log $PY -m lltm.bench --device cuda --no-progress \
        --sizes 256,512,1024 --dtype float32,bfloat16 --seq-len 0 --json "$OUT/bench_large.json"
    stage bench-t1000 120 bench_t1000.log $PY -m lltm.bench --device cuda --no-progress \
        --sizes 16,32,128 --seq-len 1000 --only lltm,lstm --json "$OUT/bench_t1000.json"
    # what any autograd step costs on this host (the cell's 4x target, issue 3)
    stage host-floor 120 host_floor.log $PY scripts/host_floor.py --device cuda \
        --sizes 16,32,128 --single-thread
    ;;
multi)
    stage second-device 200 second_device.log $PY -m pytest -q -rs -p no:cacheprovider \
        tests/test_cuda_cell.py tests/test_cuda_sequence.py -k second_device
    stage ddp-nccl 240 ddp.log $PY -m pytest -q -rs -p no:cacheprovider tests/test_ddp.py
    stage torchrun-nccl 180 torchrun.log torchrun --standalone --nproc_per_node=2 \
        -m lltm.examples.train --quick --device cuda --no-progress --plot ""
    ;;
cell)
    # The cell alone (issue 3): tile configurations of the fused kernels by
    # CUDA-graph replay, the cell's CUDA tests, launch counts, the cell table.
    stage cell-tiles 120 cell_tiles.log bash -c "nvcc -O3 -std=c++17 \
        -gencode=arch=compute_90,code=sm_90 -Icsrc/core scripts/cell_tiles.cu -o /tmp/cell_tiles \
        && /tmp/cell_tiles"
    stage tests 300 tests.log $PY -m pytest -q -rs -p no:cacheprovider tests/test_cuda_cell.py \
        tests/test_errors.py tests/test_cell.py
    stage launch-counts 60 launches.log $PY -m pytest -q -s -p no:cacheprovider \
        tests/test_cuda_cell.py -k launch_counts
    stage host-floor 120 host_floor.log $PY scripts/host_floor.py --device cuda
    stage bench-cell 240 bench_cell.log $PY -m lltm.bench --device cuda --no-progress \
        --seq-len 0 --json "$OUT/bench_cell.json"
    ;;
timing)
    stage cell-timing 200 cell_timing.log $PY scripts/cuda_timing.py --json "$OUT/cell_timing.json"
    stage sequence-timing 200 sequence_timing.log $PY scripts/sequence_timing.py \
        --json "$OUT/sequence_timing.json"
    ;;
*)
    echo "unknown mode $MODE (tests, bench, multi, cell, timing)"; exit 2 ;;
esac

stage_table
grep -h "loaded on torch" "$OUT/load.log"
for log in tests second_device ddp; do
    [ -f "$OUT/$log.log" ] && grep -E "passed|failed" "$OUT/$log.log" | tail -1
done
grep -hE "ERROR SUMMARY|RACECHECK SUMMARY|sanitize driver" "$OUT"/memcheck_*.log "$OUT"/racecheck_*.log 2>/dev/null
grep -hE "^launches" "$OUT/launches.log" 2>/dev/null
grep -hE "^(B=|forward|bwd_|empty)" "$OUT/cell_tiles.log" 2>/dev/null
grep -h "^B=" "$OUT/host_floor.log" 2>/dev/null
stages_ok
