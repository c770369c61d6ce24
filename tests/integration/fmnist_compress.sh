#!/bin/sh
# Accuracy of lossy gradient compression (issue 16): the Fashion-MNIST MLP trained by a
# 2-server 2-worker sync job for EPOCHS epochs, once with plain float32 pushes, once with
# `--compress fp16` and once with `--compress topk:0.01` (error feedback on the workers). The
# issue's targets: fp16 within 0.3 points of the uncompressed run's test accuracy, topk:0.01
# within 1 point. Sync mode sums in rank order, so each run is deterministic: the margins are
# the same on every run of the same build (4 epochs measured 87.35%, 87.41%, 86.95%; 5 epochs
# 87.61%, 87.75%, 87.32%; 3 epochs 86.86%, 86.89%, 86.09%, too near the 1 point). The suite
# trains 4 epochs (the suite's time: a fifth less), long.fmnist_compress 5; at 4, topk:0.01
# without its error feedback (the residual zeroed by hand) ends 3.99 points below and fails.
# Also checks that the pushes really were that much smaller (the workers' wire ratio).
# usage: fmnist_compress.sh FMNIST_BINARY CHAINPS_BINARY OUTDIR   (EPOCHS, default 4)
set -eu
fm=$1
cps=$2
out=$3
epochs=${EPOCHS:-4}
data=${FMNIST_DATA:-/usr/share/datasets/fashion-mnist}
if [ ! -r "$data/train-images-idx3-ubyte.gz" ]; then
    echo "FAIL: no Fashion-MNIST data in $data (scripts/deps.sh test installs dataset-fashion-mnist;"
    echo "FMNIST_DATA names another place): a missing test dependency is a failure, not a skip"
    exit 1
fi
rm -rf "$out"
mkdir -p "$out"

# run NAME [--compress SPEC]: prints "ACCURACY RATIO" of worker 0's final line.
run() {
    name=$1
    shift
    "$cps" launch --servers 2 --workers 2 --mode sync --timeout 300 "$@" -- \
        "$fm" --epochs "$epochs" --log-every 0 --data "$data" --out "$out/$name" \
        >"$out/$name.txt" 2>&1 || { cat "$out/$name.txt" >&2; exit 1; }
    sed -n 's/^\[worker 0\] final: test accuracy \([0-9.]*\)%.*ratio \([0-9.]*\)).*$/\1 \2/p' \
        "$out/$name.txt"
}

base=$(run none)
fp16=$(run fp16 --compress fp16)
topk=$(run topk --compress topk:0.01)
for v in "$base" "$fp16" "$topk"; do
    [ -n "$v" ] || { echo "a run printed no final line (see $out/*.txt)"; exit 1; }
done
echo "$base" "$fp16" "$topk" | awk -v epochs="$epochs" '{
    printf "fmnist MLP, %d epochs, 2 servers, 2 workers, sync:\n", epochs
    printf "  %-10s accuracy %6.2f%%  wire ratio %6.2f\n", "none", $1, $2
    printf "  %-10s accuracy %6.2f%%  wire ratio %6.2f  (%+.2f points)\n", "fp16", $3, $4, $3 - $1
    printf "  %-10s accuracy %6.2f%%  wire ratio %6.2f  (%+.2f points)\n", "topk:0.01", $5, $6,
        $5 - $1
    bad = 0
    if ($3 < $1 - 0.3) { print "FAIL: fp16 is more than 0.3 points below"; bad = 1 }
    if ($5 < $1 - 1.0) { print "FAIL: topk:0.01 is more than 1 point below"; bad = 1 }
    if ($4 < 1.9) { print "FAIL: fp16 pushes are not about half the bytes"; bad = 1 }
    if ($6 < 30) { print "FAIL: topk:0.01 pushes are not about 2% of the bytes"; bad = 1 }
    if ($2 > 1.1) { print "FAIL: the uncompressed run was compressed"; bad = 1 }
    exit bad
}'
