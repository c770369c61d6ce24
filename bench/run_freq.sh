#!/usr/bin/env bash
# Communication frequency and warm-up (issue 29), as a table: bench/results/freq.md (the script
# rewrites only its part, between two marker lines; the notes on particular runs around it are
# hand-written and kept).
#
#   bench/run_freq.sh [BUILD_DIR]      (default: build/release beside this folder's parent)
#
# Four programs, 2 workers each, every cell of k = sync_every in {1, 4, 16} x warm-up in {0, 100}:
#   fmnist  examples/fmnist --allreduce (the C MLP, every parameter all-reduced by cps_freq,
#           momentum 0.9 lr 0.01 on each worker), 1 epoch = 469 steps of batch 64 per worker
#   fmnist-ps  the same MLP with its parameters on 2 servers (sync mode, the servers' momentum),
#           the window's mean gradient pushed every k-th step (cps_freq, CPS_FREQ_SERVERS);
#           warm-up 0 only (a warm-up needs the parameters on the workers)
#   hybrid  examples/hybrid/train.py (PyTorch: the embedding table on 2 servers as row pushes,
#           the dense layers all-reduced, both every k-th step by DistributedOptimizer(sync_every=,
#           warmup_steps=)), STEPS_HYBRID steps (default 48000: see freq.md for why) of batch 64
#           per worker; rank 0 also prints the test accuracy after 1/8, 1/4 and 1/2 of them
#           (--eval-at), to show where the curve flattens: the "curves" lines of the output
#   torch   examples/torch/train.py --allreduce (PyTorch LeNet-5 on Fashion-MNIST, every parameter
#           all-reduced by DistributedOptimizer(sync_every=, warmup_steps=), torch.optim momentum
#           0.9 lr 0.02 on each worker; 1 server, which holds nothing), STEPS_TORCH steps (default
#           469, one epoch of each worker's 30,000 images) of batch 64 per worker
# REPS rounds (default 3), interleaved so that the machine's drift hits every cell alike.
# Accuracy and bytes depend on k and n, not on the load (fmnist's are the same bits in every
# round; hybrid's table rows are applied on arrival, so its accuracy varies a little: median);
# samples/s is the median over the rounds with min-max. All on 127.0.0.1.
#   fmnist-lrk  fmnist with lr 0.01 x k (the linear scaling rule for a k times larger batch), k > 1
# PROGRAMS (default "fmnist hybrid fmnist-ps fmnist-lrk torch") picks programs; RAW=FILE appends every run's line
# to FILE and builds the table from all of FILE's lines (bench/results/freq.raw keeps them), so
# a later invocation can add rows to an earlier one's table (REPS=0: only rebuild the table).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${1:-$root/build/release}
build=$(cd "$build" && pwd) || exit 2
CHAINPS=$build/chainps
FMNIST=$build/examples/fmnist
PY=/usr/bin/python3
HYBRID=$root/examples/hybrid/train.py
export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH}
REPS=${REPS:-3}
STEPS_HYBRID=${STEPS_HYBRID:-48000}
STEPS_TORCH=${STEPS_TORCH:-469}
TORCH=$root/examples/torch/train.py
KS=${KS:-1 4 16}
WARMUPS=${WARMUPS:-0 100}
OUT=${OUT:-$here/results/freq.md}
PROGRAMS=${PROGRAMS:-fmnist hybrid fmnist-ps fmnist-lrk torch}
for b in "$CHAINPS" "$FMNIST"; do
    [ -x "$b" ] || { echo "run_freq: $b not built" >&2; exit 2; }
done
"$PY" -c 'import chainps, torch' || { echo "run_freq: chainps or torch not importable" >&2; exit 2; }

tmp=$(mktemp "${TMPDIR:-/tmp}/chainps-freq-XXXXXX")
res=${RAW:-$tmp}
trap 'rm -rf "$tmp" "$tmp.out" "$tmp.dir" "$tmp.gen" "$tmp.new"' EXIT
trap 'exit 130' INT TERM
load0=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M UTC')
t0=$(date +%s)

# One line per run into $res: "PROGRAM K N ACCURACY SAMPLES_PER_S ALLREDUCE_BYTES SERVER_BYTES".
fmnist_run() { # k n [lr [name]]
    timeout 300 "$CHAINPS" launch --servers 1 --workers 2 --timeout 280 -- \
        "$FMNIST" --allreduce --model mlp --epochs 1 --sync-every "$1" --warmup "$2" \
        --lr "${3:-0.01}" --log-every 0 --out "$tmp.dir" >"$tmp.out" 2>&1
    # Rank 0 evaluates; every worker prints a final line (the job's rate is the sum of both).
    awk -v k="$1" -v n="$2" -v name="${4:-fmnist}" '
        { sub(/^\[worker [0-9]+\] /, "") } # launch tags each line with its process
        /^final: test accuracy/ { w++; if (!acc) { acc = $4; sub(/%,?/, "", acc) }; rate += $5 }
        /^allreduce: sync every/ { for (i = 1; i < NF; i++) if ($i == "sent") bytes += $(i + 1) }
        END { if (w == 2) printf "%s %s %s %s %.1f %.0f 0\n", name, k, n, acc, rate, bytes; else exit 1 }
    ' "$tmp.out" >>"$res" || { echo "${4:-fmnist} k=$1 n=$2 failed:"; tail -5 "$tmp.out"; }
}
fmnist_ps_run() { # k n
    [ "$2" = 0 ] || return 0
    timeout 300 "$CHAINPS" launch --servers 2 --workers 2 --timeout 280 -- \
        "$FMNIST" --model mlp --epochs 1 --sync-every "$1" --log-every 0 --out "$tmp.dir" \
        >"$tmp.out" 2>&1
    # Server bytes: pushed (before snappy) + pulled, in MB with one decimal, both workers.
    awk -v k="$1" -v n="$2" '
        { sub(/^\[worker [0-9]+\] /, "") }
        /^final: test accuracy/ { w++; if (!acc) { acc = $4; sub(/%,?/, "", acc) }; rate += $5
            for (i = 1; i < NF; i++) { if ($i == "pushed") srv += $(i + 1) * 1e6
                if ($i == "pulled") srv += $(i + 1) * 1e6 } }
        END { if (w == 2) printf "fmnist-ps %s %s %s %.1f 0 %.0f\n", k, n, acc, rate, srv; else exit 1 }
    ' "$tmp.out" >>"$res" || { echo "fmnist-ps k=$1 n=$2 failed:"; tail -5 "$tmp.out"; }
}
# The Python examples' final lines: "final: test accuracy A%, R samples/s, ... pushed P bytes,
# pulled Q bytes, all-reduce sent B bytes" from each worker; rank 0's accuracy, the rates
# summed (or averaged when DIV is 2: each worker's rate is already the job's), bytes summed.
py_parse() { # name k n div
    sed -nE 's/.*final: test accuracy ([0-9.]+)%, ([0-9.]+) samples\/s.*pushed ([0-9]+) bytes, pulled ([0-9]+) bytes, all-reduce sent ([0-9]+) bytes.*/\1 \2 \3 \4 \5/p' \
        "$tmp.out" | awk -v name="$1" -v k="$2" -v n="$3" -v div="$4" '
        { w++; if (w == 1) acc = $1; rate += $2; server += $3 + $4; ar += $5 }
        END { if (w == 2) printf "%s %s %s %s %.1f %.0f %.0f\n", name, k, n, acc, rate / div, ar, server; else exit 1 }
    ' >>"$res" || { echo "$1 k=$2 n=$3 failed:"; tail -5 "$tmp.out"; }
}
hybrid_run() { # k n
    # 300 s and 1 s per 20 steps (a 48,000-step run took 5 min at load 8).
    local s=$STEPS_HYBRID lim=$((300 + STEPS_HYBRID / 20))
    timeout "$lim" "$CHAINPS" launch --servers 2 --workers 2 --timeout $((lim - 20)) -- \
        "$PY" "$HYBRID" --steps "$s" --log-every 100000000 --sync-every "$1" --warmup "$2" \
        --eval-at "$((s / 8)),$((s / 4)),$((s / 2))" >"$tmp.out" 2>&1
    # Each worker's rate is already the job's (its samples x workers / its time): their mean.
    py_parse "hybrid-$s" "$1" "$2" 2
    # The curve: "curve NAME K N STEP ACCURACY" lines (the last point is the final accuracy).
    sed -nE 's/.*eval: step ([0-9]+) test accuracy ([0-9.]+)%.*/\1 \2/p' "$tmp.out" |
        awk -v name="hybrid-$s" -v k="$1" -v n="$2" '{ print "curve", name, k, n, $1, $2 }' \
            >>"$res"
}
torch_run() { # k n
    timeout 600 "$CHAINPS" launch --servers 1 --workers 2 --timeout 580 -- \
        "$PY" "$TORCH" --allreduce --steps "$STEPS_TORCH" --log-every 0 --sync-every "$1" \
        --warmup "$2" >"$tmp.out" 2>&1
    # Each worker's rate is its own samples / its time: the job's is their sum.
    py_parse "torch-$STEPS_TORCH" "$1" "$2" 1
}

for r in $(seq 1 "$REPS"); do
    for k in $KS; do
        for n in $WARMUPS; do
            for p in $PROGRAMS; do
                case $p in
                fmnist) fmnist_run "$k" "$n" ;;
                fmnist-ps) fmnist_ps_run "$k" "$n" ;;
                # The linear scaling rule: a k times larger batch with a k times larger rate.
                fmnist-lrk) [ "$k" = 1 ] || fmnist_run "$k" "$n" "$(awk -v k="$k" 'BEGIN {print 0.01 * k}')" fmnist-lrk ;;
                hybrid) hybrid_run "$k" "$n" ;;
                torch) torch_run "$k" "$n" ;;
                *) echo "run_freq: unknown program $p" >&2; exit 2 ;;
                esac
            done
        done
    done
    echo "round $r of $REPS done ($(($(date +%s) - t0)) s, load average $(cut -d' ' -f1 /proc/loadavg))"
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)
[ "$REPS" -gt 0 ] && echo "# $started: PROGRAMS=\"$PROGRAMS\" REPS=$REPS, $(($(date +%s) - t0)) s, load average $load0 before, $load1 after" >>"$res"

# The script writes only what it ran and measured, between two marker lines of $OUT; notes on
# particular runs are hand-written outside them and kept as they are.
begin='<!-- bench/run_freq.sh writes from here to its end marker; the rest of this file is hand-written -->'
end='<!-- end of bench/run_freq.sh output -->'
mkdir -p "$(dirname "$OUT")"
{
    echo "$begin"
    echo "# Communication frequency and warm-up (bench/run_freq.sh)"
    echo
    echo "2 workers on $(nproc) cores; every cell is the median over its runs ($(grep -vc -e '^#' -e '^curve ' "$res")"
    echo "runs in all${RAW:+, kept in $(basename "$RAW")}; samples/s with min-max). Rounds are interleaved"
    echo "(every cell once per round). samples/s depend on the machine's load (each invocation's load"
    echo "average below). Invocations:"
    echo
    sed -n 's/^# /- /p' "$res"
    echo
    echo "- fmnist: examples/fmnist --allreduce --model mlp --epochs 1 (30,000 samples per worker,"
    echo "  469 steps of 64; every parameter all-reduced through cps_freq, momentum 0.9 lr 0.01 cosine"
    echo "  on each worker); test accuracy on the 10,000 test images."
    echo "- hybrid-S: examples/hybrid/train.py --steps S (batch 64 per worker; the 100,000 x 16"
    echo "  table on 2 servers as row pushes, the dense layers all-reduced by DistributedOptimizer;"
    echo "  with k > 1 both sync every k-th step, the table's rows as one push of the window's rows);"
    echo "  test accuracy on its 4,000 made test samples. Server bytes: pushed + pulled by both workers."
    echo "  hybrid-600-old and hybrid-6000-old: before the servers' parameters synced every k-th step"
    echo "  (the table's rows were pushed every step)."
    echo "- torch-S: examples/torch/train.py --allreduce --steps S (PyTorch LeNet-5 on Fashion-MNIST,"
    echo "  batches of 64, 469 steps being one epoch of each worker's 30,000 images; every parameter"
    echo "  all-reduced by DistributedOptimizer(sync_every=k, warmup_steps=n), torch.optim momentum 0.9"
    echo "  lr 0.02 on each worker; 1 server, which holds nothing); test accuracy on the 10,000 test"
    echo "  images."
    echo "- fmnist-ps: the same MLP, its parameters on 2 servers (sync mode, momentum there), the mean"
    echo "  of each window's gradients pushed every k-th step (cps_freq, CPS_FREQ_SERVERS). Server"
    echo "  bytes: pushed (before snappy) + pulled by both workers, initial and final pulls included."
    echo "- fmnist-lrk: fmnist with lr 0.01 x k (the linear scaling rule), k > 1."
    echo "- all-reduce MB: payload bytes both workers sent to each other (cps_allreduce_stats)."
    echo
    echo "| program | sync_every k | warm-up n | test accuracy | all-reduce MB | server MB | samples/s (job) | min-max |"
    echo "|---|---|---|---|---|---|---|---|"
    awk -f "$here/lib_median.awk" -f <(cat <<'AWK'
        /^#/ || /^curve / { next }
        { key = $1 " " $2 " " $3; if (!(key in cnt)) order[++nk] = key; c = ++cnt[key]
          acc[key, c] = $4; rate[key, c] = $5; ar[key] = $6; srv[key, c] = $7 }
        END {
            for (i = 1; i <= nk; i++) {
                key = order[i]; m = cnt[key]; split(key, f, " ")
                lo = hi = rate[key, 1]
                for (j = 1; j <= m; j++) { a[j] = acc[key, j]; b[j] = rate[key, j]; s[j] = srv[key, j]
                    if (rate[key, j] < lo) lo = rate[key, j]; if (rate[key, j] > hi) hi = rate[key, j] }
                printf "| %s | %s | %s | %.2f%% | %s | %s | %.0f | %.0f-%.0f |\n", f[1], f[2], f[3],
                    median(a, m), f[1] == "fmnist-ps" ? "-" : sprintf("%.1f", ar[key] / 1e6),
                    f[1] ~ /^fmnist(-lrk)?$/ ? "-" : sprintf("%.1f", median(s, m) / 1e6),
                    median(b, m), lo, hi
            }
        }
AWK
    ) "$res" | sort -t'|' -k2,2 -k3,3n -k4,4n
    echo
    echo "Raw runs (program k n accuracy samples/s all-reduce-bytes server-bytes):"
    echo
    echo '```'
    grep -v -e '^#' -e '^curve ' "$res"
    echo '```'
    if grep -q '^curve ' "$res"; then
        echo
        echo "hybrid's test accuracy along each run (rank 0, the servers' table pulled into a copy"
        echo "of the model at 1/8, 1/4 and 1/2 of the steps, then the final accuracy; one line per"
        echo "run, rounds in file order; program k n: step accuracy ...):"
        echo
        echo '```'
        # A run's line comes before its curve lines: each run line starts a record.
        awk 'function out() { if (rec != "") print rec "  " last; rec = "" }
             /^#/ { next }
             /^curve / { if (rec != "") rec = rec "  " $5 " " $6 "%"; next }
             { out() }
             /^hybrid-/ && $1 !~ /-old$/ { s = $1; sub(/^hybrid-/, "", s)
                 rec = $1 " " $2 " " $3 ":"; last = s " " $4 "%" }
             END { out() }' "$res" | sort -s -k1,1 -k2,2n -k3,3n
        echo '```'
    fi
    echo "$end"
} >"$tmp.gen"
if [ ! -e "$OUT" ]; then
    cat "$tmp.gen" >"$OUT"
elif [ "$(grep -cxF -e "$begin" -e "$end" "$OUT")" = 2 ]; then
    awk -v b="$begin" -v e="$end" -v gen="$tmp.gen" '
        $0 == b { while ((getline l < gen) > 0) print l; skip = 1; next }
        $0 == e { skip = 0; next }
        !skip' "$OUT" >"$tmp.new" && cat "$tmp.new" >"$OUT"
else
    cat "$tmp.gen" >"$OUT.new"
    echo "run_freq: $OUT lacks its two marker lines: the table went to $OUT.new" >&2
fi
cat "$tmp.gen"
