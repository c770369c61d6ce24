#!/bin/bash
# Communication frequency and warm-up of all-reduced training (cps_freq, issue 29), 2-worker jobs
# of tests/integration/freq_app through `chainps launch`:
#  1. bad settings (k 0, -1, 2^40, 2^20 + 1; warm-up -1, 2^33, without state; calls out of order)
#     are refused with CPS_EINVAL;
#  2. k = 1 and k = 4, 64 steps: every window's gradient handed back is the mean over the window's
#     steps and the workers (freq_app computes it itself); the all-reduce bytes each worker sends fall by exactly 4
#     (cps_allreduce_stats), the workers hold the same bits after every step, and w moves only on
#     every 4th step with k = 4;
#  3. k = 4 twice: both runs end with the same bits;
#  4. k = 4 and warm-up 8: the workers' w differ during the warm-up and are equal from its end
#     on; the bytes are 14 gradient syncs plus the average of w and its momentum;
#  5. w on the servers (CPS_FREQ_SERVERS, sync mode), k = 1 and k = 4 twice: the push bytes fall
#     by exactly 4 (cps_client_stats), w moves every 4th step only, the workers agree after every
#     step, and the two k = 4 runs end bitwise equal.
# Usage: freq_test.sh CHAINPS FREQ_APP
set -u
CHAINPS=$1
APP=$2
dir=$(mktemp -d "${TMPDIR:-/tmp}/freq.XXXXXX")
trap 'rm -rf "$dir"' EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}

run() { # run NAME ARGS...: a 2-worker job of 64 steps, in the foreground
    local name=$1 out=$dir/$1
    shift
    mkdir -p "$out"
    timeout 120 "$CHAINPS" launch --servers 1 --workers 2 --timeout 100 -- \
        "$APP" --out "$out" --len 4096 --steps 64 "$@" >"$out.log" 2>&1 ||
        { tail -30 "$out.log"; fail "job $name"; }
}
field() { # field NAME RANK WORD: the number after WORD in rank RANK's final line
    grep "rank $2: final" "$dir/$1.log" | awk -v f="$3" '{for (i = 1; i < NF; i++) if ($i == f) print $(i + 1)}'
}
steps() { awk '{print $1, $2}' "$dir/$1/rank$2.txt"; }

run k1 --sync-every 1
run k4a --sync-every 4
run k4b --sync-every 4
run warm --sync-every 4 --warmup 8
run srv1 --servers --sync-every 1
run srv4a --servers --sync-every 4
run srv4b --servers --sync-every 4

[ "$(grep -c 'bad settings refused' "$dir/k1.log")" = 2 ] || fail "bad settings were not refused"
echo "ok: k 0, -1, 2^40, 2^20 + 1, warm-up -1, 2^33, a warm-up without state or on the servers, an unknown target: CPS_EINVAL"

for n in k1 k4a k4b warm srv1 srv4a srv4b; do
    cmp -s <(steps $n 0) <(steps $n 1) && [ "$(steps $n 0 | wc -l)" = 64 ] ||
        { [ $n = warm ] || fail "$n: the workers' w differ (or a worker did not finish 64 steps)"; }
done
b1=$(field k1 0 sent)
b4=$(field k4a 0 sent)
[ -n "$b1" ] && [ "$b4" -gt 0 ] && [ "$b1" = $((4 * b4)) ] || fail "bytes: k=1 sent $b1, k=4 sent $b4 (not 4x)"
[ "$(field k1 0 syncs)" = 64 ] && [ "$(field k4a 0 syncs)" = 16 ] && [ "$(field k4a 0 held)" = 48 ] &&
    [ "$(field k4a 0 checked)" = 16 ] && [ "$(field k4a 1 checked)" = 16 ] && [ "$(field srv4a 1 checked)" = 16 ] &&
    [ "$(field warm 0 checked)" = 14 ] ||
    fail "syncs: $(field k1 0 syncs) and $(field k4a 0 syncs) (held $(field k4a 0 held)), not 64 and 16 (48)"
# With k = 4, w changes after steps 3, 7, 11, ... only.
moved=$(awk 'NR > 1 && $2 != prev {printf "%d ", $1} {prev = $2}' "$dir/k4a/rank0.txt")
[ "$moved" = "$(seq -s ' ' 3 4 63) " ] || fail "k=4: w moved after steps $moved"
echo "ok: k=1 sent $b1 bytes, k=4 $b4 (exactly 1/4); equal bits on both workers after every step"

h=$(field k4a 0 w)
[ -n "$h" ] && [ "$h" = "$(field k4b 0 w)" ] && [ "$(field k4a 1 w)" = "$(field k4b 1 w)" ] ||
    fail "k=4: two runs ended with other bits"
echo "ok: two runs with k=4 end bitwise equal (w hashes to $h)"

# Warm-up: the steps 0..6 differ between the workers, 7 (the average) and every later one agree.
paste -d' ' <(steps warm 0) <(steps warm 1) | awk '
    $1 < 7 && $2 == $4 {print "warm-up step " $1 " equal"; bad = 1}
    $1 >= 7 && $2 != $4 {print "step " $1 " differs after the warm-up"; bad = 1}
    END {exit bad}' || fail "warm-up"
[ "$(field warm 0 averaged)" = 1 ] && [ "$(field warm 1 averaged)" = 1 ] || fail "warm-up: no average"
bw=$(field warm 0 sent)
# 56 steps after the warm-up = 14 syncs of 4096 values, then the average of w and v (4096 each).
[ "$bw" = $((b4 / 16 * (14 + 2))) ] || fail "warm-up bytes $bw, expected $((b4 / 16 * 16))"
echo "ok: warm-up 8: workers differ for steps 0..6, agree from the average on; $bw bytes (14 syncs + 2 averages)"
p1=$(field srv1 0 sent)
p4=$(field srv4a 0 sent)
[ -n "$p1" ] && [ "$p4" -gt 0 ] && [ "$p1" = $((4 * p4)) ] || fail "servers: k=1 pushed $p1 bytes, k=4 $p4 (not 4x)"
moved=$(awk 'NR > 1 && $2 != prev {printf "%d ", $1} {prev = $2}' "$dir/srv4a/rank1.txt")
[ "$moved" = "$(seq -s ' ' 3 4 63) " ] || fail "servers, k=4: w moved after steps $moved"
h=$(field srv4a 0 w)
[ -n "$h" ] && [ "$h" = "$(field srv4b 0 w)" ] && [ "$h" = "$(field srv4b 1 w)" ] ||
    fail "servers, k=4: two runs ended with other bits"
echo "ok: servers: k=1 pushed $p1 bytes, k=4 $p4 (exactly 1/4); w moves every 4th step; two runs end equal ($h)"
echo PASS
