# gpu_stages.sh - sourced by the GPU scripts (gpu_check.sh, gpu_sequence.sh):
# run named stages with a time limit each, logging to $STAGE_LOGS, and print
# the stage table at the end.
#
#   STAGE_LOGS=dir STAGE_TAIL=lines; source scripts/gpu_stages.sh
#   stage NAME LIMIT_SECONDS LOGFILE CMD...   (returns CMD's status)
#   stage_table                               (| stage | result | seconds |)
#   stages_ok                                 (status 0 when every stage passed)
declare -a NAMES STATUS SECONDS_TAKEN
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
