#!/bin/bash
# Worker replacement leaks no file descriptors (the 60-minute soak found one more fd open in the
# scheduler and in every server per replacement: the dead worker's outbound socket was kept, and
# the scheduler kept queueing views to it). `chainps launch --restart-workers` runs lsq_worker;
# a worker is killed -9 REPLACEMENTS+1 times (alternating ranks) and started again by launch.
# The fd counts of the scheduler and of both servers are taken after the first replacement (every
# socket a steady job needs is open by then) and after the last: they may not grow by more than
# SLACK. Each count is taken once the scheduler has logged the replaced worker's death and its
# replacement's admission and the three counts have held still for half a second (a fixed 4 s
# wait before: 4 s of the test per replacement).
# Usage: worker_replace_fds.sh CHAINPS LSQ_WORKER
set -u
CHAINPS=$1
LSQ=$2
REPLACEMENTS=${REPLACEMENTS:-5}
SLACK=${SLACK:-1}
dir=$(mktemp -d "${TMPDIR:-/tmp}/replace_fds.XXXXXX")
export CHAINPS_WORKER_DEAD_AFTER_MS=1000
"$CHAINPS" launch --servers 2 --replicas 2 --workers 2 --restart-workers --timeout 300 -- \
    "$LSQ" --steps 200000 --step-ms 5 --tol 1e9 >"$dir/launch.log" 2>&1 &
lp=$!
cleanup() {
    kill "$lp" 2>/dev/null
    wait "$lp" 2>/dev/null
}
trap cleanup EXIT

# pid of launch's child whose command line matches $1 (and $2, if given)
child() {
    for p in $(pgrep -P "$lp"); do
        c=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)
        case "$c" in *"$1"*"${2:-}"*) echo "$p"; return;; esac
    done
}
worker_of_rank() {
    for p in $(pgrep -P "$lp"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "CHAINPS_RANK=$1" && {
            echo "$p"; return; }
    done
}
nfd() { ls "/proc/$1/fd" 2>/dev/null | wc -l; }
counts() { echo "$(nfd "$sched") $(nfd "$srv0") $(nfd "$srv1")"; }
# lines of the job's log matching $1
logged() { grep -c -- "$1" "$dir/launch.log"; }
# wait (up to 10 s) until the fd counts hold still for 0.5 s
steady() {
    local prev cur t
    prev=$(counts)
    for t in $(seq 1 20); do
        sleep 0.5
        cur=$(counts)
        [ "$cur" = "$prev" ] && return
        prev=$cur
    done
}

# The job up: both workers admitted (each pushes from then on), then its sockets settled.
for t in $(seq 1 300); do
    [ "$(logged ") joined from")" -ge 4 ] && break
    sleep 0.1
done
sched=$(child " scheduler ")
srv0=$(child " server " "--rank 0")
srv1=$(child " server " "--rank 1")
if [ -z "$sched" ] || [ -z "$srv0" ] || [ -z "$srv1" ]; then
    echo "FAIL: job did not start (scheduler '$sched', servers '$srv0' '$srv1')"
    cat "$dir/launch.log"
    exit 1
fi
steady
echo "started: fds (scheduler server0 server1): $(counts)"

replace() { # kill the worker of rank $1 and wait for its replacement to be admitted
    local old new t dead joined
    old=$(worker_of_rank "$1")
    [ -n "$old" ] || { echo "FAIL: no worker of rank $1"; tail -30 "$dir/launch.log"; exit 1; }
    dead=$(logged "worker [0-9]* (rank $1) silent for")
    joined=$(logged "worker [0-9]* (rank $1) joined from")
    kill -9 "$old"
    for t in $(seq 1 60); do
        sleep 0.2
        new=$(worker_of_rank "$1")
        [ -n "$new" ] && [ "$new" != "$old" ] && break
    done
    [ -n "$new" ] && [ "$new" != "$old" ] || {
        echo "FAIL: rank $1 not replaced"; tail -30 "$dir/launch.log"; exit 1; }
    # declared dead (1 s), the replacement admitted (launch starts it once the death is
    # declared), the views out
    local seen=no
    for t in $(seq 1 150); do
        if [ "$(logged "worker [0-9]* (rank $1) silent for")" -gt "$dead" ] &&
            [ "$(logged "worker [0-9]* (rank $1) joined from")" -gt "$joined" ]; then
            seen=yes
            break
        fi
        sleep 0.1
    done
    [ "$seen" = yes ] || {
        echo "FAIL: rank $1: no death and admission logged"; tail -30 "$dir/launch.log"; exit 1; }
    steady
}

replace 0
read -r s0 a0 b0 <<<"$(counts)"
echo "after 1 replacement: fds scheduler $s0, server0 $a0, server1 $b0"
for k in $(seq 1 "$REPLACEMENTS"); do
    replace $((k % 2))
    echo "after $((k + 1)) replacements: fds (scheduler server0 server1): $(counts)"
done
read -r s1 a1 b1 <<<"$(counts)"
for p in "$sched" "$srv0" "$srv1"; do
    [ -d "/proc/$p" ] || { echo "FAIL: process $p died"; tail -30 "$dir/launch.log"; exit 1; }
done
fail=0
check() {
    local grew=$(($3 - $2))
    echo "$1: $2 -> $3 fds over $REPLACEMENTS replacements (growth $grew, allowed $SLACK)"
    [ "$grew" -le "$SLACK" ] || fail=1
}
check scheduler "$s0" "$s1"
check "server 0" "$a0" "$a1"
check "server 1" "$b0" "$b1"
if [ "$fail" -ne 0 ]; then
    echo "FAIL: file descriptors grow with worker replacements"
    exit 1
fi
rm -rf "$dir"
echo "PASS"
