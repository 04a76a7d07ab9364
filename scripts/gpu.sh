#!/usr/bin/env bash
# gpu.sh - the one driver for a GPU machine (offline, torch preinstalled).
# It builds the CUDA library against the installed torch, checks that it loads,
# then runs the modes given, in order:
#
#   bash scripts/gpu.sh tests      every test (CPU and CUDA), and the CUDA cell's
#                                  kernel launches per step: tests-cuda, then
#                                  tests-rest (about 12 minutes on an H100)
#   bash scripts/gpu.sh tests-cuda the test files that run the CUDA kernels most
#                                  (test_cuda_*, the LSTM-on-CUDA, bidirectional,
#                                  graph-capture, sharing and compiled-graph files)
#                                  and the launch counts (about 5 minutes)
#   bash scripts/gpu.sh tests-rest every other test file (about 7 minutes)
#   bash scripts/gpu.sh sanitize   compute-sanitizer memcheck and racecheck over
#                                  the cell and sequence kernels
#                                  (scripts/sanitize_cuda.py, sanitize_sequence.py)
#   bash scripts/gpu.sh bench      the benchmark tables on CUDA (python -m lltm.bench):
#                                  default sizes, the large cell in float32 and
#                                  bfloat16, the sequence at T=1000; then what an
#                                  autograd step costs on this host
#                                  (dev/timing/host_floor.py), and a small model's
#                                  training step eager and under torch.compile
#                                  (dev/timing/compiled_model.py)
#   bash scripts/gpu.sh rows       variable lengths and both directions: the CUDA
#                                  tests of per-row lengths, then the benchmark's
#                                  bidirectional and packed rows against cuDNN
#                                  (python -m lltm.bench --rows all)
#   bash scripts/gpu.sh multi      what needs 2 GPUs: every op and module on cuda:1
#                                  (tests/multi_gpu and the second_device tests);
#                                  over NCCL with torchrun (scripts/multi_gpu.py):
#                                  DDP of the example, no_sync, DDP under
#                                  torch.compile, FSDP2 in float32 and bfloat16
#                                  mixed precision, DDP of a bidirectional LLTM
#                                  over packed batches, each against one process;
#                                  the training example under torchrun
#   bash scripts/gpu.sh lab [WHAT] the timing tools of dev/timing (dev/README.md),
#                                  WHAT one of
#                                    sequence  (default) kernel-level timings against
#                                              cuDNN, GPU time per kernel, host time
#                                              of the eager step's pieces
#                                    cell      tile timings of the fused cell kernels,
#                                              the cell against its peers, floors
#                                    exchange  the cluster kernels' exchange alone
#                                    wavefront stacked layers in time chunks: each
#                                              chunk count against cuDNN, and the
#                                              kernels of one graph replay (which
#                                              layers overlap, what lies between)
#                                    profile   Nsight Compute profile of the sequence
#                                              kernels, and the library's SASS
#
#   bash scripts/gpu.sh tests sanitize    several modes in one call
#
# Logs, JSON, plots and profiles go to $OUT (default ./gpu-out); a table of the
# stages (result, seconds) and the lines that matter are printed last; the exit
# status is 0 when every stage passed. Each stage has a time limit; each mode
# alone ends within 10 minutes, except tests (its two halves, for a machine
# whose calls are limited to 10 minutes: tests-cuda, tests-rest). PYTHON picks
# the interpreter (default python3), LLTM_BUILD_DIR the build folder (default a
# fresh one under /tmp). The environment's TORCH_CUDA_ARCH_LIST, if set, is
# what the build and every later `import lltm` compile for (prebuilt objects
# must match it: scripts/prebuild_cuda.py --archs).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
# Nothing here needs NVLink multicast; keep it off (shared machines).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The build is part of what is checked: a fresh folder outside $OUT.
export LLTM_BUILD_DIR=${LLTM_BUILD_DIR:-/tmp/lltm-gpu-build}
SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
PYTEST="$PY -m pytest -q -rs -p no:cacheprovider"

usage() {
    sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 2
}
[ $# -ge 1 ] || usage
MODES=()
LAB=sequence
while [ $# -gt 0 ]; do
    case "$1" in
    tests) MODES+=(tests-cuda tests-rest) ;;
    tests-cuda | tests-rest | sanitize | bench | rows | multi) MODES+=("$1") ;;
    lab)
        MODES+=(lab)
        case "${2:-}" in sequence | cell | exchange | wavefront | profile) LAB=$2; shift ;; esac ;;
    -h | --help) usage ;;
    *) echo "unknown mode '$1' (tests, tests-cuda, tests-rest, sanitize, bench, rows, multi, lab [sequence|cell|exchange|wavefront|profile])"
       exit 2 ;;
    esac
    shift
done

# --- stages: a name, a time limit, a log file, a command --------------------
declare -a NAMES STATUS SECONDS_TAKEN
stage() {
    local name=$1 limit=$2 log=$3
    shift 3
    local t0=$SECONDS
    echo "=== $name: $*" | tee "$OUT/$log"
    timeout "$limit" "$@" >>"$OUT/$log" 2>&1
    local rc=$?
    NAMES+=("$name")
    STATUS+=("$([ $rc -eq 0 ] && echo ok || { [ $rc -eq 124 ] && echo TIMEOUT || echo "FAIL($rc)"; })")
    SECONDS_TAKEN+=($((SECONDS - t0)))
    tail -n +2 "$OUT/$log" | tail -n 8
    return $rc
}
stage_table() {
    echo
    echo "| stage | result | seconds |"
    echo "|---|---|---|"
    for i in "${!NAMES[@]}"; do
        echo "| ${NAMES[$i]} | ${STATUS[$i]} | ${SECONDS_TAKEN[$i]} |"
    done
}
stages_ok() {
    for i in "${!STATUS[@]}"; do [ "${STATUS[$i]}" = ok ] || return 1; done
    return 0
}
show() {  # show PATTERN LOG...: the lines that matter, where the logs exist
    local pattern=$1
    shift
    for log in "$@"; do
        [ -f "$OUT/$log" ] && grep -hE "$pattern" "$OUT/$log"
    done
    return 0
}

# --- build and load ---------------------------------------------------------
# CUDA objects compiled beforehand without a GPU (scripts/prebuild_cuda.py,
# carried in build/prebuilt-cuda): the build copies those whose fingerprint
# matches instead of spending minutes of this machine's time in nvcc, and
# compiles the rest. Should a build from them fail, it is redone from source.
if [ -z "${LLTM_PREBUILT_CUDA:-}" ] && [ -d build/prebuilt-cuda ]; then
    export LLTM_PREBUILT_CUDA=$PWD/build/prebuilt-cuda
fi
{
    nvidia-smi -L
    $PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
    "$NVCC" --version | tail -1
    echo "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-(unset: the build targets the visible GPUs)}"
    lscpu | grep -E "^Model name|^CPU\(s\)"
} 2>&1 | tee "$OUT/env.log"
if ! stage build 300 build.log $PY lltm/build.py --cuda yes -v && [ -n "${LLTM_PREBUILT_CUDA:-}" ]; then
    unset LLTM_PREBUILT_CUDA
    rm -rf "$LLTM_BUILD_DIR"
    stage build-from-source 300 build_retry.log $PY lltm/build.py --cuda yes -v
fi
stage load 60 load.log $PY -c "import torch, lltm; from lltm import _native; \
assert torch.cuda.is_available(), 'no GPU'; assert _native.has_cuda_kernels(), 'CUDA kernels not loaded'; \
print('loaded on torch', torch.__version__, _native._loaded['cuda']._name, torch.cuda.get_device_name())"

# --- modes ------------------------------------------------------------------
sanitize() {  # sanitize TOOL DRIVER SECONDS [ARGS]
    local tool=$1 driver=$2 seconds=$3 uncached=()
    shift 3
    # memcheck sees an access past a tensor only where the tensor is an
    # allocation of its own: torch's caching allocator cuts them out of
    # larger segments (torch reads the variable's presence, not its value;
    # racecheck looks at shared memory and keeps the allocator: faster)
    [ "$tool" = memcheck ] && uncached=(PYTORCH_NO_CUDA_MEMORY_CACHING=1)
    stage "$tool-$driver" "$seconds" "${tool}_$driver.log" env "${uncached[@]}" \
        "$SAN" --tool "$tool" --error-exitcode 9 --print-limit 20 $PY \
        "scripts/sanitize_$driver.py" "$@"
}
# tests-cuda's files; tests-rest runs all the others
CUDA_TEST_FILES=(tests/test_cuda_sequence.py tests/test_cuda_sequence_lengths.py
    tests/test_cuda_wavefront.py tests/test_cuda_cell.py tests/test_lstm_cuda.py
    tests/test_graph_capture.py tests/test_sharing.py tests/test_lstm_bidirectional.py
    tests/test_compile_graphs.py tests/test_stack.py tests/test_cuda_tf32.py
    tests/test_cuda_settings.py)
for MODE in "${MODES[@]}"; do
    case "$MODE" in
    tests-cuda)
        # eight processes (pytest-xdist, a file each at a time)
        stage tests-cuda 540 tests_cuda.log $PYTEST -n 8 --dist loadfile --durations=12 \
            "${CUDA_TEST_FILES[@]}"
        stage launch-counts 60 launches.log $PY -m pytest -q -s -p no:cacheprovider \
            tests/test_cuda_cell.py -k launch_counts
        ;;
    tests-rest)
        # the wheel test needs the package index, which this machine cannot reach
        stage tests-rest 540 tests_rest.log $PYTEST -n 8 --dist loadfile --durations=12 tests \
            --ignore=tests/test_wheel.py "${CUDA_TEST_FILES[@]/#/--ignore=}"
        ;;
    sanitize)
        sanitize memcheck cuda 120
        sanitize racecheck cuda 120 --quick
        sanitize memcheck sequence 120
        sanitize racecheck sequence 240 --quick
        ;;
    bench)
        stage bench-default 300 bench_default.log $PY -m lltm.bench --device cuda \
            --json "$OUT/bench_default.json" --plot "$OUT/bench_default.png"
        stage bench-large 150 bench_large.log $PY -m lltm.bench --device cuda \
            --sizes 256,512,1024 --dtype float32,bfloat16 --seq-len 0 --json "$OUT/bench_large.json"
        stage bench-t1000 120 bench_t1000.log $PY -m lltm.bench --device cuda \
            --sizes 16,32,128 --seq-len 1000 --only lltm,lstm --json "$OUT/bench_t1000.json"
        stage host-floor 120 host_floor.log $PY dev/timing/host_floor.py --device cuda \
            --sizes 16,32,128 --single-thread
        stage compiled-model 300 compiled_model.log $PY dev/timing/compiled_model.py \
            --device cuda
        ;;
    rows)
        stage rows-tests 420 rows_tests.log $PYTEST tests/test_cuda_sequence_lengths.py \
            tests/test_sequence_lengths.py tests/test_lstm_lengths.py
        stage rows-bench 300 rows_bench.log $PY -m lltm.bench --rows all --device cuda \
            --json "$OUT/rows.json"
        ;;
    multi)
        stage second-device 150 second_device.log $PYTEST tests/multi_gpu \
            tests/test_cuda_cell.py tests/test_cuda_sequence.py -k second_device
        stage ddp-fsdp-tests 300 ddp.log $PYTEST -n 4 --dist load tests/test_ddp.py \
            tests/test_fsdp.py
        stage features-nccl 150 features_nccl.log $PYTEST tests/test_features.py -k nccl
        stage multi-gpu-nccl 180 multi_gpu.log $PY -m torch.distributed.run --standalone \
            --nproc_per_node=2 scripts/multi_gpu.py --backend nccl --device cuda
        stage torchrun-example 110 torchrun.log $PY -m torch.distributed.run --standalone \
            --nproc_per_node=2 -m lltm.examples.train --quick --device cuda --no-progress --plot ""
        ;;
    lab)
        case "$LAB" in
        sequence)
            stage sequence-timing 300 sequence_timing.log $PY dev/timing/sequence_timing.py \
                --json "$OUT/sequence_timing.json"
            stage sequence-kernels 90 sequence_kernels.log bash -c \
                "$PY dev/timing/sequence_profile.py 16 32 128 1000 --table && \
                 $PY dev/timing/sequence_profile.py 64 256 512 100 --table"
            stage sequence-host 90 sequence_host.log $PY dev/timing/sequence_host.py
            ;;
        cell)
            stage cell-tiles 150 cell_tiles.log bash -c "'$NVCC' -O3 -std=c++17 \
                -gencode=arch=compute_90,code=sm_90 -Icsrc/core dev/timing/cell_tiles.cu \
                -o '$OUT/cell_tiles' && '$OUT/cell_tiles'"
            stage cell-timing 240 cell_timing.log $PY dev/timing/cuda_timing.py \
                --json "$OUT/cell_timing.json"
            stage host-floor 120 host_floor.log $PY dev/timing/host_floor.py --device cuda \
                --sizes 16,32,128 --single-thread
            ;;
        exchange)
            stage exchange 150 exchange.log bash -c "'$NVCC' -O3 -std=c++17 -arch=sm_90 \
                dev/timing/exchange_bench.cu -o '$OUT/exchange_bench' && '$OUT/exchange_bench' 1000"
            ;;
        wavefront)
            stage wavefront-timing 300 wavefront_timing.log $PY dev/timing/wavefront_timing.py \
                --shapes 1x64,16x64,64x64,16x128,64x128,16x256,64x256,16x512 --layers 3 \
                --chunks auto,1,2,3,4,6 --dtypes float32,bfloat16 --json "$OUT/wavefront.json"
            stage graph-timeline 120 graph_timeline.log $PY dev/timing/graph_timeline.py \
                16:256:3:4:float32 64:64:3:2:float32 16:128:3:3:bfloat16 1:256:3:4:float32 \
                --out "$OUT/graph_timeline.txt"
            ;;
        profile)
            # warp states and stall sampling per SASS line of the sequence kernels
            # (clocks left alone); then the library's SASS
            stage profile 240 profile.log "$NCU" --clock-control none \
                -k "regex:sequence|cluster" --launch-count 2 --section LaunchStats \
                --section WarpStateStats --section SchedulerStats --section SourceCounters \
                -f -o "$OUT/sequence" $PY dev/timing/sequence_profile.py 16 32 128 100
            "$NCU" -i "$OUT/sequence.ncu-rep" --page details > "$OUT/profile_details.txt" 2>&1
            "$NCU" -i "$OUT/sequence.ncu-rep" --page source --csv --print-source sass \
                > "$OUT/profile_source.csv" 2>&1
            so=$(find "$LLTM_BUILD_DIR" -name 'liblltm_cuda*.so' | head -1)
            [ -n "$so" ] && cuobjdump -sass "$so" > "$OUT/sass.txt" 2>&1
            ;;
        esac
        ;;
    esac
done

# --- summary ----------------------------------------------------------------
stage_table
show "^loaded on torch" load.log
for log in tests_cuda.log tests_rest.log second_device.log ddp.log; do
    show "passed|failed" "$log" | tail -1
done
show "^[0-9]+ processes|: ok \(|checks passed|Error" multi_gpu.log
show "ERROR SUMMARY|RACECHECK SUMMARY|sanitize driver" memcheck_cuda.log racecheck_cuda.log \
    memcheck_sequence.log racecheck_sequence.log
show "^launches" launches.log
show "^(B=|forward|bwd_|empty)" cell_tiles.log
show "^B=" host_floor.log
show "^\| (lltm|reference) |graph break|cudagraph skip" compiled_model.log
show "^\| (B|16|64)|reference cells /|^check" sequence_timing.log
show "Warp Cycles Per Issued|Issued Warp Per Scheduler|Duration" profile_details.txt
stages_ok
