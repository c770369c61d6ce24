#!/usr/bin/env bash
# Declaring a large tensor, and what the server holds for it (project issue 14).
#
#   bench/run_declare.sh [BUILD_DIR]      (default: build-bench beside this folder's parent)
#
# For each size in PARAMS (default 10000000,100000000 float32 parameters), RUNS times (default
# 3), on 127.0.0.1 only: a fresh `chainps scheduler` (1 server, 1 worker, async, chains of 1) and
# one `chainps server` on a fresh data dir, each started here so its PID is known; bench_declare
# as the worker declares one tensor of that size (normal init, SGD) and pushes it PUSHES times
# (default 2). Then, with the job still up: the server's VmRSS (and its anonymous and file-backed
# parts, /proc/PID/status), the data file's size and the disk blocks it holds (du), each against
# the data bytes (4 x params). Medians over the runs, with min-max. PUSH_BENCH=1 also measures
# the 16 MB push p50/p99 (bench_ps under `chainps launch`, one server; PUSH_MS per run).
# Every process is ended by its PID (lib.sh). KEEP=1 keeps the logs.
set -u

here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build-bench}
build=$(cd "$build" && pwd) || exit 2
CHAINPS=$build/chainps
BENCH=$build/bench/bench_declare
for b in "$CHAINPS" "$BENCH"; do
    [ -x "$b" ] || { echo "run_declare: $b not built" >&2; exit 2; }
done
RUNS=${RUNS:-3}
PARAMS=${PARAMS:-10000000,100000000}
PUSHES=${PUSHES:-2}
WORKER_LIMIT_S=${WORKER_LIMIT_S:-300}

res=$(mktemp "${TMPDIR:-/tmp}/chainps-declare-XXXXXX")
work=$(mktemp -d "${TMPDIR:-/tmp}/chainps-declare-XXXXXX")
# shellcheck source=lib.sh
. "$here/lib.sh"
bench_procs
bench_report "" "$@"

kb_of() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }

one_run() { # params run
    local n=$1 d=$work/run-$1-$2 port wpid spid rc i
    mkdir -p "$d"
    port=$(free_port)
    "$CHAINPS" scheduler --servers 1 --workers 1 --mode async --replicas 1 --port "$port" \
        --bind 127.0.0.1 --join-timeout 30 >"$d/scheduler.log" 2>&1 &
    pids+=($!)
    "$CHAINPS" server --scheduler "127.0.0.1:$port" --data "$d/data" --rank 0 --bind 127.0.0.1 \
        --advertise 127.0.0.1 --join-timeout 30 >"$d/server.log" 2>&1 &
    spid=$!
    pids+=($spid)
    CHAINPS_ROLE=worker CHAINPS_SCHEDULER=127.0.0.1:$port CHAINPS_NUM_SERVERS=1 \
        CHAINPS_NUM_WORKERS=1 CHAINPS_ADVERTISE=127.0.0.1 \
        timeout -s KILL "$WORKER_LIMIT_S" "$BENCH" --params "$n" --pushes "$PUSHES" \
        --out "$d/out" --stop-file "$d/stop" >"$d/worker.out" 2>"$d/worker.log" &
    wpid=$!
    pids+=($wpid)
    for i in $(seq $((WORKER_LIMIT_S * 10))); do
        [ -s "$d/out" ] && break
        alive "$wpid" || break
        sleep 0.1
    done
    if [ -s "$d/out" ]; then
        sleep 1.5 # one periodic sync has run since the last push
        echo "params=$n $(cat "$d/out") rss_kb=$(kb_of "$spid" VmRSS)" \
            "anon_kb=$(kb_of "$spid" RssAnon) file_kb=$(kb_of "$spid" RssFile)" \
            "size_b=$(stat -c %s "$d/data/data.mdb") disk_kb=$(du -k "$d/data/data.mdb" | cut -f1)" \
            "grows=$(grep -c 'map grown' "$d/server.log")" >>"$res"
    else
        echo "run $n/$2 failed: see $d" >&2
        KEEP=1
    fi
    touch "$d/stop"
    { wait "$wpid"; } 2>/dev/null
    stop_all
    [ "${KEEP:-0}" = 1 ] || rm -rf "$d/data"
}

load0=$(cut -d' ' -f1-3 /proc/loadavg)
for n in ${PARAMS//,/ }; do
    for run in $(seq "$RUNS"); do
        one_run "$n" "$run"
    done
done
load1=$(cut -d' ' -f1-3 /proc/loadavg)

echo "chainps declare benchmark on $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load average" \
    "$load0 (before) / $load1 (after); $RUNS runs each, median [min-max]"
echo "each run: scheduler + 1 server (chains of 1) + bench_declare: one tensor, normal init, SGD," \
    "$PUSHES whole-tensor pushes"
awk '
function med(s,    a, n, i, j, t) {
    n = split(s, a, " ")
    for (i = 2; i <= n; i++) { t = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return sprintf("%.2f [%.2f-%.2f]", a[int((n + 1) / 2)], a[1], a[n])
}
{
    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    n = v["params"]; data = n * 4
    if (!(n in seen)) { seen[n] = 1; order[++no] = n }
    dec[n] = dec[n] " " v["declare_s"]
    rss[n] = rss[n] " " v["rss_kb"] * 1024 / data
    anon[n] = anon[n] " " v["anon_kb"] * 1024 / data
    fil[n] = fil[n] " " v["file_kb"] * 1024 / data
    sz[n] = sz[n] " " v["size_b"] / data
    dk[n] = dk[n] " " v["disk_kb"] * 1024 / data
    gr[n] = gr[n] " " v["grows"]
}
END {
    for (k = 1; k <= no; k++) {
        n = order[k]
        printf "\n%d params (%.0f MB of data)\n", n, n * 4 / 1e6
        printf "  declare time (s)                  %s   target < 2 s for 100 M\n", med(dec[n])
        printf "  server RSS / data                 %s   target <= 1.5\n", med(rss[n])
        printf "    anonymous / data                %s\n", med(anon[n])
        printf "    file-backed (LMDB map) / data   %s\n", med(fil[n])
        printf "  data.mdb size / data              %s\n", med(sz[n])
        printf "  data.mdb disk blocks / data       %s   target <= 1.3\n", med(dk[n])
        printf "  map growths logged                %s\n", med(gr[n])
    }
}' "$res"

if [ "${PUSH_BENCH:-0}" = 1 ]; then
    # The 16 MB push latency the periodic flush showed in (issue 14): bench_ps under `chainps
    # launch`, 1 server, dense data, blocking pushes for PUSH_MS ms per run (3 runs each), RUNS
    # times; the p99 spans several of the server's once-a-second flushes.
    BENCH_PS=$build/bench/bench_ps
    for run in $(seq "$RUNS"); do
        : >"$work/ps.out"
        "$CHAINPS" launch --servers 1 --replicas 1 --workers 1 --mode sync --timeout 300 \
            --no-compress -- "$BENCH_PS" --out "$work/ps.out" --reps 3 --ms "${PUSH_MS:-4000}" \
            --sizes 16777216 --data dense --only push >"$work/ps-$run.log" 2>&1 ||
            echo "run_declare: bench_ps run $run failed (see $work/ps-$run.log)" >&2
        grep -o 'push_p50=[0-9.]* push_p99=[0-9.]*' "$work/ps.out" >>"$work/ps.all"
    done
    echo
    awk -F'[= ]' '{ p50[NR] = $2 / 1e3; p99[NR] = $4 / 1e3 }
function med(a, n,    i, j, t) {
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
    return sprintf("%.1f [%.1f-%.1f]", a[int((n + 1) / 2)], a[1], a[n])
}
END {
    printf "16 MB push (1 server, dense, %d runs; load average %s)\n", NR, load
    printf "  p50 (ms)                          %s\n", med(p50, NR)
    printf "  p99 (ms)                          %s   target <= 1.5 x p50\n", med(p99, NR)
}' load="$(cut -d' ' -f1-3 /proc/loadavg)" "$work/ps.all"
fi
