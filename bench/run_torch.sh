#!/usr/bin/env bash
# examples/torch/train.py through chainps against the same script alone, as a table.
#
#   bench/run_torch.sh [BUILD_DIR]      (default: build/rel beside this folder's parent)
#
# For REPS rounds (default 5), interleaved so that drift of the machine hits every row alike:
#   local        one process trains alone (torch.optim, no server): the baseline
#   ps overlap   chainps launch --servers 3 --workers 2 --mode sync, pushes from gradient hooks
#   ps no-overlap  the same, every push started after backward()
# Each run trains STEPS steps (default 300) of batch 64 per worker. samples/s is the job's: for
# the PS rows, the sum over the two workers (each reports its own); the ratio is against local.
# Prints medians with min-max, the load average before and after. All on 127.0.0.1.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
root=$(cd "$here/.." && pwd)
build=${1:-$root/build/rel}
build=$(cd "$build" && pwd) || exit 2
CHAINPS=$build/chainps
PY=/usr/bin/python3
TRAIN=$root/examples/torch/train.py
export PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH}
REPS=${REPS:-5}
STEPS=${STEPS:-300}
[ -x "$CHAINPS" ] || { echo "run_torch: $CHAINPS not built" >&2; exit 2; }
"$PY" -c 'import chainps, torch' || { echo "run_torch: chainps or torch not importable" >&2; exit 2; }

res=$(mktemp "${TMPDIR:-/tmp}/chainps-torch-XXXXXX")
bench_report "" "$@"
trap 'rm -f "$res" "$res.out"' EXIT
trap 'exit 130' INT TERM
echo "examples/torch on $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$REPS rounds of $STEPS steps, batch 64 per worker"

rate_sum() { # output file -> sum of samples/s over the final: lines
    sed -nE 's/.*final: test accuracy [0-9.]+%, ([0-9.]+) samples\/s.*/\1/p' "$1" |
        awk '{s += $1; n++} END {if (n) printf "%.1f %d\n", s, n; else print "0 0"}'
}

for r in $(seq 1 "$REPS"); do
    timeout 600 "$PY" "$TRAIN" --local --steps "$STEPS" --log-every 0 >"$res.out" 2>&1
    read -r v n < <(rate_sum "$res.out")
    [ "$n" = 1 ] && echo "local $v" >>"$res" || { echo "local run failed:"; tail -5 "$res.out"; }
    for ov in overlap no-overlap; do
        extra=()
        [ $ov = no-overlap ] && extra=(--no-overlap)
        timeout 600 "$CHAINPS" launch --servers 3 --workers 2 --mode sync --timeout 580 -- \
            "$PY" "$TRAIN" --steps "$STEPS" --log-every 0 "${extra[@]}" >"$res.out" 2>&1
        read -r v n < <(rate_sum "$res.out")
        [ "$n" = 2 ] && echo "$ov $v" >>"$res" || { echo "$ov run failed:"; tail -5 "$res.out"; }
    done
    echo "round $r done"
done

awk '
function median(a, n,   i, j, t) {
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{ k = $1; n[k]++; v[k, n[k]] = $2 }
END {
    printf "\n%-24s %12s %20s %10s\n", "configuration", "samples/s", "min-max", "vs local"
    split("local overlap no-overlap", order, " ")
    for (o = 1; o <= 3; o++) {
        k = order[o]; if (!n[k]) continue
        delete a; for (i = 1; i <= n[k]; i++) a[i] = v[k, i]
        m[k] = median(a, n[k])
        name = k == "local" ? "local (1 process)" : "2 workers, 3 servers, " k
        printf "%-24s %12.1f %9.1f-%-10.1f %9.2fx\n", name, m[k], a[1], a[n[k]], m["local"] ? m[k] / m["local"] : 0
    }
}' "$res"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
