#!/bin/sh
# Kill one server (by rank) during sync training and check that the job finishes with exactly
# the parameters of a fault-free run. With 3 servers on a ring, range 0's chain is rank 0 ->
# rank 1 -> rank 2: killing rank 0, 1 or 2 kills its head, middle or tail. RANKS may name
# several ranks ("0 1 2"): one fault-free run, then one run per rank, each with that server
# killed (launch --kill-at) and restarted 2 s later.
# WORKLOAD=lsq (default) or fmnist (tests/integration/workload.sh): PROGRAM is lsq_worker or
# examples/fmnist. fmnist's tensors are spread over every range, so each kill there takes out
# the head of one range, the middle of another and the tail of a third, all holding data.
# usage: [WORKLOAD=fmnist] kill_test.sh CHAINPS PROGRAM RANKS
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
    # ~1-3 s of start-up (data loading), then 600 steps (4-9 s here): the kill at 4 s falls in
    # training, which workload_fault_mid_run checks.
    prog="$bin $(workload_fmnist_args 600 "$dir/fm" 10)"
    kill_at=4
else
    prog="$bin --steps 20000"
    kill_at=1
fi
checksums() { sed -n 's/.*final: .*checksum \([0-9a-f]*\)$/\1/p' "$1" | sort -u; }
"$cps" launch $job -- $prog >"$dir/ref.log" 2>&1 || {
    tail -20 "$dir/ref.log"
    echo "FAIL: the fault-free job failed"
    exit 1
}
ref=$(checksums "$dir/ref.log")
for rank in $ranks; do
    log="$dir/kill$rank.log"
    "$cps" launch $job --kill-at $kill_at --kill-server "$rank" -- $prog >"$log" 2>&1 || {
        tail -20 "$log"
        echo "FAIL: the job with server $rank killed failed"
        exit 1
    }
    grep -E "SIGKILL|restarted|declared dead|joined range" "$log" || true
    workload_fault_mid_run "$log" "SIGKILL server $rank" || exit 1
    got=$(checksums "$log")
    if [ -z "$ref" ] || [ "$got" != "$ref" ]; then
        echo "FAIL: fault-free checksum '$ref', with server $rank killed '$got'"
        exit 1
    fi
    echo "PASS: $WORKLOAD: server $rank killed mid-run; final parameters identical to the" \
        "fault-free run ($got)"
done
