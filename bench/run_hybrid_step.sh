#!/usr/bin/env bash
# The per-step cost of chainps.torch's all-reduced half (bench_hybrid_step.py): zero_grad() +
# step() of an MLP whose every parameter is all-reduced, median over STEPS steps, for widths
# 64, 256 and 1024 (about 9 K, 85 K and 1.1 M parameters), in a 1-worker `chainps launch` job
# (the ring has one member, so what is measured is the Python side's own cost: copies, listing,
# serialisation). With BASE=<commit> the same runs with that commit's python/chainps (*.py over
# this build's extension) interleave with this tree's, for a before/after table.
#
#   bench/run_hybrid_step.sh [BUILD_DIR]     (default build/release)
# Knobs: REPS (rounds, 3), STEPS (timed steps per run, 1000), BASE (a commit to compare with).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
root=$(cd "$here/.." && pwd)
build=$(cd "${1:-$root/build/release}" && pwd) || exit 2
CHAINPS=$build/chainps
PY=/usr/bin/python3
REPS=${REPS:-3}
STEPS=${STEPS:-1000}
BASE=${BASE:-}
[ -x "$CHAINPS" ] && [ -d "$build/python/chainps" ] || { echo "run_hybrid_step: $build lacks chainps or its python package" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/chainps-hstep-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
trees=(this)
if [ -n "$BASE" ]; then
    # The base's Python files over this build's extension (the binding only grew).
    mkdir -p "$tmp/base/chainps"
    for f in __init__.py checkpoint.py torch.py; do
        git -C "$root" show "$BASE:python/chainps/$f" >"$tmp/base/chainps/$f" || exit 2
    done
    ln -s "$build"/python/chainps/_chainps*.so "$tmp/base/chainps/"
    trees+=(base)
fi
bench_report "" "$@"
echo "chainps.torch all-reduced step cost, $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "tree this = $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- python || echo '+changes')${BASE:+, base = $(git -C "$root" rev-parse --short "$BASE")}"
for r in $(seq 1 "$REPS"); do
    for w in 64 256 1024; do
        for t in "${trees[@]}"; do
            pp=$build/python
            [ "$t" = base ] && pp=$tmp/base
            PYTHONPATH=$pp timeout 300 "$CHAINPS" launch --servers 1 --workers 1 --timeout 280 -- \
                "$PY" "$here/bench_hybrid_step.py" --width "$w" --steps "$STEPS" >"$tmp/out" 2>&1
            line=$(grep -o 'hybrid_step: .*' "$tmp/out") || { tail -5 "$tmp/out"; exit 1; }
            echo "$t $line" >>"$tmp/raw"
        done
    done
done
echo
echo "Median over $REPS runs of each run's median (us per step; zero_grad + step, and the whole"
echo "step with forward and backward):"
echo
echo "| tree | width | parameters | optimizer us | whole step us |"
echo "|---|---|---|---|---|"
cat >"$tmp/report.awk" <<'AWK'
{ k = $1 " " $4; opt[k, ++n[k]] = $10; whole[k, n[k]] = $14; params[k] = $6; keys[k] = 1 }
END {
    for (k in keys) {
        m = n[k]
        for (i = 1; i <= m; i++) { a[i] = opt[k, i]; b[i] = whole[k, i] }
        split(k, f, " ")
        printf "| %s | %s | %s | %.1f | %.1f |\n", f[1], f[2], params[k], median(a, m), median(b, m)
    }
}
AWK
awk -f "$here/lib_median.awk" -f "$tmp/report.awk" "$tmp/raw" | sort -t'|' -k3,3n -k2,2r
