#!/usr/bin/env bash
# Issue 28 (review): a range's only replica comes back on an empty disk. By default the range stays
# unavailable and the empty server is kept out: one ERROR per range naming both servers and the
# ways out (not repeated on every HELLO retry), `chainps status` (text and JSON) and /metrics show
# it; a worker's calls on the range wait, then fail with CPS_EUNAVAILABLE (a second worker, with a
# short CHAINPS_UNAVAILABLE_TIMEOUT_MS). The operator then accepts the rollback, the fallback
# kept stopped: the scheduler restarted on its --data with --allow-rollback still knows the
# fallback (persisted), gives it the range at ERROR, and the empty server copies it back.
# usage: empty_last_replica.sh CHAINPS LSQ_WORKER
set -euo pipefail
cps=$1
lsq=$2
# shellcheck source=stranded_job.sh
. "$(dirname "$0")/stranded_job.sh"
# Free loopback ports: scheduler, metrics, server 0, server 1 (the servers come back on theirs).
read -r P M P0 P1 < <(free_ports 4)
sched() { exec "$cps" scheduler --servers 2 --workers 2 --replicas 2 --port "$P" --data "$dir/sched" "$@"; }
server() { # RANK PORT LOG [flags]
    "$cps" server --scheduler "127.0.0.1:$P" --data "$dir/s$1" --rank "$1" --port "$2" "${@:4}" \
        >"$dir/$3" 2>&1 &
    pids+=("$!")
}
sched --metrics-port "$M" >"$dir/sched.log" 2>&1 &
sp=$!
pids+=("$sp")
server 0 "$P0" s0.log
s0=${pids[-1]}
server 1 "$P1" s1.log
s1=${pids[-1]}
# One worker waits out the incident; the other gives up on the range after 1.5 s.
CHAINPS_UNAVAILABLE_TIMEOUT_MS=600000 CHAINPS_SCHEDULER=127.0.0.1:$P "$lsq" --steps 100000000 \
    >"$dir/w.log" 2>&1 &
pids+=("$!")
CHAINPS_UNAVAILABLE_TIMEOUT_MS=1500 CHAINPS_SCHEDULER=127.0.0.1:$P "$lsq" --steps 100000000 \
    >"$dir/w2.log" 2>&1 &
pids+=("$!")
wait_for "$dir/sched.log" "connected 2 workers and 2 servers" 20 || fail "the job did not start"
sleep 1
both_servers_die "$dir/sched.log" "$s0" "$s1"
server 1 "$P1" s1b.log --reset-data
s1b=${pids[-1]}
wait_for "$dir/sched.log" "range 1 is UNAVAILABLE" 20 || fail "no ERROR for the stranded range"
sleep 2 # four HELLO retries
n=$(grep -c "ERROR .*is UNAVAILABLE: server [0-9]*, its only replica, came back with an empty store and is kept out" "$dir/sched.log" || true)
[ "$n" = 2 ] || fail "$n UNAVAILABLE lines, not one per range (2)"
grep -q "ERROR .*range [0-9]*: ways out: start server [0-9]* on its old disk, or restore a checkpoint, or (losing those updates) keep server [0-9]* stopped, restart the scheduler with --allow-rollback, then start server [0-9]* once 'ROLLED BACK' is logged" "$dir/sched.log" ||
    fail "the ERROR names no way out"
# The calls on a stranded range wait, then fail (docs/operations.md).
wait_for "$dir/w2.log" "range [0-9]* unavailable for 1500 ms: failing the request" 20 ||
    fail "the worker's call on the unavailable range did not fail"
wait_for "$dir/w2.log" "training failed: no replica available" 10 ||
    fail "the worker's call did not fail with CPS_EUNAVAILABLE"
"$cps" status --scheduler "127.0.0.1:$P" >"$dir/status.txt" 2>/dev/null || fail "status"
[ "$(grep -c "UNAVAILABLE: server .* kept out (fallback: server" "$dir/status.txt")" = 2 ] ||
    { cat "$dir/status.txt"; fail "status shows no stranded range"; }
"$cps" status --scheduler "127.0.0.1:$P" --json >"$dir/status.json" 2>/dev/null || fail "status --json"
"$py" - "$dir/status.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
st = [r["stranded"] for r in d["ranges"] if "stranded" in r]
assert len(st) == 2 and all(s["empty"] and s["fallback"] and s["empty"] != s["fallback"] for s in st), d["ranges"]
PY
stranded_metric_is "$M" 2 || fail "metrics: chainps_ranges_stranded is not 2"
grep -q "ROLLED BACK (--allow-rollback)" "$dir/sched.log" && fail "rolled back without --allow-rollback"

# The operator accepts losing the updates: the scheduler again, on its --data, with the flag.
kill -9 "$sp"
wait "$sp" 2>/dev/null || true
sched --allow-rollback >"$dir/sched2.log" 2>&1 &
pids+=("$!")
wait_for "$dir/sched2.log" "resumed the job" 20 || fail "the scheduler did not resume"
grep -q -- "--allow-rollback: 2 range(s) (0, 1) go to their fallback" "$dir/sched2.log" ||
    fail "the restarted scheduler does not say which ranges the flag holds for"
wait_for "$dir/sched2.log" "range 1 ROLLED BACK (--allow-rollback)" 20 || fail "no rollback"
[ "$(grep -c "ERROR .*ROLLED BACK (--allow-rollback): server [0-9]*, its only replica, came back empty; server [0-9]*, which left the range at epoch" "$dir/sched2.log")" = 2 ] ||
    fail "not one rollback ERROR per range"
server 0 "$P0" s0b.log # the fallback, on its disk
s0=${pids[-1]}
s1=$s1b # let in by the rollback, it copied the ranges back
back=0
for _ in $(seq 300); do
    if "$cps" status --scheduler "127.0.0.1:$P" --json >"$dir/s2.json" 2>/dev/null &&
        "$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(0 if all(len(r["chain"]) == 2 and "stranded" not in r for r in d["ranges"]) else 1)' "$dir/s2.json"; then
        back=1
        break
    fi
    sleep 0.1
done
[ "$back" = 1 ] || fail "the ranges did not come back to 2 replicas"

# Without a fallback: the same two deaths, but server 0 comes back (on its disk) before server 1
# (empty): let in, it drops the ranges, and status says "(fallback: none)".
sleep 2 # server 1's copies confirm they hold everything
kill -9 "$s0"
wait_for "$dir/sched2.log" "(rank 0) silent for .* declared dead" 20 || fail "server 0 not declared dead (2)"
sleep 1
kill -9 "$s1"
wait_for "$dir/sched2.log" "(rank 1) silent for .* declared dead" 20 || fail "server 1 not declared dead (2)"
n=$(grep -c "a node came back" "$dir/sched2.log" || true)
server 0 "$P0" s0c.log
for _ in $(seq 200); do
    [ "$(grep -c "a node came back" "$dir/sched2.log" || true)" -gt "$n" ] && break
    sleep 0.1
done
server 1 "$P1" s1c.log --reset-data
wait_for "$dir/sched2.log" "is UNAVAILABLE: server [0-9]*, its only replica, came back with an empty store, and no other server holds the range" 20 ||
    fail "no ERROR without a fallback"
"$cps" status --scheduler "127.0.0.1:$P" >"$dir/status2.txt" 2>/dev/null || fail "status (2)"
[ "$(grep -c "UNAVAILABLE: server .* kept out (fallback: none;" "$dir/status2.txt")" = 2 ] ||
    { cat "$dir/status2.txt"; fail "status does not say the ranges have no fallback"; }
echo "PASS"
