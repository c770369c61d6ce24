#!/usr/bin/env bash
# Time from a worker's kill -9 to the next completed all-reduce (issue 29): a 4-worker job of
# tests/integration/allreduce_app (64 Ki floats, 5 ms between all-reduces), one worker killed -9
# 40 all-reduces in, KILLS times (default 20, a new job each time, the victim's rank rotating).
# The time runs from the kill to the moment every survivor had completed an all-reduce it began
# after the kill (tests/integration/allreduce_test.sh, which also checks the survivors' bits).
# Writes bench/results/allreduce_kill.md with p50 and p99 (nearest rank) in ms.
#   bench/allreduce_kill.sh [BUILD_DIR]
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
bench_prepare allreduce_kill "${1:-}" chainps tests/integration/allreduce_app
KILLS=${KILLS:-20}
load0=$(cut -d' ' -f1-3 /proc/loadavg)
EQUAL_WORKERS="" "$here/../tests/integration/allreduce_test.sh" "$build/chainps" \
    "$build/tests/integration/allreduce_app" "$KILLS" >"$log" 2>&1 || {
    tail -20 "$log"
    echo "allreduce_kill: the kill test failed" >&2
    exit 1
}
sed -n 's/^kill_to_next_ms \([0-9]*\).*/\1/p' "$log" | sort -n >"$res"
n=$(wc -l <"$res")
p50=$(sed -n "$(((n + 1) / 2))p" "$res")
p99=$(sed -n "$(((99 * n + 99) / 100))p" "$res")
{
    echo "# kill -9 of a worker -> next completed all-reduce"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores shared with other work (load average $load0" \
        "before); \`bench/allreduce_kill.sh\`: $n kills of one of 4 workers, each in a new job."
    echo
    echo "| kills | p50 ms | p99 ms | max ms | all (ms) |"
    echo "|---|---|---|---|---|"
    echo "| $n | $p50 | $p99 | $(tail -1 "$res") | $(tr '\n' ' ' <"$res") |"
} >"$here/results/allreduce_kill.md"
cat "$here/results/allreduce_kill.md"
