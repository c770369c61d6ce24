# Process bookkeeping shared by the bench drivers that start a cluster process by process
# (run_failover.sh, run_catchup.sh). Source it after setting `res` (a results file) and `work`
# (a log directory); append every PID started to `pids` (lib_pids.sh). On exit every one of them
# is killed by PID, and res/work are removed unless KEEP=1.
# shellcheck source=lib_pids.sh
. "$here/lib_pids.sh"

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
