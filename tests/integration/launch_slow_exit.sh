#!/bin/sh
# A worker that is still exiting after it closed (here: 3 s of sleep after the training program
# returned, as an interpreter saving a model would be) does not fail the job: the scheduler ends
# the job once every worker said goodbye, and launch waits for the worker's exit.
# usage: launch_slow_exit.sh CHAINPS LSQ_WORKER
set -eu
cps=$1
lsq=$2
out=$("$cps" launch --servers 1 --workers 2 --mode sync --timeout 120 -- \
    sh -c "$lsq --steps 5000 && sleep 3 && echo slow-exit-done" 2>&1) || {
    echo "$out" | tail -30
    echo "FAIL: launch failed although both workers finished"
    exit 1
}
n=$(echo "$out" | grep -c "slow-exit-done" || true)
echo "$out" | grep "launch:" || true
[ "$n" = 2 ] || { echo "FAIL: $n of 2 workers printed their last line"; exit 1; }
echo "$out" | grep -q "waiting for .* still exiting" || { echo "FAIL: no wait was needed?"; exit 1; }
echo "PASS: launch waited for workers still exiting after the job ended"
