# gpu_stages.sh - sourced by the GPU scripts (gpu_check.sh, gpu_sequence.sh):
# run named stages with a time limit each, logging to $STAGE_LOGS, and print
# the stage table at the end.
#
#   STAGE_LOGS=dir STAGE_TAIL=lines; source scripts/gpu_stages.sh
#   stage NAME LIMIT_SECONDS LOGFILE CMD...   (returns CMD's status)
#   stage_table                               (| stage | result | seconds |)
#   stages_ok                                 (status 0 when every stage passed)
#   build_stage LIMIT_SECONDS LOGFILE         (lltm/build.py --cuda yes, see below)
declare -a NAMES STATUS SECONDS_TAKEN

# CUDA objects compiled beforehand without a GPU (scripts/prebuild_cuda.py,
# carried in build/prebuilt-cuda): the build copies those whose fingerprint
# matches instead of spending minutes of GPU-machine time in nvcc, and
# compiles the rest. Should a build from them fail, it is redone from source.
if [ -z "${LLTM_PREBUILT_CUDA:-}" ] && [ -d build/prebuilt-cuda ]; then
    export LLTM_PREBUILT_CUDA=$PWD/build/prebuilt-cuda
fi
build_stage() {
    local limit=$1 log=$2
    stage build "$limit" "$log" ${PY:-python3} lltm/build.py --cuda yes -v && return 0
    [ -n "${LLTM_PREBUILT_CUDA:-}" ] || return 1
    unset LLTM_PREBUILT_CUDA
    rm -rf "$LLTM_BUILD_DIR"
    stage build-from-source "$limit" "retry_$log" ${PY:-python3} lltm/build.py --cuda yes -v
}
stage() {
    local name=$1 limit=$2 log=$3
    shift 3
    local t0=$SECONDS
    echo "=== $name: $*" | tee "$STAGE_LOGS/$log"
    timeout "$limit" "$@" >>"$STAGE_LOGS/$log" 2>&1
    local rc=$?
    NAMES+=("$name")
    STATUS+=("$([ $rc -eq 0 ] && echo ok || { [ $rc -eq 124 ] && echo "TIMEOUT" || echo "FAIL($rc)"; })")
    SECONDS_TAKEN+=($((SECONDS - t0)))
    tail -n "${STAGE_TAIL:-12}" "$STAGE_LOGS/$log"
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
