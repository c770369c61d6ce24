#!/usr/bin/env bash
# cps_allreduce against torch.distributed's Gloo backend (issue 29), on this machine.
#
#   bench/allreduce.sh [BUILD_DIR]     (default: build-bench beside this folder's parent)
#
# For 2 and 4 workers and 4 KB, 64 KB, 1 MB and 16 MB float32 tensors: chainps over tcp://
# (CHAINPS_RUNTIME_DIR= turns the same-host ipc:// channel off) with --insecure and with the
# job's secret (every message sealed and checked), chainps as launch runs it by default (same-host
# workers over ipc:// in the job's 0700 directory, no MAC: docs/security.md), and Gloo (Debian's
# python3-torch, /usr/bin/python3, spawned processes, tcp rendezvous on 127.0.0.1). Every run
# times ITERS all-reduces (sum) after 3 warm-up rounds and gives rank 0's median latency and its
# median CPU time per all-reduce (the process's, all threads); the systems run interleaved, RUNS
# rounds, and the table gives the median of the rounds' medians, the algorithm bandwidth (tensor
# bytes / latency), and each x / Gloo as the median of the per-round ratios (a round's systems
# ran back to back, under about the same load). Writes bench/results/allreduce.md.
# Knobs: RUNS (3), WORKERS ("2 4"), SIZES (floats, "1024 16384 262144 4194304"), KEEP=1.
set -u

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
bench_prepare allreduce "${1:-}" chainps tests/integration/allreduce_app
CHAINPS=$build/chainps
APP=$build/tests/integration/allreduce_app
RUNS=${RUNS:-3}
WORKERS=${WORKERS:-2 4}
SIZES=${SIZES:-1024 16384 262144 4194304}
out=$here/results/allreduce.md

iters_for() { # fewer rounds for big tensors: each run stays a few seconds
    if [ "$1" -le 16384 ]; then echo 200; elif [ "$1" -le 262144 ]; then echo 50; else echo 12; fi
}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
loads=
for ((run = 1; run <= RUNS; run++)); do
    loads="$loads $(cut -d' ' -f1 /proc/loadavg)"
    for w in $WORKERS; do
        for n in $SIZES; do
            it=$(iters_for "$n")
            for sys in insecure auth ipc gloo; do
                case $sys in
                gloo) line=$(/usr/bin/python3 "$here/allreduce_gloo.py" "$w" "$n" "$it" 2>>"$log" |
                    grep '^gloo') ;;
                insecure) line=$(CHAINPS_RUNTIME_DIR= "$CHAINPS" launch --insecure --servers 1 --workers "$w" --timeout 300 \
                    -- "$APP" --bench --len "$n" --iters "$it" 2>>"$log" | grep '\[worker 0\] bench') ;;
                auth) line=$(CHAINPS_RUNTIME_DIR= "$CHAINPS" launch --servers 1 --workers "$w" --timeout 300 \
                    -- "$APP" --bench --len "$n" --iters "$it" 2>>"$log" | grep '\[worker 0\] bench') ;;
                ipc) line=$("$CHAINPS" launch --servers 1 --workers "$w" --timeout 300 \
                    -- "$APP" --bench --len "$n" --iters "$it" 2>>"$log" | grep '\[worker 0\] bench') ;;
                esac
                p50=$(sed -n 's/.*p50_us=\([0-9]*\).*/\1/p' <<<"$line")
                cpu=$(sed -n 's/.*cpu_us=\([0-9]*\).*/\1/p' <<<"$line")
                [ -n "$p50" ] || { echo "allreduce: $sys $w workers $n floats failed (log $log)" >&2; KEEP=1; continue; }
                echo "$sys $w $n $p50 $run ${cpu:-0}" >>"$res"
                echo "run $run: $sys $w workers $((n * 4)) bytes: p50 $p50 us"
            done
        done
    done
done

{
    echo "# cps_allreduce vs torch.distributed Gloo"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores shared with other work (load average" \
        "$load0 before, $(cut -d' ' -f1-3 /proc/loadavg) after; 1-minute load at each round's" \
        "start:$loads); \`bench/allreduce.sh\`, RUNS=$RUNS: median of the rounds' rank-0 median" \
        "latencies, interleaved rounds. GB/s = tensor bytes / latency (algorithm bandwidth)." \
        "chainps: ring of 1 MiB chunks over nanomsg; tcp on 127.0.0.1 without and with the job's" \
        "secret (ChaCha20-Poly1305 on every message), and ipc:// (launch's default between" \
        "processes of one host, no MAC; chunks of 256 KiB and more through the shared-memory" \
        "ring). Gloo: tcp."
    echo
    echo "| workers | size | tcp --insecure p50 | GB/s | tcp auth p50 | GB/s | ipc p50 | GB/s | Gloo p50 | GB/s | insecure / Gloo | auth / Gloo | ipc / Gloo | ipc CPU | Gloo CPU |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    awk -f "$here/lib_median.awk" -f <(cat <<'AWK'

        { k = $2 " " $3; v[$1, k, ++c[$1, k]] = $4; r[$1, k, $5] = $4; cp[$1, k, c[$1, k]] = $6
          keys[k] = 1; if ($5 > runs) runs = $5 }
        # The median over the rounds where both ran of Gloo's latency over sys's.
        function ratio(sys, k,   i, n, a) {
            n = 0
            for (i = 1; i <= runs; i++)
                if (r[sys, k, i] > 0 && r["gloo", k, i] > 0) a[++n] = r["gloo", k, i] / r[sys, k, i]
            return n ? median(a, n) : 0
        }
        function cpu_ms(sys, k,   i, n, a) {
            n = c[sys, k]
            for (i = 1; i <= n; i++) a[i] = cp[sys, k, i]
            return n ? median(a, n) / 1000 : 0
        }
        END {
            for (k in keys) {
                split(k, f, " ")
                for (s = 1; s <= 4; s++) {
                    sys = s == 1 ? "insecure" : s == 2 ? "auth" : s == 3 ? "ipc" : "gloo"
                    n = c[sys, k]; delete a
                    for (i = 1; i <= n; i++) a[i] = v[sys, k, i]
                    m[sys] = n ? median(a, n) : 0
                }
                bytes = f[2] * 4
                size = bytes >= 1048576 ? bytes / 1048576 " MB" : bytes / 1024 " KB"
                printf "%d %d | %s | %s | %d us | %.3f | %d us | %.3f | %d us | %.3f | %d us | %.3f | %.2fx | %.2fx | %.2fx | %.2f ms | %.2f ms |\n",
                    f[1], f[2], f[1], size,
                    m["insecure"], m["insecure"] ? bytes / m["insecure"] / 1e3 : 0,
                    m["auth"], m["auth"] ? bytes / m["auth"] / 1e3 : 0,
                    m["ipc"], m["ipc"] ? bytes / m["ipc"] / 1e3 : 0,
                    m["gloo"], m["gloo"] ? bytes / m["gloo"] / 1e3 : 0,
                    ratio("insecure", k), ratio("auth", k), ratio("ipc", k), cpu_ms("ipc", k),
                    cpu_ms("gloo", k)
            }
        }
AWK
    ) "$res" | sort -n -k1,1 -k2,2 | cut -d' ' -f3-
    echo
    echo "x / Gloo: the median over the rounds of Gloo's latency over chainps's in that round (above" \
        "1: chainps is faster). CPU: rank 0's median process CPU time (all threads) per all-reduce."
} >"$out"
cat "$out"
