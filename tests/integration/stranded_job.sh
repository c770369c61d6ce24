# shellcheck shell=bash
# Sourced by the scripts of a stranded range (empty_last_replica.sh, stranded_restore.sh) and by
# restore_kill.sh: the Python to parse with, a scratch directory, processes ended by their PIDs
# (the caller appends each to pids), free loopback ports, and the incident itself.
py=/usr/bin/python3
[ -x "$py" ] || py=python3
dir=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    sleep 0.5
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    [ -n "${KEEP:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$dir"/*.log; do echo "== $f"; tail -15 "$f"; done; exit 1; }
free_ports() { # N: N free loopback ports on one line
    "$py" -c '
import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]
for x in s: x.bind(("127.0.0.1", 0))
print(*[x.getsockname()[1] for x in s])' "$1"
}
export CHAINPS_INSECURE=1
ended() { # PID...: each ends (TERM, then KILL after 10 s)
    for p in "$@"; do kill "$p" 2>/dev/null || true; done
    for p in "$@"; do
        for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$p" 2>/dev/null || true
    done
}
wait_for() { # FILE PATTERN SECONDS
    for _ in $(seq $(($3 * 10))); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}
# Both servers of a 2-replica job die, server 0 (PID $2) first, so server 1 (PID $3) alone
# acknowledges updates for a second; the scheduler (log $1) declares each dead. The caller then
# brings server 1 back on an empty disk.
both_servers_die() { # SCHED_LOG S0_PID S1_PID
    kill -9 "$2"
    wait_for "$1" "(rank 0) silent for .* declared dead" 20 || fail "server 0 not declared dead"
    sleep 1
    kill -9 "$3"
    wait_for "$1" "(rank 1) silent for .* declared dead" 20 || fail "server 1 not declared dead"
}
# The XXH3-64 of lsq/w's bytes in an export (what lsq_worker logs at resume), checking its shape
# and step.
ckpt_hash() { # SAFETENSORS STEP DIM
    "$py" - "$@" <<'PY'
import ctypes, json, struct, sys
import numpy as np
f = open(sys.argv[1], "rb")
n = struct.unpack("<Q", f.read(8))[0]
h = json.loads(f.read(n))
e = h["lsq/w"]
assert e["dtype"] == "F32" and e["shape"] == [int(sys.argv[3])], e
assert h["__metadata__"]["step"] == sys.argv[2], h["__metadata__"]
b, end = e["data_offsets"]
f.seek(8 + n + b)
raw = np.frombuffer(f.read(end - b), dtype="<f4").tobytes()
x = ctypes.CDLL("libxxhash.so.0")
x.XXH3_64bits.restype = ctypes.c_uint64
print("%016x" % x.XXH3_64bits(raw, ctypes.c_size_t(len(raw))))
PY
}


# A sync job of 2 servers (chains of 2) and 2 workers on scheduler port $P, with the caller's
# server and worker functions: sets sp, s0, s1, w0, w1. start_job STEP_MS SECONDS [scheduler flags]
# shellcheck disable=SC2034,SC2154 # cps and the PIDs are the caller's
start_job() {
    "$cps" scheduler --servers 2 --workers 2 --replicas 2 --port "$P" --data "$dir/sched" "${@:3}" \
        >"$dir/sched.log" 2>&1 &
    sp=$!
    pids+=("$sp")
    server 0 "$P" s0.log
    s0=${pids[-1]}
    server 1 "$P" s1.log
    s1=${pids[-1]}
    worker "$P" w0.log --steps 100000000 --step-ms "$1"
    w0=${pids[-1]}
    worker "$P" w1.log --steps 100000000 --step-ms "$1"
    w1=${pids[-1]}
    wait_for "$dir/sched.log" "connected 2 workers and 2 servers" "$2" || fail "the job did not start"
}
stranded_metric() { # METRICS_PORT -> the gauge's value
    "$py" -c 'import sys, urllib.request
page = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read().decode()
print([l.split()[1] for l in page.splitlines() if l.startswith("chainps_ranges_stranded ")][0])' "$1"
}
# The gauge is published from the scheduler's loop a moment after the view changes: poll it.
stranded_metric_is() { # METRICS_PORT VALUE
    for _ in $(seq 50); do
        [ "$(stranded_metric "$1")" = "$2" ] && return 0
        sleep 0.1
    done
    return 1
}
