#!/usr/bin/env bash
# Profile `chainps checkpoint export` of a training job: where does the export's time go, and
# what does it take from the training processes?
#
#   bench/profile_ckpt.sh [BUILD_DIR]     (default: build-bench beside this folder's parent)
#
# Starts the job of bench/run_ckpt_cluster.sh (`chainps launch --servers 2 --workers 1` running
# ckpt_worker, PARAMS float32, chains of REPLICAS), waits for WARM steps, then runs EXPORTS
# exports one after the other, each after a window of as many training steps without one. The
# first ones run under `perf stat` (CPU time and page faults of the export process); the last one
# under `perf record -g` (DWARF call graphs), with both servers recorded by `perf record -p` over
# the same window. Prints, per export: its own log lines (where its time went), the job's CPU
# (servers' and worker's threads, from /proc) per training step without an export and during
# it, the CPU of each thread during it; then perf reports (self time by symbol) of the export
# and the servers.
# Outputs stay in OUT (default: a `mktemp -d`, printed): logs and perf data; the job's stores are
# removed at the end (KEEP=1 keeps them). Every process started here (launch, its
# children, perf) is ended by its PID. Loopback only.
#
# Knobs: PARAMS (100000000), REPLICAS (1), WARM (2), EXPORTS (2), CALLGRAPH (dwarf | fp | none).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
build=$(cd "${1:-$here/../build-bench}" && pwd) || exit 2
CHAINPS=$build/chainps
WORKER=$build/bench/ckpt_worker
PARAMS=${PARAMS:-100000000}
REPLICAS=${REPLICAS:-1}
WARM=${WARM:-2}
EXPORTS=${EXPORTS:-2}
CALLGRAPH=${CALLGRAPH:-dwarf}
out=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/chainps-prof-ckpt-XXXXXX")}
mkdir -p "$out"
export LC_ALL=C
"$CHAINPS" secret "$out/job.secret" >/dev/null 2>&1 || true
export CHAINPS_SECRET_FILE=$out/job.secret
launch_pid=
perf_pids=()
cleanup() {
    for p in "${perf_pids[@]}"; do kill -INT "$p" 2>/dev/null; done
    for p in "${perf_pids[@]}"; do wait "$p" 2>/dev/null; done
    if [ -n "$launch_pid" ]; then
        kill "$launch_pid" 2>/dev/null
        for _ in $(seq 100); do kill -0 "$launch_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$launch_pid" 2>/dev/null
        wait "$launch_pid" 2>/dev/null
    fi
    # The servers' stores (their maps are allocated on disk ahead: GBs a run) and the last
    # checkpoint go; the logs and perf data stay. KEEP=1 keeps everything.
    [ "${KEEP:-0}" = 1 ] || rm -rf "$out/data" "$out/ckpt"
}
bench_report "" "$@"
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "profile_ckpt: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg), output in $out"
"$CHAINPS" launch --servers 2 --workers 1 --replicas "$REPLICAS" --data "$out/data" --timeout 300 \
    -- "$WORKER" --params "$PARAMS" --steps 1000000 --stop-file "$out/stop" >"$out/train.log" 2>&1 &
launch_pid=$!
addr=
for _ in $(seq 200); do
    addr=$(sed -n 's/^launch: scheduler on \([0-9.:]*\),.*/\1/p' "$out/train.log")
    [ -n "$addr" ] && break
    sleep 0.1
done
[ -n "$addr" ] || { echo "no scheduler address" >&2; exit 1; }
for _ in $(seq 600); do
    n=$(grep -c '^\[worker 0\] step ' "$out/train.log")
    [ "$n" -gt "$WARM" ] && break
    kill -0 "$launch_pid" 2>/dev/null || { tail "$out/train.log"; exit 1; }
    sleep 0.2
done
spids=() wpid=
for c in $(cat /proc/"$launch_pid"/task/*/children 2>/dev/null); do
    case "$(tr '\0' ' ' </proc/"$c"/cmdline 2>/dev/null)" in
    *" server "*) spids+=("$c") ;;
    *ckpt_worker*) wpid=$c ;;
    esac
done
# CPU ticks of a process and its threads: "pid:tid comm ticks"
ticks() {
    local p t
    for p in "$@"; do
        for t in /proc/"$p"/task/*; do
            awk -v id="$p:${t##*/}" '{ c = $0; sub(/^[^(]*\(/, "", c); sub(/\).*/, "", c)
                sub(/^[^)]*\) /, ""); print id, c, $12 + $13 }' "$t/stat" 2>/dev/null
        done
    done
}
hz=$(getconf CLK_TCK)
steps() { grep -c '^\[worker 0\] step ' "$out/train.log"; }
# The job's CPU (servers' and worker's threads, s) between two tick files.
cpu_of() {
    join <(sort "$1") <(sort "$2") | awk -v hz="$hz" '{ d = $NF - $3; if (d > 0) s += d } END {
        printf "%.2f", s / hz }'
}
for e in $(seq "$EXPORTS"); do
    # A window without an export first, as many steps as the last export overlapped (3 at first).
    q0=$(steps)
    ticks "${spids[@]}" "$wpid" >"$out/qticks0-$e"
    qt0=$(date +%s.%N)
    while [ $(($(steps) - q0)) -lt "${qsteps:-3}" ]; do sleep 0.05; done
    ticks "${spids[@]}" "$wpid" >"$out/qticks1-$e"
    qt1=$(date +%s.%N)
    q1=$(steps)
    ticks "${spids[@]}" "$wpid" >"$out/ticks0-$e"
    s0=$(steps)
    t0=$(date +%s.%N)
    if [ "$e" = "$EXPORTS" ] && [ "$CALLGRAPH" != none ]; then
        cg=(--call-graph "$CALLGRAPH")
        [ "$CALLGRAPH" = dwarf ] && cg=(--call-graph "dwarf,16384")
        for s in "${spids[@]}"; do
            perf record -F 499 "${cg[@]}" -o "$out/server-$s.data" -p "$s" >/dev/null 2>&1 &
            perf_pids+=($!)
        done
        perf record -F 499 "${cg[@]}" -o "$out/export.data" -- "$CHAINPS" checkpoint export \
            --scheduler "$addr" --out "$out/ckpt" >"$out/export-$e.log" 2>&1
        for p in "${perf_pids[@]}"; do kill -INT "$p" 2>/dev/null; done
        for p in "${perf_pids[@]}"; do wait "$p" 2>/dev/null; done
        perf_pids=()
    else
        perf stat -e task-clock,context-switches,page-faults -o "$out/stat-$e.txt" \
            -- "$CHAINPS" checkpoint export --scheduler "$addr" --out "$out/ckpt" \
            >"$out/export-$e.log" 2>&1
    fi
    t1=$(date +%s.%N)
    ticks "${spids[@]}" "$wpid" >"$out/ticks1-$e"
    s1=$(steps)
    rm -rf "$out/ckpt"
    qsteps=$((s1 - s0 > 1 ? s1 - s0 : 2))
    echo "== export $e: $(grep -h '^exported' "$out/export-$e.log" | sed 's/: .*//')"
    grep -h 'export: \|wrote' "$out/export-$e.log" | sed 's/^[0-9:.]* INFO  ckpt: /   /; s/wrote [^ ]* /wrote /'
    [ -f "$out/stat-$e.txt" ] && grep -E 'task-clock|page-faults' "$out/stat-$e.txt" | sed 's/^ */   export process: /'
    cq=$(cpu_of "$out/qticks0-$e" "$out/qticks1-$e")
    ce=$(cpu_of "$out/ticks0-$e" "$out/ticks1-$e")
    awk -v cq="$cq" -v ce="$ce" -v nq=$((q1 - q0)) -v ne=$((s1 - s0)) -v wq="$(echo "$qt1 - $qt0" | bc)" \
        -v we="$(echo "$t1 - $t0" | bc)" 'BEGIN {
        printf "   job CPU (servers + worker): without an export %.2f s over %.2f s, %d steps (%.2f s/step);", cq, wq, nq, nq ? cq / nq : 0
        printf " during it %.2f s over %.2f s, %d steps (%.2f s/step)\n", ce, we, ne, ne ? ce / ne : 0 }'
    echo "   per thread during the export (CPU s):"
    join <(sort "$out/ticks0-$e") <(sort "$out/ticks1-$e") | awk -v hz="$hz" '{
        d = $NF - $3; if (d > 0) printf "     %-14s %-16s %6.2f\n", $1, $2, d / hz }'
done
touch "$out/stop"
for _ in $(seq 300); do kill -0 "$launch_pid" 2>/dev/null || break; sleep 0.1; done
wait "$launch_pid" 2>/dev/null
launch_pid=
if [ "$CALLGRAPH" != none ]; then
    for f in "$out"/export.data "$out"/server-*.data; do
        echo "==== $(basename "$f"): self time by thread and symbol"
        perf report -i "$f" --no-children --sort comm,sym --stdio 2>/dev/null |
            grep -E '^ +[0-9]' | head -40
    done
fi
echo "profile_ckpt: outputs in $out"
