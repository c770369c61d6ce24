#!/usr/bin/env bash
# What message authentication costs (issue 12): bench_ps under `chainps launch` (1 server, 1
# worker, async, dense random gradients) with the job's secret (every message sealed and
# checked with ChaCha20-Poly1305; GMAC before wire version 4) and with --insecure, in interleaved
# rounds so both see the same machine. bench/run_ab.sh compares two builds the same way, and
# bench_auth times the MAC alone per message size.
# Prints per round and the medians: 4 KB push p50 (us) and 1 MB push+pull pipelined MB/s, and
# their ratios secret/insecure.
# Usage: bench/run_auth.sh [BUILD_DIR]   env: ROUNDS (5), MS (400), REPS (3)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
build=${1:-$here/../build/release}
CHAINPS=$build/chainps
BENCH_PS=$build/bench/bench_ps
for b in "$CHAINPS" "$BENCH_PS"; do
    [ -x "$b" ] || { echo "run_auth: $b missing: build first (cmake --build $build)" >&2; exit 2; }
done
ROUNDS=${ROUNDS:-5} MS=${MS:-400} REPS=${REPS:-3}
work=$(mktemp -d "${TMPDIR:-/tmp}/chainps-auth-bench-XXXXXX")
bench_report "" "$@"
trap 'rm -rf "$work"' EXIT
unset CHAINPS_SECRET_FILE CHAINPS_INSECURE
"$CHAINPS" secret "$work/job.secret" >/dev/null

run() { # mode out
    local flag=(--secret-file "$work/job.secret")
    [ "$1" = off ] && flag=(--insecure)
    : >"$2"
    timeout 300 "$CHAINPS" launch --servers 1 --workers 1 --mode async --timeout 240 "${flag[@]}" \
        -- "$BENCH_PS" --out "$2" --reps "$REPS" --ms "$MS" --sizes 4096,1048576 --data dense \
        >"$work/log" 2>&1 || { echo "run_auth: a run failed:" >&2; tail -20 "$work/log" >&2; exit 1; }
}
field() { # file size key
    awk -v sz="$2" -v k="$3" '$0 ~ ("size=" sz " ") { for (i = 1; i <= NF; i++) {
        split($i, kv, "="); if (kv[1] == k) print kv[2] } }' "$1"
}
printf "%-6s %-9s %14s %18s\n" round secret "4KB push p50 us" "1MB pp MB/s"
for r in $(seq "$ROUNDS"); do
    for m in on off; do
        run "$m" "$work/$m.$r"
        printf "%-6s %-9s %14s %18s\n" "$r" "$m" "$(field "$work/$m.$r" 4096 push_p50)" \
            "$(field "$work/$m.$r" 1048576 pp_mbps)"
    done
done
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for m in on off; do
    eval "p50_$m=\$(for r in \$(seq $ROUNDS); do field $work/$m.\$r 4096 push_p50; done | median)"
    eval "mbs_$m=\$(for r in \$(seq $ROUNDS); do field $work/$m.\$r 1048576 pp_mbps; done | median)"
done
echo
echo "medians over $ROUNDS interleaved rounds:"
printf "  4 KB push p50:          secret %s us, insecure %s us, difference %s us\n" "$p50_on" \
    "$p50_off" "$(awk -v a="$p50_on" -v b="$p50_off" 'BEGIN { printf "%+.1f", a - b }')"
printf "  1 MB push+pull MB/s:    secret %s, insecure %s, ratio %s\n" "$mbs_on" "$mbs_off" \
    "$(awk -v a="$mbs_on" -v b="$mbs_off" 'BEGIN { printf "%.3f", a / b }')"
