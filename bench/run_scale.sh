#!/usr/bin/env bash
# Scale-out while training (issue 16): a sync job on 2 servers (chains of 2, 8 ranges) trains one
# dense tensor with ckpt_worker; 2 s into training two more servers are started against it. The
# table gives, per model size, medians over REPS runs [min-max]:
#   balanced_ms   from the new servers' start to the view in which all 4 servers hold 4 ranges
#                 each and no copy is under way (polled with `chainps status --json` every
#                 100 ms: the figure is that coarse);
#   longest_ms    the longest push_pull any worker call saw from the start to 1 s after that;
#   step_ms       the median step before the start, for comparison.
# usage: bench/run_scale.sh [BUILD_DIR]     (env REPS=3, SIZES="2500000 100000000" parameters:
#        10 MB and 400 MB)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-bench}
reps=${REPS:-3}
sizes=${SIZES:-"2500000 100000000"}
py=/usr/bin/python3
[ -x "$py" ] || py=python3
if [ ! -x "$build/chainps" ] || [ ! -x "$build/bench/ckpt_worker" ]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$build" -j"$(nproc)" --target chainps_cli ckpt_worker >/dev/null
fi
cps=$build/chainps
worker=$build/bench/ckpt_worker
tmp=$(mktemp -d)
# shellcheck source=lib.sh
. "$root/bench/lib.sh"
bench_report "" "$@"
work=$tmp
cleanup() {
    stop_all
    rm -rf "$tmp"
}
trap cleanup EXIT

now_ms() { "$worker" --now; }

balanced() { # SCHED SECRET
    "$cps" status --scheduler "$1" --secret-file "$2" --json 2>/dev/null >"$tmp/status.json" || return 1
    "$py" - "$tmp/status.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
servers = [n["id"] for n in s["nodes"] if n["role"] == "server" and n["alive"]]
held = [sum(i in r["chain"] for r in s["ranges"]) for i in servers]
busy = any("copying" in r for r in s["ranges"])
sys.exit(0 if len(servers) == 4 and all(h == 4 for h in held) and not busy else 1)
EOF
}

one_run() { # PARAMS -> prints "balanced_ms longest_ms step_ms"
    local params=$1 d=$tmp/run
    rm -rf "$d"
    mkdir -p "$d"
    "$cps" secret "$d/secret" >/dev/null
    "$cps" launch --servers 2 --workers 1 --replicas 2 --ranges 8 --mode sync --timeout 600 \
        --secret-file "$d/secret" -- "$worker" --params "$params" --steps 100000000 \
        --stop-file "$d/stop" >"$d/launch.log" 2>&1 &
    local lp=$!
    pids+=("$lp")
    for _ in $(seq 600); do grep -q "step 5 t_ms" "$d/launch.log" && break; sleep 0.1; done
    local port
    port=$(sed -n 's/^launch: scheduler on 127.0.0.1:\([0-9]*\),.*/\1/p' "$d/launch.log")
    local sched=127.0.0.1:$port
    sleep 2
    local t0 t1
    t0=$(now_ms)
    for k in 0 1; do
        "$cps" server --scheduler "$sched" --secret-file "$d/secret" --data "$d/extra-$k" \
            >"$d/extra-$k.log" 2>&1 &
        pids+=("$!")
    done
    t1=
    for _ in $(seq 1200); do
        if balanced "$sched" "$d/secret"; then t1=$(now_ms); break; fi
        sleep 0.1
    done
    sleep 1
    touch "$d/stop"
    wait "$lp" || true
    [ -n "$t1" ] || { echo "never balanced" >&2; tail -20 "$d/launch.log" >&2; return 1; }
    "$py" - "$d/launch.log" "$t0" "$t1" <<'EOF'
import re, statistics, sys
log, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
steps = [(float(m.group(1)), float(m.group(2)))
         for m in re.finditer(r"step \d+ t_ms ([0-9.]+) dur_ms ([0-9.]+)", open(log).read())]
before = [d for e, d in steps if e < t0]
during = [d for e, d in steps if e - d <= t1 + 1000 and e >= t0]
print(f"{t1 - t0:.0f} {max(during):.0f} {statistics.median(before):.1f}")
EOF
}

printf '%-10s %-22s %-22s %-14s\n' model balanced_ms longest_call_ms step_ms
for params in $sizes; do
    rows=()
    for _ in $(seq "$reps"); do rows+=("$(one_run "$params")"); done
    printf '%s\n' "${rows[@]}" | "$py" -c '
import statistics, sys
rows = [list(map(float, l.split())) for l in sys.stdin if l.strip()]
mb = int(sys.argv[1]) * 4 / 1e6
cols = []
for i in range(3):
    v = [r[i] for r in rows]
    cols.append(f"{statistics.median(v):.0f} [{min(v):.0f}-{max(v):.0f}]")
print(f"{mb:<10.0f} {cols[0]:<22} {cols[1]:<22} {cols[2]:<14}")' "$params"
done
echo "load average: $(cut -d" " -f1-3 /proc/loadavg)"
