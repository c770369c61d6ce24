# Process bookkeeping shared by the bench drivers that start a cluster process by process
# (run_failover.sh, run_catchup.sh). Source it after setting `res` (a results file) and `work`
# (a log directory); append every PID started to `pids`. On exit every one of them is killed by
# PID, and res/work are removed unless KEEP=1.
pids=()

alive() {
    local st
    st=$(ps -o stat= -p "$1" 2>/dev/null)
    [ -n "$st" ] && [ "${st#Z}" = "$st" ]
}
reap() {
    local p
    for p in "$@"; do
        { wait "$p"; } 2>/dev/null
    done
}
signalled=0
stop_all() {
    # Every process this script started, by PID. They should exit by themselves once the worker
    # is done (the scheduler ends the job); whoever is left after 2 s gets SIGTERM, then SIGKILL.
    local p left sig
    for sig in none TERM KILL; do
        for _ in $(seq 20); do
            left=0
            for p in "${pids[@]}"; do
                alive "$p" && left=1
            done
            [ "$left" = 0 ] && break
            sleep 0.1
        done
        [ "$left" = 0 ] && break
        [ "$sig" = none ] && continue
        for p in "${pids[@]}"; do
            if alive "$p"; then
                echo "left after the job: pid $p ($(ps -o args= -p "$p" | cut -c1-40)...): SIG$sig" \
                    >>"$work/stop.log"
                kill "-$sig" "$p" 2>/dev/null
                signalled=$((signalled + 1))
            fi
        done
    done
    reap "${pids[@]}"
    pids=()
}
cleanup() {
    for p in "${pids[@]}"; do
        kill -KILL "$p" 2>/dev/null
    done
    reap "${pids[@]}"
    if [ "${KEEP:-0}" = 1 ]; then
        echo "raw results kept in $res, logs in $work"
    else
        rm -rf "$res" "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# The job's secret: every process started here (and `chainps status`) inherits it.
if [ -z "${CHAINPS_SECRET_FILE:-}" ] && [ "${CHAINPS_INSECURE:-0}" != 1 ]; then
    "$CHAINPS" secret "$work/job.secret" >/dev/null
    export CHAINPS_SECRET_FILE=$work/job.secret
fi
