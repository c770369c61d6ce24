# Sourced by the scripts that run one `chainps launch` job (status_watch.sh, metrics.sh): the
# Python to parse with, a scratch directory, and a trap that ends the job by launch's PID (launch
# ends its children by theirs) and removes the directory. The caller sets launch_pid.
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
