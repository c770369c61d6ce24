#!/bin/sh
# Kill one server (by rank) during sync training and check that the job finishes with exactly
# the parameters of a fault-free run. With 3 servers on a ring, range 0's chain is rank 0 ->
# rank 1 -> rank 2: killing rank 0, 1 or 2 kills its head, middle or tail (lsq_worker's one
# tensor lies on range 2, 2 -> 0 -> 1: there they are its middle, tail and head). RANKS may name
# several ranks ("0 1 2"): one fault-free run, then one run per rank, each with that server
# killed (launch --kill-at) and restarted 2 s later.
# WORKLOAD=lsq (default) or fmnist (tests/integration/workload.sh): PROGRAM is lsq_worker or
# examples/fmnist. fmnist's tensors are spread over every range, so each kill there takes out
# the head of one range, the middle of another and the tail of a third, all holding data.
# LSQ_STEPS: lsq_worker's steps (20000; the sanitizer build's chaos.kill_chain trains 10000,
# which there still lasts twice as long as 20000 in Release). lsq trains with lr 40/LSQ_STEPS
# (0.002 for 20000): at lsq_worker's own 0.1 it reaches an exact float fixed point by step 550,
# long before the kill, after which its final weights no longer tell whether an update went
# missing; at 40/steps the weights still move at the last step. Besides the final checksum each
# lsq run's trajectory hash (every step's pulled weights, lsq_worker.c) must equal the fault-free
# run's: sync mode, the same two worker processes, so it is bitwise the same if no acknowledged
# update was lost, doubled or served stale by a new tail.
# LSQ_LR overrides the learning rate (0.1: the old converged runs, to compare).
# usage: [WORKLOAD=fmnist] [LSQ_STEPS=N] [LSQ_LR=X] kill_test.sh CHAINPS PROGRAM RANKS
set -eu
cps=$1
bin=$2
ranks=$3
. "$(dirname "$0")/workload.sh"
workload_need_data
dir=$(mktemp -d "${TMPDIR:-/tmp}/chainps-kill-XXXXXX")
trap 'rm -rf "$dir"' EXIT
job="--servers 3 --workers 2 --mode sync --timeout 180"
if [ "$WORKLOAD" = fmnist ]; then
    # 600 steps, 4-9 s of training here after 1-5 s of start-up (loading the data set): the
    # kill comes 2 s after training started in the fault-free run (launch --kill-at counts from
    # its own start).
    prog="$bin $(workload_fmnist_args 600 "$dir/fm" 10)"
    kill_after=2
else
    lsq_steps=${LSQ_STEPS:-20000}
    prog="$bin --steps $lsq_steps --lr ${LSQ_LR:-$(awk "BEGIN { print 40 / $lsq_steps }")}"
    kill_after=0
fi
# "checksum C" of every worker's final line (and workload_trajectories, lsq only): each must be
# one line, the same in every run.
checksums() { sed -n 's/.*final: .*checksum \([0-9a-f]*\)$/\1/p' "$1" | sort -u; }
"$cps" launch $job -- $prog >"$dir/ref.log" 2>&1 &
ref_pid=$!
t=0 # tenths of a second until the fault-free run trained
while kill -0 $ref_pid 2>/dev/null && ! grep -q "$(workload_training_re)" "$dir/ref.log"; do
    sleep 0.1
    t=$((t + 1))
done
wait $ref_pid || {
    tail -20 "$dir/ref.log"
    echo "FAIL: the fault-free job failed"
    exit 1
}
ref=$(checksums "$dir/ref.log")
ref_traj=
[ "$WORKLOAD" = fmnist ] || ref_traj=$(workload_ref_trajectory "$dir/ref.log") || {
    echo "FAIL: $ref_traj"
    exit 1
}
kill_at=$(((t + 9) / 10 + kill_after))
[ $kill_at -ge 1 ] || kill_at=1
echo "the fault-free run trained after $((t / 10)).$((t % 10)) s: kills at $kill_at s"
for rank in $ranks; do
    log="$dir/kill$rank.log"
    # A start-up slower than the fault-free run's (a loaded machine) can put the kill before
    # training, where it checks less: such a run does not count, and runs again with the kill
    # 3 s later (twice at most). A kill after the end fails at once.
    at=$kill_at
    for attempt in 1 2 3; do
        "$cps" launch $job --kill-at $at --kill-server "$rank" -- $prog >"$log" 2>&1 || {
            tail -20 "$log"
            echo "FAIL: the job with server $rank killed failed"
            exit 1
        }
        grep -E "SIGKILL|restarted|declared dead|joined range" "$log" || true
        why=$(workload_fault_mid_run "$log" "SIGKILL server $rank") && break
        echo "$why"
        case $why in *"before training"*) [ $attempt -lt 3 ] || exit 1 ;; *) exit 1 ;; esac
        at=$((at + 3))
        echo "again with the kill at $at s"
    done
    if [ -n "${SNAP_CHUNKS_MIN:-}" ]; then
        # CHAINPS_SNAP_CHUNK_KB made the snapshots small: at least one of them must have gone
        # as SNAP_CHUNKS_MIN numbered chunks or more, or the test did not do what it says.
        most=$(sed -n 's/.*snapshot at seq .* in \([0-9]*\) chunks.*/\1/p' "$log" | sort -n | tail -1)
        if [ -z "$most" ] || [ "$most" -lt "$SNAP_CHUNKS_MIN" ]; then
            echo "FAIL: no snapshot went as $SNAP_CHUNKS_MIN chunks or more (most: '${most:-none}')"
            exit 1
        fi
        echo "snapshots in chunks: the largest went as $most"
    fi
    got=$(checksums "$log")
    got_traj=$(workload_trajectories "$log")
    if [ -z "$ref" ] || [ "$got" != "$ref" ] || [ "$got_traj" != "$ref_traj" ]; then
        echo "FAIL: fault-free checksum '$ref', with server $rank killed '$got';" \
            "trajectory '$ref_traj' and '$got_traj'"
        exit 1
    fi
    echo "PASS: $WORKLOAD: server $rank killed mid-run; final parameters identical to the" \
        "fault-free run ($got${ref_traj:+, and so was every pull on the way: trajectory $got_traj})"
done
