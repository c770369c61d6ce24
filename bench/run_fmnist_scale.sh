#!/usr/bin/env bash
# Fashion-MNIST MLP: a 2-worker parameter-server job against the same program alone (issue 14's
# scaling target: 2 workers >= 0.9x the single-process local run).
#
#   bench/run_fmnist_scale.sh [BUILD_DIR [BASE_BUILD_DIR]]   (default: build/rel beside bench/)
#
# Rows, run REPS times (default 3) in interleaved rounds so that drift of a shared machine hits
# every row alike, each over the same EPOCHS (default 5) of batch 64 per worker:
#   local          fmnist --local --model mlp: one process, one BLAS thread (the baseline)
#   local, 2 BLAS  the same with OPENBLAS_NUM_THREADS=2 (LOCAL2=0 drops the row): what the
#                  baseline makes of the second core
#   2w2s           chainps launch --servers 2 --workers 2 -- fmnist --model mlp: sync mode (the
#                  default), chains of 2, authenticated (the default); every push-pull started as
#                  backward finishes its layer
#   2w2s no-overlap  the same with --no-overlap: every push-pull started after the whole backward
#                  (only if the binary has the flag)
#   2w2s base      the job with BASE_BUILD_DIR's binaries (an older commit), if given
#   with EXTRA="insecure r1 lean" (optional, for the cost breakdown): the job with --insecure
#                  (no message authentication), with --replicas 1 (no chain: one copy per range),
#                  and with both
# Metric: training samples per second of the whole job over the training loop only. fmnist prints
# a `train:` line per process with its samples and the wall time of its loop (start-up, data
# loading, declarations, evaluations and the final pull excluded); the job's rate is the sum of
# its workers' samples over rank 0's loop time (rank 0 evaluates between epochs outside its loop,
# rank 1 waits for it inside its own, so rank 1's time would count the evaluations). "vs local"
# divides the median by the local row's median. Also per row (medians):
#   wait s      rank 0's time inside cps_wait (communication not hidden behind compute)
#   cpu ms/1k   CPU per 1000 samples: the workers' during their loops; and the whole job's
#               (/usr/bin/time over `chainps launch`: workers, servers, scheduler, start-up and
#               evaluation included), with the servers' and scheduler's share (job minus workers'
#               whole processes). On C cores a job cannot beat C / (job CPU per sample).
#   acc %       test accuracy after EPOCHS (sync 2 workers average their gradients: a global batch
#               of 128, half the updates per epoch of the local run)
#   tta s       time to accuracy: loop seconds until the per-epoch test accuracy first reached
#               TTA (default 86) percent, "-" if it never did
# Prints the load average before, after, and with each round. Every run is bounded (timeout(1)
# ends the launcher by its PID; the launcher ends the processes it started by theirs). Knobs:
# REPS, EPOCHS, TTA, LOCAL2, EXTRA, KEEP=1 keeps the raw results. All on 127.0.0.1.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
root=$(cd "$here/.." && pwd)
build=${1:-$root/build/rel}
build=$(cd "$build" && pwd) || exit 2
base=${2:-}
if [ -n "$base" ]; then base=$(cd "$base" && pwd) || exit 2; fi
REPS=${REPS:-3}
EPOCHS=${EPOCHS:-5}
TTA=${TTA:-86}
LOCAL2=${LOCAL2:-1}
for b in "$build" $base; do
    for p in chainps examples/fmnist; do
        [ -x "$b/$p" ] || { echo "run_fmnist_scale: $b/$p not built" >&2; exit 2; }
    done
done
[ -x /usr/bin/time ] || { echo "run_fmnist_scale: /usr/bin/time (Debian's time) missing" >&2; exit 2; }
data=${FMNIST_DATA:-/usr/share/datasets/fashion-mnist}
[ -r "$data/train-images-idx3-ubyte.gz" ] || { echo "run_fmnist_scale: no data in $data" >&2; exit 2; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/chainps-fmnist-scale-XXXXXX")
res=$tmp/results
cleanup() {
    if [ "${KEEP:-0}" = 1 ]; then echo "raw results kept in $tmp"; else rm -rf "$tmp"; fi
}
bench_report "" "$@"
trap cleanup EXIT
trap 'exit 130' INT TERM

# A job of 5 epochs takes ~10-40 s here; the bounds leave room for a machine 10x busier.
LIMIT=$((120 * EPOCHS + 60))
args=(--model mlp --epochs "$EPOCHS" --log-every 0 --data "$data")

rows=("local" "2w2s")
[ "$LOCAL2" = 1 ] && rows=("local" "local-2blas" "2w2s")
"$build/examples/fmnist" --help | grep -q -- --no-overlap && rows+=("2w2s-no-overlap")
[ -n "$base" ] && rows+=("2w2s-base")
for e in ${EXTRA:-}; do
    case $e in
    insecure | r1 | lean) rows+=("2w2s-$e") ;;
    *) echo "run_fmnist_scale: EXTRA: unknown row '$e' (insecure, r1, lean)" >&2; exit 2 ;;
    esac
done

# One run of row $1, round $2: appends "row samples loop wait wcpu wproc jobcpu acc tta" to $res.
run_row() {
    local row=$1 r=$2 b=$build extra=() out=$tmp/$1-$2 env=() launch=1 lflags=()
    case $row in
    local) launch=0 ;;
    local-2blas) launch=0 env=(OPENBLAS_NUM_THREADS=2) ;;
    2w2s-no-overlap) extra=(--no-overlap) ;;
    2w2s-base) b=$base ;;
    2w2s-insecure) lflags=(--insecure) ;;
    2w2s-r1) lflags=(--replicas 1) ;;
    2w2s-lean) lflags=(--insecure --replicas 1) ;;
    esac
    local cmd=("$b/examples/fmnist" "${args[@]}" "${extra[@]}" --out "$out")
    if [ "$launch" = 1 ]; then
        cmd=("$b/chainps" launch --servers 2 --workers 2 "${lflags[@]}" --timeout "$LIMIT" --
            "${cmd[@]}")
    else
        cmd=("${cmd[0]}" --local "${cmd[@]:1}")
    fi
    if ! env "${env[@]}" /usr/bin/time -f "%e %U %S" -o "$out.time" \
        timeout -k 10 $((LIMIT + 30)) "${cmd[@]}" >"$out.log" 2>&1; then
        echo "run_fmnist_scale: $row (round $r) failed:" >&2
        tail -15 "$out.log" >&2
        return 1
    fi
    # "[worker N] " prefixes the launched workers' lines; rank 0 is worker 0.
    sed -E 's/^\[worker ([0-9]+)\] /\1 /; t; s/^/0 /' "$out.log" | awk -v row="$row" \
        -v tta="$TTA" -v tf="$out.time" '
    $2 == "train:" {
        n++; samples += $3; cpu += $14; proc += $20
        if ($1 == 0) { loop = $8; wait = $11 }
    }
    $1 == 0 && $2 == "epoch:" && $4 == "test" && !got {
        a = $6; sub(/%/, "", a)
        if (a + 0 >= tta) { got = 1; t = $8 }
    }
    $1 == 0 && $2 == "final:" { acc = $5; sub(/%,?/, "", acc) }
    END {
        if (!n || !loop) exit 1
        getline tl < tf; split(tl, tt, " ")
        printf "%s %d %.3f %.3f %.3f %.3f %.3f %s %s\n", row, samples, loop, wait, cpu, proc,
            tt[2] + tt[3], acc, got ? t : "-"
    }' >>"$res" || { echo "run_fmnist_scale: $row (round $r): no train: line" >&2; return 1; }
}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "fmnist MLP scaling on $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load average $load0"
echo "build $build ($(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'))${base:+, base $base}"
echo "$REPS rounds of: ${rows[*]}; $EPOCHS epochs of batch 64 per worker"
for ((r = 1; r <= REPS; r++)); do
    # Rotate the order each round, so no row always runs first (after a pause) or last.
    n=${#rows[@]}
    for ((k = 0; k < n; k++)); do
        run_row "${rows[$(((k + r - 1) % n))]}" "$r"
    done
    echo "round $r done, load average $(cut -d' ' -f1-3 /proc/loadavg)"
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)

# shellcheck disable=SC2016 # an awk program: its $ are awk's
table='
function col(k, c,   i, a) { for (i = 1; i <= cnt[k]; i++) a[i] = v[k, i, c]; return median(a, cnt[k]) }
{
    k = $1; i = ++cnt[k]
    v[k, i, 1] = $2 / $3                   # job samples/s
    v[k, i, 2] = $4                        # rank 0 waiting s
    v[k, i, 3] = 1e6 * $5 / $2             # workers loop CPU ms per 1000 samples
    v[k, i, 4] = 1e6 * $7 / $2             # whole job CPU ms per 1000 samples
    v[k, i, 5] = 1e6 * ($7 - $6) / $2      # servers + scheduler + launcher
    v[k, i, 6] = $8; v[k, i, 7] = $9; v[k, i, 8] = $3
}
END {
    names["local"] = "local (1 process)"; names["local-2blas"] = "local, 2 BLAS threads"
    names["2w2s"] = "2 workers, 2 servers"; names["2w2s-no-overlap"] = "  the same, --no-overlap"
    names["2w2s-base"] = "  the same, base build"
    names["2w2s-insecure"] = "  the same, --insecure"; names["2w2s-r1"] = "  the same, --replicas 1"
    names["2w2s-lean"] = "  --insecure --replicas 1"
    printf "\n%-25s %9s %15s %7s %7s %6s %21s %7s %6s\n", "", "samples/s", "min-max", "vs local",
        "loop s", "wait s", "cpu ms/1k: wk job srv", "acc %", "tta s"
    nk = split(order, ks, " ")
    for (o = 1; o <= nk; o++) {
        k = ks[o]; if (!cnt[k]) continue
        lo = hi = v[k, 1, 1]
        for (i = 2; i <= cnt[k]; i++) { if (v[k, i, 1] < lo) lo = v[k, i, 1]; if (v[k, i, 1] > hi) hi = v[k, i, 1] }
        m = col(k, 1); if (k == "local") ref = m
        delete tt; nt = 0; for (i = 1; i <= cnt[k]; i++) if (v[k, i, 7] != "-") { tt[++nt] = v[k, i, 7] }
        tta = nt * 2 > cnt[k] ? sprintf("%.2f", median(tt, nt)) : "-"
        srv = k ~ /^local/ ? "-" : sprintf("%.1f", col(k, 5))
        printf "%-25s %9.0f %15s %7s %7.2f %6.2f %7.1f %6.1f %6s %7.2f %6s\n", names[k], m,
            sprintf("%.0f-%.0f", lo, hi), ref ? sprintf("%.2fx", m / ref) : "-", col(k, 8),
            col(k, 2), col(k, 3), col(k, 4), srv, col(k, 6), tta
    }
}'
awk -v order="${rows[*]}" -f "$here/lib_median.awk" -f <(printf '%s\n' "$table") "$res"
echo "load average after: $load1 (before: $load0)"
