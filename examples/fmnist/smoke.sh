#!/bin/sh
# Smoke test of the fmnist example: flag and data errors, a short --local run with its files, and
# (when the chainps CLI is built) the same run as a 1-worker parameter-server job, which must end
# with the same parameter checksum: the servers use the same initial values and update formulas
# as --local, so any difference is a bug in one of them.
# usage: smoke.sh FMNIST_BINARY CHAINPS_BINARY|"" OUTDIR
set -eu
fm=$1
cps=$2
out=$3
data=${FMNIST_DATA:-/usr/share/datasets/fashion-mnist}
if [ ! -r "$data/train-images-idx3-ubyte.gz" ]; then
    echo "FAIL: no Fashion-MNIST data in $data (scripts/deps.sh test installs dataset-fashion-mnist;"
    echo "FMNIST_DATA names another place): a missing test dependency is a failure, not a skip"
    exit 1
fi
rm -rf "$out"
mkdir -p "$out"

set +e
"$fm" --epochs zero >"$out/badflag.txt" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "a bad flag exited $rc, not 2"; exit 1; }
grep -q "usage:" "$out/badflag.txt" || { echo "no usage after a bad flag"; exit 1; }

set +e
"$fm" --local --data "$out/nowhere" >"$out/nodata.txt" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] || { echo "missing data exited $rc, not 1"; exit 1; }
grep -q "nowhere/train-images-idx3-ubyte.gz: cannot open" "$out/nodata.txt" ||
    { echo "missing data: message does not name the file"; cat "$out/nodata.txt"; exit 1; }

args="--steps 40 --log-every 20 --data $data"
"$fm" --local $args --out "$out/local" >"$out/local.txt" 2>&1 || { cat "$out/local.txt"; exit 1; }
grep -q "^epoch: 1 step: 20, loss is " "$out/local.txt" || { echo "no loss line"; exit 1; }
for f in fmnist-mlp.csv fmnist-mlp.bin; do
    [ -s "$out/local/$f" ] || { echo "missing $out/local/$f"; exit 1; }
done
sum_local=$(sed -n 's/^final: .*checksum \([0-9a-f]*\)$/\1/p' "$out/local.txt")
[ -n "$sum_local" ] || { echo "no final line"; cat "$out/local.txt"; exit 1; }

if [ -z "$cps" ] || [ ! -x "$cps" ]; then
    echo "FAIL: local run ok (checksum $sum_local), but no chainps CLI at '$cps' for the job runs"
    exit 1
fi
"$cps" launch --servers 1 --workers 1 --timeout 120 -- "$fm" $args --out "$out/ps" \
    >"$out/ps.txt" 2>&1 || { cat "$out/ps.txt"; exit 1; }
sum_ps=$(sed -n 's/^.*final: .*checksum \([0-9a-f]*\)$/\1/p' "$out/ps.txt")
if [ "$sum_ps" != "$sum_local" ]; then
    echo "checksums differ: local $sum_local, 1-worker job '$sum_ps'"
    cat "$out/ps.txt"
    exit 1
fi
echo "local and 1-worker job agree: checksum $sum_local"

# Sync mode with a fixed seed is deterministic: two 2-worker runs of 50 steps end with the same
# parameters (both workers and both runs print the same checksum).
args50="--steps 50 --log-every 25 --data $data"
for run in 1 2; do
    "$cps" launch --servers 2 --workers 2 --mode sync --timeout 180 -- "$fm" $args50 \
        --out "$out/sync$run" >"$out/sync$run.txt" 2>&1 || { cat "$out/sync$run.txt"; exit 1; }
done
sums=$(sed -n 's/^.*final: .*checksum \([0-9a-f]*\)$/\1/p' "$out/sync1.txt" "$out/sync2.txt" |
       sort -u)
n=$(printf '%s\n' "$sums" | grep -c .)
if [ "$n" -ne 1 ]; then
    echo "sync runs are not deterministic: checksums $sums"
    exit 1
fi
echo "two 2-worker sync runs agree bitwise: checksum $sums"
