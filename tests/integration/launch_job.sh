# Sourced by the scripts that run one `chainps launch` job (status_watch.sh, metrics.sh,
# ckpt_fast.sh): the Python to parse with, a scratch directory, and a trap that ends the job by
# launch's PID (launch ends its children by theirs) and removes the directory. The caller sets
# launch_pid.
py=/usr/bin/python3
[ -x "$py" ] || py=python3
dir=$(mktemp -d)
launch_pid=
cleanup() {
    if [ -n "$launch_pid" ] && kill -0 "$launch_pid" 2>/dev/null; then
        kill "$launch_pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$launch_pid" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$launch_pid" 2>/dev/null || true
    fi
    rm -rf "$dir"
}
trap cleanup EXIT
# The scheduler address `chainps launch` prints in its log FILE ("launch: scheduler on H:P, ..."),
# waited for up to 10 s; empty if it never came.
scheduler_addr() {
    local a=
    for _ in $(seq 100); do
        a=$(sed -n 's/^launch: scheduler on \([0-9.:]*\),.*/\1/p' "$1")
        [ -n "$a" ] && break
        sleep 0.1
    done
    echo "$a"
}
# End the job by launch's PID (it stops its scheduler, servers and workers by theirs); waits up to
# 10 s. Returns 1 if launch is still there then (the EXIT trap kills it).
stop_launch() {
    kill "$launch_pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$launch_pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$launch_pid" 2>/dev/null && return 1
    wait "$launch_pid" || true
    launch_pid=
}
# The job's status as JSON, and the step it is at (0 before it runs), for a caller that set cps
# (the CLI), addr (the scheduler's) and wrote its key to $dir/job.key.
status_json() { "$cps" status --secret-file "$dir/job.key" --scheduler "$addr" --json 2>/dev/null; }
step_now() {
    local n
    n=$(status_json | "$py" -c 'import json,sys; d=json.load(sys.stdin); print(d["step"] if d["running"] else 0)' 2>/dev/null) || n=0
    case $n in '' | *[!0-9]*) n=0 ;; esac
    echo "$n"
}
