#!/bin/sh
# Kill one server (by rank) during sync training and check that the job finishes with exactly
# the parameters of a fault-free run. With 3 servers on a ring, range 0's chain is rank 0 ->
# rank 1 -> rank 2: killing rank 0, 1 or 2 kills its head, middle or tail.
# usage: kill_test.sh CHAINPS LSQ_WORKER RANK
set -eu
cps=$1
lsq=$2
rank=$3
job="--servers 3 --workers 2 --mode sync --timeout 180"
prog="$lsq --steps 20000"
ref=$("$cps" launch $job -- $prog 2>&1 | sed -n 's/.*final: .*checksum \([0-9a-f]*\)$/\1/p' | sort -u)
out=$("$cps" launch $job --kill-at 1 --kill-server "$rank" -- $prog 2>&1) || {
    echo "$out" | tail -20
    echo "the job with server $rank killed failed"
    exit 1
}
echo "$out" | grep -E "SIGKILL|restarted|declared dead|joined range" || true
got=$(echo "$out" | sed -n 's/.*final: .*checksum \([0-9a-f]*\)$/\1/p' | sort -u)
echo "$out" | grep -q "SIGKILL server $rank" || { echo "the kill did not happen"; exit 1; }
if [ -z "$ref" ] || [ "$got" != "$ref" ]; then
    echo "FAIL: fault-free checksum '$ref', with server $rank killed '$got'"
    exit 1
fi
echo "PASS: server $rank killed mid-run; final parameters identical to the fault-free run ($got)"
