#!/usr/bin/env bash
# Backup workers (issue 16): sync step time with one worker 2x slower, with and without a
# backup worker.
#
#   bench/run_backup.sh [BUILD_DIR]     (default: build-bench beside this folder's parent)
#
# A 3-worker, 2-server sync job of tests/integration/lsq_worker (least squares, 16 values: the
# step is the worker's own time, not the network's) in which every worker "computes" BASE_MS
# (sleeps) per step and rank 2 twice that; three configurations: no straggler (all BASE_MS,
# --backup-workers 0: the floor), the straggler with --backup-workers 0 (today: every step waits
# for it) and with --backup-workers 1 (steps close with the first two gradients). Each runs RUNS
# times, alternating; a run's step time is a fast worker's (rank 0) wall time over its STEPS
# steps. The table gives the median over runs with min-max, the straggler's dropped pushes and
# the job's wall time. Knobs: RUNS (5), STEPS (300), BASE_MS (5), KEEP=1 keeps raw results. The
# machine may be shared with other work: the load average is printed before and after.
set -u

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
bench_prepare run_backup "${1:-}" chainps tests/integration/lsq_worker
bench_report "" "$@"
CHAINPS=$build/chainps
LSQ=$build/tests/integration/lsq_worker
RUNS=${RUNS:-5}
STEPS=${STEPS:-300}
BASE_MS=${BASE_MS:-5}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "chainps backup-workers benchmark on $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC')," \
    "load average $load0"
echo "3 workers (rank 2 the straggler), 2 servers, sync; $STEPS steps of ${BASE_MS} ms" \
    "(straggler $((2 * BASE_MS)) ms), $RUNS runs each"
configs=("none 0 0" "2x 0 $BASE_MS" "2x 1 $BASE_MS")
for ((run = 1; run <= RUNS; run++)); do
    for c in "${configs[@]}"; do
        read -r name b extra <<<"$c"
        t0=$(date +%s.%N)
        if ! "$CHAINPS" launch --insecure --servers 2 --workers 3 --mode sync --backup-workers "$b" \
            --timeout 300 -- "$LSQ" --steps "$STEPS" --base-ms "$BASE_MS" --step-ms "$extra" \
            --slow-rank 2 --tol 1 >"$log" 2>&1; then
            echo "run_backup: job ($name, b=$b) failed:" >&2
            tail -20 "$log" >&2
            exit 1
        fi
        t1=$(date +%s.%N)
        fast=$(sed -n 's/^\[worker 0\] trained \([0-9]*\) steps in \([0-9.]*\) s$/\1 \2/p' "$log")
        late=$(sed -n 's/^\[worker 2\] rank 2: \([0-9]*\) late pushes.*/\1/p' "$log")
        echo "$name $b $fast ${late:-0} $(echo "$t1 - $t0" | bc)" >>"$res"
    done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)
awk -v base="$BASE_MS" '
function median(a, n,   i, j, t) {
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
    k = $1 " " $2; n[k]++
    ms[k, n[k]] = 1000 * $4 / $3; late[k, n[k]] = $5; wall[k, n[k]] = $6
    if (!(k in seen)) { order[++nk] = k; seen[k] = 1 }
}
END {
    printf "%-22s %-14s %-17s %-18s %-10s\n", "straggler, backup", "step ms (med)", "min-max", "straggler dropped", "job s"
    for (i = 1; i <= nk; i++) {
        k = order[i]; m = n[k]
        for (r = 1; r <= m; r++) { a[r] = ms[k, r]; b[r] = late[k, r]; c[r] = wall[k, r] }
        lo = hi = a[1]; for (r = 2; r <= m; r++) { if (a[r] < lo) lo = a[r]; if (a[r] > hi) hi = a[r] }
        med = median(a, m); if (i == 1) floor = med
        split(k, kk, " ")
        label = (kk[1] == "none" ? "none" : "1 worker 2x") ", b=" kk[2]
        printf "%-22s %-14s %-17s %-18s %-10s\n", label, sprintf("%.2f (%.2fx)", med, med / floor),
            sprintf("%.2f-%.2f", lo, hi), median(b, m), sprintf("%.2f", median(c, m))
    }
}' "$res"
echo "load average after: $load1 (before: $load0)"
