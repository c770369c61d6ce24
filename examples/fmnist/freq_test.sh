#!/bin/bash
# The fmnist half of the communication-frequency table (issue 29) as a suite test: the C MLP with
# every parameter all-reduced by cps_freq (--allreduce), 2 workers, 240 steps, with k = 1, k = 4
# and k = 4 after a warm-up of 40 steps. Each run must end with the same checksum on both
# workers and a test accuracy well above chance (10 classes); k = 4 must send exactly 1/4 of
# k = 1's all-reduce bytes (the same gradient buffer, 60 syncs instead of 240), and the warm-up
# run 50 syncs plus one average of the parameters and their optimizer state (at most 3 buffers
# the size of the gradients' for the MLP's momentum): between 50/240 and 53/240 of k = 1.
# Bytes are what examples/fmnist prints from cps_allreduce_stats ("sent N bytes"), as
# bench/run_freq.sh and integration.freq read them.
# Usage: freq_test.sh FMNIST CHAINPS OUTDIR
set -u
FM=$1
CHAINPS=$2
out=$3
data=${FMNIST_DATA:-/usr/share/datasets/fashion-mnist}
fail() {
    echo "FAIL: $*"
    exit 1
}
[ -r "$data/train-images-idx3-ubyte.gz" ] ||
    fail "no Fashion-MNIST data in $data (scripts/deps.sh test installs it; FMNIST_DATA names another place)"
rm -rf "$out"
mkdir -p "$out"

run() { # run NAME ARGS...: a 2-worker job of 240 steps
    local name=$1
    shift
    timeout 100 "$CHAINPS" launch --servers 1 --workers 2 --timeout 90 -- \
        "$FM" --allreduce --model mlp --steps 240 --log-every 0 --data "$data" \
        --out "$out/$name" "$@" >"$out/$name.log" 2>&1 || { tail -30 "$out/$name.log"; fail "job $name"; }
    local sums accs
    sums=$(sed -n 's/.*final: test accuracy.*checksum \([0-9a-f]*\).*/\1/p' "$out/$name.log" | sort -u)
    [ "$(grep -c 'final: test accuracy' "$out/$name.log")" = 2 ] || fail "$name: not 2 workers' final lines"
    [ "$(echo "$sums" | wc -l)" = 1 ] && [ -n "$sums" ] || fail "$name: the workers' checksums differ: $sums"
    accs=$(sed -n 's/.*final: test accuracy \([0-9.]*\)%.*/\1/p' "$out/$name.log")
    for a in $accs; do
        awk -v a="$a" 'BEGIN {exit !(a > 50)}' || fail "$name: test accuracy $a% (chance is 10%)"
    done
    bytes=$(sed -n 's/.*allreduce: sync every.* sent \([0-9]*\) bytes.*/\1/p' "$out/$name.log" | head -1)
    [ -n "$bytes" ] && [ "$bytes" -gt 0 ] || fail "$name: no all-reduce bytes line"
    echo "ok: $name: both workers end with checksum $sums, accuracy $(echo $accs), rank 0 sent $bytes bytes"
}

run k1 --sync-every 1
b1=$bytes
run k4 --sync-every 4
b4=$bytes
[ "$b1" = $((4 * b4)) ] || fail "k=4 sent $b4 bytes, k=1 $b1: not exactly 1/4"
run warm --sync-every 4 --warmup 40
bw=$bytes
awk -v w="$bw" -v b="$b1" 'BEGIN {exit !(w >= b * 50 / 240 && w <= b * 53 / 240)}' ||
    fail "warm-up 40, k=4: $bw bytes, not 50/240..53/240 of k=1's $b1"
grep -q "warm-up 40: 50 windows" "$out/warm.log" || fail "warm-up run: not 50 windows"
echo "ok: bytes k=1 $b1, k=4 $b4 (1/4), k=4 after a 40-step warm-up $bw"
echo PASS
