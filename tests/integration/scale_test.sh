#!/bin/sh
# A sync job on 2 servers (chains of 2, 8 ranges) grows to 4 servers while it trains, is
# rebalanced (each server holds a quarter of the values), and shrinks back to 2 by draining the
# two it gained (one by `chainps drain`, one by SIGTERM); it must end with exactly the parameters
# of a run that never scaled. With
# `kill`, server rank 0 is also SIGKILLed (and restarted by launch) while the ranges move.
# WORKLOAD=lsq (default) or fmnist (tests/integration/workload.sh): PROGRAM is lsq_worker or
# examples/fmnist (the MLP's 6 tensors: fc1.weight in chunks over all 8 ranges, the others whole).
# usage: [WORKLOAD=fmnist] scale_test.sh CHAINPS PROGRAM [kill]
set -eu
cps=$1
bin=$2
variant=${3:-plain}
. "$(dirname "$0")/workload.sh"
workload_need_data
py=/usr/bin/python3
[ -x "$py" ] || py=python3
dir=$(mktemp -d)
launch_pid=
spids=
cleanup() {
    for p in $spids $launch_pid; do kill "$p" 2>/dev/null || true; done
    sleep 0.5
    for p in $spids $launch_pid; do kill -9 "$p" 2>/dev/null || true; done
    [ -n "${KEEP:-}" ] && echo "kept $dir" || rm -rf "$dir"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    tail -40 "$dir/launch.log" 2>/dev/null || true
    exit 1
}
job="--servers 2 --workers 2 --replicas 2 --ranges 8 --mode sync --timeout 150"
if [ "$WORKLOAD" = fmnist ]; then
    # Unpaced: 1200 steps train for 8-15 s here, through the joins and both drains. Its tensors
    # are not cut evenly over the ranges, so a balanced server holds 4 ranges, not a set count
    # of values.
    prog="$bin $(workload_fmnist_args 1200 "$dir/fm" 100)"
    pace=
    values_each=0
else
    # 140,000 values: one 17,500-value chunk in each of the 8 ranges.
    prog="$bin --dim 140000 --samples 8 --steps 1500 --lr 1e-5 --tol 1e9"
    # Paced (3 ms a step, ~8 s) so the servers join and drain while it trains; pacing changes
    # no value.
    pace="--step-ms 3"
    values_each=70000
fi
# lsq_worker's trajectory hash too (every step's pulled values; fmnist prints none): sync, the
# same two worker processes, so the scaled run must pull what the fixed-size run pulled at every
# step, not only end with the same values.
"$cps" launch $job -- $prog >"$dir/ref.log" 2>&1 || true
ref=$(sed -n 's/.*final: .*checksum \([0-9a-f]*\)$/\1/p' "$dir/ref.log" | sort -u)
[ -n "$ref" ] || fail "the fixed-size run gave no checksum"
ref_traj=
[ "$WORKLOAD" = fmnist ] || ref_traj=$(workload_ref_trajectory "$dir/ref.log") || fail "$ref_traj"

"$cps" secret "$dir/secret" >/dev/null
extra=
[ "$variant" = kill ] && extra="--kill-at 2 --kill-server 0"
"$cps" launch $job --secret-file "$dir/secret" $extra -- $prog $pace >"$dir/launch.log" 2>&1 &
launch_pid=$!
wait_for() { # SECONDS COMMAND...: retry every 0.2 s
    t=$(($1 * 5))
    shift
    while [ $t -gt 0 ]; do
        if "$@"; then return 0; fi
        t=$((t - 1))
        sleep 0.2
    done
    return 1
}
started() { grep -q "connected 2 workers and 2 servers" "$dir/launch.log"; }
wait_for 30 started || fail "the job did not start"
# fmnist loads its data set after joining: the servers join once it trains.
training() { grep -q "$(workload_training_re)" "$dir/launch.log"; }
wait_for 30 training || fail "the job did not start training"
port=$(sed -n 's/^launch: scheduler on 127.0.0.1:\([0-9]*\),.*/\1/p' "$dir/launch.log")
[ -n "$port" ] || fail "no scheduler port in launch's output"
sched="--scheduler 127.0.0.1:$port --secret-file $dir/secret"

for k in 0 1; do
    "$cps" server $sched --data "$dir/extra-$k" >"$dir/extra-$k.log" 2>&1 &
    spids="$spids $!"
done

# Balanced: 4 live servers, each in 4 of the 8 chains of 2, holding values (lsq: 70,000 of the
# 280,000 each).
balanced() {
    "$cps" status $sched --json 2>/dev/null >"$dir/status.json" || return 1
    "$py" - "$dir/status.json" "$values_each" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
want = int(sys.argv[2])
servers = [n for n in s["nodes"] if n["role"] == "server" and n["alive"]]
held = {n["id"]: sum(n["id"] in r["chain"] for r in s["ranges"]) for n in servers}
values = [n.get("values", -1) for n in servers]
ok = (len(servers) == 4 and all(h == 4 for h in held.values())
      and all(v == want if want else v > 0 for v in values))
sys.exit(0 if ok else 1)
EOF
}
wait_for 40 balanced || {
    cat "$dir/status.json" 2>/dev/null
    fail "the job did not reach 4 servers holding a quarter each"
}
echo "balanced: 4 servers, 4 ranges each; values $("$py" -c 'import json,sys; print([n.get("values") for n in json.load(sys.stdin)["nodes"] if n["role"]=="server" and n["alive"]])' <"$dir/status.json")"
if [ "$variant" = kill ]; then
    back() { grep -q "^launch: .* restarted server 0 " "$dir/launch.log"; }
    wait_for 30 back || fail "server 0 was not killed and restarted"
    # Its ranges must be whole again before the others can leave.
    whole() {
        "$cps" status $sched --json 2>/dev/null >"$dir/status.json" || return 1
        "$py" -c 'import json,sys; s=json.load(open(sys.argv[1])); a={n["id"] for n in s["nodes"] if n["alive"]}; sys.exit(0 if all(len(r["chain"])==2 and set(r["chain"])<=a for r in s["ranges"]) and sum(1 for n in s["nodes"] if n["role"]=="server" and n["alive"])==4 else 1)' "$dir/status.json"
    }
    wait_for 40 whole || fail "the ranges did not get back to 2 live replicas after the kill"
fi
"$cps" drain --server 2 $sched --timeout 60 || fail "drain of server rank 2 failed"
if [ "$variant" = kill ]; then
    "$cps" drain --server 3 $sched --timeout 60 || fail "drain of server rank 3 failed"
else
    # SIGTERM asks for the same drain: the server keeps serving until its ranges have moved.
    k=0
    grep -q "(rank 3)" "$dir/extra-1.log" && k=1
    victim=$(echo $spids | cut -d" " -f$((k + 1)))
    kill -TERM "$victim"
    drained() { grep -q "rank 3) is drained" "$dir/launch.log"; }
    wait_for 60 drained || fail "server rank 3 was not drained after SIGTERM"
    grep -q "SIGTERM: asking the scheduler" "$dir/extra-$k.log" || fail "no drain request on SIGTERM"
fi
kill -0 "$launch_pid" 2>/dev/null || fail "the job ended before the drains were done: make it longer"
gone() { ! kill -0 "$1" 2>/dev/null; }
for p in $spids; do
    wait_for 20 gone "$p" || fail "drained server (pid $p) did not exit"
    rc=0
    wait "$p" || rc=$?
    [ "$rc" = 0 ] || fail "a drained server exited $rc"
done
spids=
for k in 0 1; do
    grep -q "left its chain and dropped our copy" "$dir/extra-$k.log" ||
        fail "extra server $k never held and gave back a range"
done
wait_for 150 gone "$launch_pid" || fail "the job did not end"
rc=0
wait "$launch_pid" || rc=$?
launch_pid=
[ "$rc" = 0 ] || fail "the scaled job exited $rc"
got=$(sed -n 's/.*final: .*checksum \([0-9a-f]*\)$/\1/p' "$dir/launch.log" | sort -u)
[ "$got" = "$ref" ] || fail "fixed-size checksum '$ref', scaled '$got'"
got_traj=$(workload_trajectories "$dir/launch.log")
[ "$got_traj" = "$ref_traj" ] || fail "fixed-size trajectory '$ref_traj', scaled '$got_traj'"
grep -E "moves from server|drained" "$dir/launch.log" | head -3
echo "PASS ($WORKLOAD, $variant): grew 2 -> 4 servers, balanced, drained back to 2; parameters identical ($got${ref_traj:+, trajectory $got_traj})"
