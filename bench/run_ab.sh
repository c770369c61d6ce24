#!/usr/bin/env bash
# Two builds of chainps side by side in ps-lite's benchmark loop (bench_ps --loop pslite, the
# chainps side of bench/run_pslite.sh, no ps-lite needed): what a change does to throughput and
# latency, each build with a job secret and with --insecure, in interleaved rounds.
#
#   bench/run_ab.sh BUILD_A BUILD_B     (Release build directories; A is usually the baseline)
#
# Cells as in run_pslite.sh: 1 worker 1 server at SIZES (default 4 KB, 64 KB, 1 MB, 16 MB, one
# run per side covers them), and 2 workers 2 servers with chains of 2 at 1 MB. Four sides per
# cell (A, A --insecure, B, B --insecure), their order rotating from round to round so a slow
# minute of a shared machine does not fall on one side only. The table: per cell and metric the
# median of the rounds (min-max), and B/A per round (median, min-max) with the secret and
# without. GB/s counts pushed + pulled bytes (10^9 B/s), summed over the workers; latencies are
# the slower worker's. The load average at the start and the end is printed: this machine may
# be shared, and 2 cores do not leave much to other programs.
#
# CPU=1 runs each size in a job of its own under /usr/bin/time and adds "CPU ms/GB": the CPU
# time (user + system) of all the job's processes, scheduler, servers and workers, start and
# warm-up included, per 10^9 bytes pushed and pulled. On a machine shared with other work that is
# the steadier measure: wall-clock rates follow the share of the cores the job got, CPU time
# mostly what the job did.
#
# Environment: ROUNDS (3), ITERS (per size; default bench_ps's 1 GiB / size in [60, 2000]),
# SIZES, MODE (sync), CPU (0), KEEP=1 keeps the raw lines. Every process runs under `timeout` and is ended
# by its PID on exit; everything listens on 127.0.0.1 only.
set -u
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 2 ] || { echo "usage: $0 BUILD_A BUILD_B" >&2; exit 2; }
builds=()
for b in "$1" "$2"; do
    d=$(cd "$b" && pwd) || exit 2
    for p in chainps bench/bench_ps; do
        [ -x "$d/$p" ] || { echo "run_ab: $d/$p not built" >&2; exit 2; }
    done
    builds+=("$d")
done
ROUNDS=${ROUNDS:-3}
SIZES=${SIZES:-4096,65536,1048576,16777216}
MODE=${MODE:-sync}
case $ROUNDS in '' | *[!0-9]* | 0) echo "run_ab: ROUNDS must be a positive number" >&2; exit 2 ;; esac
unset CHAINPS_INSECURE CHAINPS_SECRET_FILE
work=$(mktemp -d "${TMPDIR:-/tmp}/chainps-ab-XXXXXX") || exit 2
pids=()
# shellcheck source=lib.sh
. "$here/lib.sh"
cleanup() {
    stop_all
    if [ "${KEEP:-0}" = 1 ]; then echo "raw results kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
"${builds[1]}/chainps" secret "$work/job.secret" >/dev/null || exit 2

job() { # SIDE SERVERS WORKERS SIZES ROUND [TIME_FILE]: one chainps launch
    local b=${builds[0]} flags=(--secret-file "$work/job.secret") fail=0 timer=()
    case $1 in B*) b=${builds[1]} ;; esac
    case $1 in *_insecure) flags=(--insecure) ;; esac
    [ -n "${6:-}" ] && timer=(/usr/bin/time -f "%U %S" -o "$6")
    : >"$work/run.txt"
    "${timer[@]}" timeout -k 5 200 "$b/chainps" launch --servers "$2" --replicas "$2" \
        --workers "$3" --mode "$MODE" --timeout 180 "${flags[@]}" -- "$b/bench/bench_ps" \
        --loop pslite --sizes "$4" ${ITERS:+--ops "$ITERS"} --out "$work/run.txt" \
        >"$work/run.log" 2>&1 &
    pids+=($!)
    wait "$!" || fail=1
    pids=()
    if [ "$fail" != 0 ] || ! [ -s "$work/run.txt" ]; then
        failed=$((failed + 1))
        echo "run_ab: side $1 ($2 servers, $3 workers) failed:" >&2
        tail -15 "$work/run.log" >&2
    fi
    local cpu=
    [ -n "${6:-}" ] && cpu=" cpu_s=$(awk '{ print $1 + $2 }' "$6")"
    sed "s/\$/ round=$5 side=$1$cpu/" "$work/run.txt" >>"$work/all.txt"
}
run() { # SIDE SERVERS WORKERS SIZES ROUND: all sizes in one job, or one job per size (CPU=1)
    local s
    if [ "${CPU:-0}" = 1 ]; then
        for s in ${4//,/ }; do
            job "$1" "$2" "$3" "$s" "$5" "$work/time"
        done
    else
        job "$@"
    fi
}

failed=0
start=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "A: ${builds[0]} ($(git -C "${builds[0]}" rev-parse --short HEAD 2>/dev/null || echo ?))"
echo "B: ${builds[1]} ($(git -C "${builds[1]}" rev-parse --short HEAD 2>/dev/null || echo ?))"
echo "$(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load average $load0; $ROUNDS rounds, mode $MODE"
sides=(A B A_insecure B_insecure)
for ((r = 1; r <= ROUNDS; r++)); do
    for cell in "1:1:$SIZES" "2:2:1048576"; do
        IFS=: read -r S W sz <<<"$cell"
        for ((k = 0; k < 4; k++)); do
            run "${sides[$(((k + r - 1) % 4))]}" "$S" "$W" "$sz" "$r"
        done
    done
    echo "round $r of $ROUNDS done ($(($(date +%s) - start)) s, load $(cut -d' ' -f1 /proc/loadavg))"
done

# The END rule; the lines and stat(): bench/pslite_loop.awk.
table='
END {
    nm = split("pp_gbps push_p50_us push_p99_us pull_p50_us", metrics, " ")
    split("pp GB/s,push p50 us,push p99 us,pull p50 us", mname, ",")
    for (k in bytes) {
        sum[k, "cpu_ms_gb"] = cpu[k] * 1e12 / bytes[k]
        if (nm == 4) { metrics[++nm] = "cpu_ms_gb"; mname[nm] = "CPU ms/GB" }
    }
    for (k in runs) {
        split(k, p, SUBSEP)
        for (i = 1; i <= nm; i++) {
            key = p[1] SUBSEP p[2] SUBSEP metrics[i]
            val[key, ++cnt[key]] = sum[k, metrics[i]]
            if (p[2] ~ /^B/) {
                o = p[1] SUBSEP "A" substr(p[2], 2) SUBSEP p[3]
                if ((o in runs) && sum[o, metrics[i]] > 0) {
                    key = p[1] SUBSEP "ratio" substr(p[2], 2) SUBSEP metrics[i]
                    val[key, ++cnt[key]] = sum[k, metrics[i]] / sum[o, metrics[i]]
                }
            }
        }
    }
    printf "\nmedian of the rounds (min-max); B/A: median of the per-round ratios (min-max)\n"
    printf "%-10s %-12s | %-22s %-22s %-17s | %-22s %-22s %-17s\n", "cell", "metric", "A secret",
           "B secret", "B/A", "A --insecure", "B --insecure", "B/A --insecure"
    for (ci = 1; ci <= ncells; ci++) {
        c = cells[ci]
        for (i = 1; i <= nm; i++) {
            m = metrics[i]
            fmt = m == "pp_gbps" ? "%.3f" : "%.0f"
            if (m == "cpu_ms_gb") fmt = "%.1f"
            printf "%-10s %-12s | %-22s %-22s %-17s | %-22s %-22s %-17s\n", i == 1 ? c : "",
                   mname[i], stat(c SUBSEP "A" SUBSEP m, fmt), stat(c SUBSEP "B" SUBSEP m, fmt),
                   stat(c SUBSEP "ratio" SUBSEP m, "%.2f"),
                   stat(c SUBSEP "A_insecure" SUBSEP m, fmt),
                   stat(c SUBSEP "B_insecure" SUBSEP m, fmt),
                   stat(c SUBSEP "ratio_insecure" SUBSEP m, "%.2f")
        }
    }
    printf "took %d s; load average %s at start, %s at end\n", secs, load0, load1
}'
awk -v load0="$load0" -v load1="$(cut -d' ' -f1-3 /proc/loadavg)" -v secs="$(($(date +%s) - start))" \
    -f "$here/pslite_loop.awk" -f <(printf '%s\n' "$table") "$work/all.txt"
[ "$failed" = 0 ] || { echo "run_ab: $failed runs failed" >&2; exit 1; }
