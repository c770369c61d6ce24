#!/bin/bash
# `chainps launch` is as resilient as a cluster started by hand (issue 12): kill -9 of the
# scheduler mid-run (it is restarted on its data directory and the sync job ends bitwise as a
# fault-free run), of a worker (dropped: the other one finishes), and of a worker under
# --restart-workers (a new one takes its rank, resumes at the step the job is on and both ranks
# finish). Every process is a child of launch, which ends them by PID; the test kills only
# launch's own children. Each kill falls 1.5 s into training (checked).
# WORKLOAD=lsq (default) or fmnist (tests/integration/workload.sh): PROGRAM is lsq_worker or
# examples/fmnist (6 tensors; its replacement worker resumes at cps_start_step).
# usage: [WORKLOAD=fmnist] launch_resilience.sh CHAINPS PROGRAM
set -u
cps=$1
bin=$2
. "$(dirname "$0")/workload.sh"
workload_need_data
export CHAINPS_WORKER_DEAD_AFTER_MS=1000 # a dead worker's rank is free again after 1 s
job=(--servers 3 --workers 2 --mode sync --timeout 150)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/chainps-launch-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
if [ "$WORKLOAD" = fmnist ]; then
    # 500 steps: 3-8 s of training here, so a kill 1.5 s in leaves the job most of its steps.
    # shellcheck disable=SC2207
    prog=("$bin" $(workload_fmnist_args 500 "$tmp/fm" 10))
else
    prog=("$bin" --steps 500 --step-ms 8)
fi
fail() { echo "FAIL: $*"; exit 1; }
checksums() { sed -n 's/.*final: .*checksum \([0-9a-f]*\)$/\1/p' "$1" | sort -u; }

# A child of launch by role: "scheduler" (chainps scheduler) or a worker's rank.
child() {
    local lp=$1 what=$2 p
    for p in $(pgrep -P "$lp"); do
        if [ "$what" = scheduler ]; then
            tr '\0' ' ' </proc/$p/cmdline 2>/dev/null | grep -q " scheduler " && { echo "$p"; return; }
        elif tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx "CHAINPS_RANK=$what"; then
            echo "$p"; return
        fi
    done
}

# run NAME VICTIM [launch flags...]: launch the job, SIGKILL VICTIM 1.5 s into training.
run() {
    local name=$1 victim=$2
    shift 2
    "$cps" launch "${job[@]}" "$@" -- "${prog[@]}" >"$tmp/$name.log" 2>&1 &
    local lp=$!
    if [ "$victim" != none ]; then
        for _ in $(seq 300); do grep -q "$(workload_training_re)" "$tmp/$name.log" && break; sleep 0.1; done
        grep -q "$(workload_training_re)" "$tmp/$name.log" ||
            { kill "$lp"; wait "$lp"; fail "$name: training did not start within 30 s"; }
        sleep 1.5
        local v
        v=$(child "$lp" "$victim")
        [ -n "$v" ] || { kill "$lp"; wait "$lp"; fail "$name: no $victim process to kill"; }
        # A kill after a worker finished would check nothing.
        ! grep -q "final: " "$tmp/$name.log" ||
            { kill "$lp"; wait "$lp"; fail "$name: a worker finished before the kill: make the job longer"; }
        kill -9 "$v"
    fi
    wait "$lp"
    echo "$?" >"$tmp/$name.rc"
}
# A worker's final line, by rank, as launch prefixes it.
finals() { grep -c "^\[worker $2\] final: " "$tmp/$1.log"; }

run ref none
[ "$(cat "$tmp/ref.rc")" = 0 ] || { tail -20 "$tmp/ref.log"; fail "the fault-free job failed"; }
ref=$(checksums "$tmp/ref.log")
# The scheduler-killed run keeps both worker processes in sync mode: lsq_worker's trajectory
# hash (every step's pulled weights) must be the fault-free run's too.
ref_traj=
[ "$WORKLOAD" = fmnist ] || ref_traj=$(workload_ref_trajectory "$tmp/ref.log") || fail "$ref_traj"

run sched scheduler
grep -E "^launch:" "$tmp/sched.log"
[ "$(cat "$tmp/sched.rc")" = 0 ] || { tail -30 "$tmp/sched.log"; fail "the job with its scheduler killed failed"; }
grep -q "restarted the scheduler" "$tmp/sched.log" || fail "the scheduler was not restarted"
[ "$(checksums "$tmp/sched.log")" = "$ref" ] || fail "scheduler killed: checksum $(checksums "$tmp/sched.log"), fault-free $ref"
[ "$(workload_trajectories "$tmp/sched.log")" = "$ref_traj" ] ||
    fail "scheduler killed: trajectory $(workload_trajectories "$tmp/sched.log"), fault-free $ref_traj"

run drop 1
grep -E "^launch:" "$tmp/drop.log"
[ "$(cat "$tmp/drop.rc")" = 0 ] || { tail -30 "$tmp/drop.log"; fail "the job with a worker killed failed"; }
grep -q "worker 1 died (killed by signal 9.*; the job goes on without it" "$tmp/drop.log" ||
    fail "no drop reported"
[ "$(finals drop 0)" = 1 ] || fail "rank 0 did not finish"

run restart 1 --restart-workers
grep -E "^launch:" "$tmp/restart.log"
[ "$(cat "$tmp/restart.rc")" = 0 ] || { tail -30 "$tmp/restart.log"; fail "the job with a worker replaced failed"; }
grep -q "restarted worker 1" "$tmp/restart.log" || fail "worker 1 was not restarted"
[ "$(finals restart 0)" = 1 ] || fail "rank 0 did not finish"
[ "$(finals restart 1)" = 1 ] || fail "the replacement of rank 1 did not finish"
echo "PASS: $WORKLOAD: scheduler restarted (bitwise $ref${ref_traj:+, trajectory $ref_traj}), a dead worker dropped, a dead worker replaced"
