#!/usr/bin/env bash
# Python's per-call cost over C's: push_pull from bench_python.py (numpy and torch buffers)
# against bench_ps (C), each under `chainps launch --servers 1 --workers 1`, for 4 KB and 1 MB,
# in interleaved rounds. Prints medians over the rounds with min-max, the difference in
# microseconds per blocking call, the throughput ratio, and the worker's CPU time per call (the
# steadiest measure of what Python adds: wall-clock round trips on this VM drift by tens of us).
#
#   bench/run_python.sh [BUILD_DIR]     (default build/rel; a Release build measures best)
# Knobs: REPS (rounds, 5), MS (ms per run, 1000), DEPTH (pipelined calls in flight, 4).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
root=$(cd "$here/.." && pwd)
build=$(cd "${1:-$root/build/rel}" && pwd) || exit 2
CHAINPS=$build/chainps
BENCH_PS=$build/bench/bench_ps
PY=/usr/bin/python3
export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH}
REPS=${REPS:-5}
MS=${MS:-1000}
DEPTH=${DEPTH:-4}
for b in "$CHAINPS" "$BENCH_PS"; do [ -x "$b" ] || { echo "run_python: $b not built" >&2; exit 2; }; done
res=$(mktemp "${TMPDIR:-/tmp}/chainps-pybench-XXXXXX")
bench_report "" "$@"
trap 'rm -f "$res" "$res.c"' EXIT
trap 'exit 130' INT TERM
echo "Python vs C push_pull, $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
job=(launch --servers 1 --workers 1 --timeout 600 --)
for r in $(seq 1 "$REPS"); do
    rm -f "$res.c"
    "$CHAINPS" "${job[@]}" "$BENCH_PS" --out "$res.c" --reps 1 --ms "$MS" --sizes 4096,1048576 \
        --depth "$DEPTH" --data dense --only pp >/dev/null 2>&1
    sed -nE 's/.* size=([0-9]+) .*pp_mbps=([0-9.]+) .*pp_p50=([0-9.]+) .*worker_cpu_us_per_op=([0-9.]+) .*/c \1 \3 \2 \4/p' "$res.c" >>"$res"
    for buf in numpy torch; do
        extra=()
        [ $buf = torch ] && extra=(--torch)
        "$CHAINPS" "${job[@]}" "$PY" "$here/bench_python.py" --reps 1 --ms "$MS" --depth "$DEPTH" \
            "${extra[@]}" 2>/dev/null |
            sed -nE -e "s/.*py size=([0-9]+) pp_p50=([0-9.]+) pp_mbps=([0-9.]+) cpu_us=([0-9.]+).*/$buf \1 \2 \3 \4/p" \
                -e "s/.*py binding=([a-z]+) us=([0-9.]+).*/binding \1 \2 0 0/p" >>"$res"
    done
    echo "round $r of $REPS done"
done
awk '
function med(k,   n, i, j, t, a) {
    n = cnt[k]; for (i = 1; i <= n; i++) a[i] = val[k, i]
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    lo[k] = a[1]; hi[k] = a[n]
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ for (f = 0; f < 3; f++) { k = $1 SUBSEP $2 SUBSEP f; cnt[k]++; val[k, cnt[k]] = $(3 + f) } }
END {
    printf "\n%-6s %-8s %22s %9s %24s %7s %12s %9s\n", "size", "caller", "push_pull p50 us", "+us", "pipelined MB/s", "vs C", "CPU us/call", "+CPU us"
    split("4096 1048576", sizes, " "); split("c numpy torch", who, " ")
    for (s = 1; s <= 2; s++) for (w = 1; w <= 3; w++) {
        k0 = who[w] SUBSEP sizes[s] SUBSEP 0; k1 = who[w] SUBSEP sizes[s] SUBSEP 1
        if (!cnt[k0]) continue
        k2 = who[w] SUBSEP sizes[s] SUBSEP 2
        p = med(k0); l0 = lo[k0]; h0 = hi[k0]; m = med(k1); l1 = lo[k1]; h1 = hi[k1]; u = med(k2)
        if (w == 1) { cp = p; cm = m; cu = u }
        printf "%-6s %-8s %8.1f (%5.1f-%5.1f) %+9.1f %9.0f (%5.0f-%5.0f) %6.2fx %12.2f %+9.2f\n", sizes[s] == 4096 ? "4 KB" : "1 MB",
            who[w] == "c" ? "C" : "py/" who[w], p, l0, h0, p - cp, m, l1, h1, cm ? m / cm : 0, u, u - cu
    }
}' "$res"
awk '$1 == "binding" { n[$2]++; v[$2, n[$2]] = $3 }
END {
    for (k in n) {
        m = n[k]; for (i = 1; i <= m; i++) a[i] = v[k, i]
        for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        printf "binding cost per push_pull call, %s buffers (no network; argument and buffer checks): %.2f us (%.2f-%.2f)\n", k, m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2, a[1], a[m]
    }
}' "$res"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
