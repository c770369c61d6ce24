#!/usr/bin/env bash
# Failure detection across "hosts" (project issue 15): network namespaces on one machine beside
# loopback.
#
#   bench/run_netns.sh [BUILD_DIR]     (default: build-bench beside this folder's parent; root)
#
# 1. Failover time: kill -9 of a chain head (server rank 0) to the acknowledgement of the first
#    push started after it (bench_failover, as in bench/run_failover.sh: 3 servers, chains of 3,
#    async, 1 worker pushing 3 x 4 KB), RUNS times (default 20) on 127.0.0.1 and RUNS times with
#    every node in a network namespace of its own (tests/integration/lib_netns.sh: veth pairs
#    to a bridge). No added latency: this kernel has no `tc netem`.
# 2. False deaths: a sync job (3 servers, 2 workers, lsq_worker paced 2 ms a step) run
#    FALSE_RUNS times (default 3) (a) in namespaces with 1% of the packets arriving at every node
#    dropped (nftables), (b) on loopback with every core kept busy by a spinning loop started
#    here (one per core, ended by PID), for about FALSE_SECS (default 20) each. Every death the
#    scheduler declares there is a false one (nothing fails).
# Heartbeats at their defaults (CHAINPS_HEARTBEAT_MS 100, CHAINPS_DEAD_AFTER_MS 2000). Prints
# one table: medians with min-max and p90, deaths per run, the load average before and after
# (the machine may be shared). Every process is ended by its PID and every namespace deleted on
# exit. KEEP=1 keeps the logs.
set -u

here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build-bench}" && pwd) || exit 2
# The programs this needs, each checked to be built.
need() {
    [ -x "$build/$1" ] || {
        echo "run_netns: $build/$1 not built" >&2
        exit 2
    }
    echo "$build/$1"
}
CHAINPS=$(need chainps) || exit 2
BENCH_FO=$(need bench/bench_failover) || exit 2
LSQ=$(need tests/integration/lsq_worker) || exit 2
RUNS=${RUNS:-20}
FALSE_RUNS=${FALSE_RUNS:-3}
FALSE_SECS=${FALSE_SECS:-20}
S=3

res=$(mktemp "${TMPDIR:-/tmp}/chainps-netns-XXXXXX")
work=$(mktemp -d "${TMPDIR:-/tmp}/chainps-netns-XXXXXX")
# shellcheck source=bench/lib_procs.sh
. "$here/lib_procs.sh"
# shellcheck source=tests/integration/lib_netns.sh
. "$here/../tests/integration/lib_netns.sh"
why=$(netns_can_run) || {
    echo "run_netns: $why" >&2
    exit 2
}
busy=()
end_all() {
    local p
    for p in "${busy[@]}"; do kill -KILL "$p" 2>/dev/null; done
    reap "${busy[@]}"
    netns_delete
    cleanup
}
trap end_all EXIT

tag=cpsb$$
netns_hub "$tag" || {
    echo "run_netns: cannot make a network namespace" >&2
    exit 2
}
netns_node sched 10.213.1.1
for r in 0 1 2; do netns_node "s$r" "10.213.1.1$((r + 1))"; done
for r in 0 1; do netns_node "w$r" "10.213.1.2$((r + 1))"; done

# on WHERE NODE CMD...: run CMD in the background in NODE's namespace (netns) or here (loopback)
# with its address as bind and advertise address; its PID is appended to pids.
on() {
    local where=$1 n=$2 ip=127.0.0.1
    shift 2
    if [ "$where" = netns ]; then
        ip=${netns_addr[$n]}
        ip netns exec "$tag-$n" env CHAINPS_BIND="$ip" CHAINPS_ADVERTISE="$ip" "$@" &
    else
        env CHAINPS_BIND="$ip" CHAINPS_ADVERTISE="$ip" "$@" &
    fi
    pids+=($!)
}
addr_of() { if [ "$1" = netns ]; then echo "${netns_addr[$2]}"; else echo 127.0.0.1; fi; }

# One failover run: a fresh cluster, bench_failover kills server rank 0.
fo_run() {
    local where=$1 run=$2 d=$work/fo-$1-$2 port spid sa
    mkdir -p "$d"
    port=$(free_port)
    sa=$(addr_of "$where" sched):$port
    on "$where" sched "$CHAINPS" scheduler --servers "$S" --workers 1 --mode async \
        --replicas 3 --port "$port" --data "$d/sched" --join-timeout 20 >"$d/sched.log" 2>&1
    spid=()
    for i in 0 1 2; do
        on "$where" "s$i" "$CHAINPS" server --scheduler "$sa" --data "$d/s$i" --rank "$i" \
            --join-timeout 20 >"$d/s$i.log" 2>&1
        spid+=("${pids[-1]}")
    done
    on "$where" w0 env CHAINPS_ROLE=worker CHAINPS_SCHEDULER="$sa" CHAINPS_NUM_SERVERS=$S \
        CHAINPS_NUM_WORKERS=1 timeout -s KILL 30 "$BENCH_FO" --kill-pid "${spid[0]}" \
        --kill-after-ms 1000 --kill-jitter-ms 100 --out "$res" --tag "where=$where run=$run" \
        >"$d/worker.out" 2>"$d/worker.log"
    { wait "${pids[-1]}"; } 2>/dev/null
    local rc=$?
    local dl
    dl=$(grep -c "declared dead" "$d/sched.log")
    echo "meta kind=fo where=$where run=$run rc=$rc deaths=$dl" >>"$res"
    stop_all
    [ "${KEEP:-0}" = 1 ] || rm -rf "$d"
}

# One false-death run: a sync job of ~FALSE_SECS under a fault that kills nothing.
fd_run() {
    local what=$1 where=$2 run=$3 d=$work/fd-$1-$3 port sa t0 rc=0 p wp=()
    mkdir -p "$d"
    port=$(free_port)
    sa=$(addr_of "$where" sched):$port
    on "$where" sched "$CHAINPS" scheduler --servers "$S" --workers 2 --mode sync \
        --port "$port" --data "$d/sched" --join-timeout 20 >"$d/sched.log" 2>&1
    for i in 0 1 2; do
        on "$where" "s$i" "$CHAINPS" server --scheduler "$sa" --data "$d/s$i" --rank "$i" \
            --join-timeout 20 >"$d/s$i.log" 2>&1
    done
    t0=$(date +%s%3N)
    for r in 0 1; do
        on "$where" "w$r" env CHAINPS_ROLE=worker CHAINPS_RANK=$r CHAINPS_SCHEDULER="$sa" \
            timeout -s KILL $((FALSE_SECS * 4 + 30)) "$LSQ" --steps "$steps" --step-ms 2 \
            --lr 0.002 --tol 10 >"$d/w$r.log" 2>&1
        wp+=("${pids[-1]}")
    done
    for p in "${wp[@]}"; do
        { wait "$p"; } 2>/dev/null || rc=$?
    done
    local secs dl
    secs=$(( ($(date +%s%3N) - t0) / 1000 ))
    dl=$(grep -c "declared dead" "$d/sched.log")
    echo "meta kind=fd what=$what run=$run rc=$rc secs=$secs deaths=$dl" >>"$res"
    stop_all
    [ "${KEEP:-0}" = 1 ] || rm -rf "$d"
}

exec 3>&2
start=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "chainps detection benchmark on $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load average $load0"
for where in loopback netns; do
    printf "failover, %s: " "$where"
    for run in $(seq "$RUNS"); do
        fo_run "$where" "$run" 2>>"$work/shell.log"
        printf "."
    done
    echo
done

# Steps for ~FALSE_SECS: 2 ms of pacing a step plus the step itself (~0.3 ms here).
steps=$((FALSE_SECS * 1000 / 2))
printf "false deaths, 1%% loss (netns): "
for n in sched s0 s1 s2 w0 w1; do netns_loss "$n" 10; done
for run in $(seq "$FALSE_RUNS"); do
    # Under loss a sync step costs a retransmission now and then: fewer steps for the same time.
    steps=$((FALSE_SECS * 1000 / 14)) fd_run loss netns "$run" 2>>"$work/shell.log"
    printf "."
done
echo
printf "false deaths, every core busy (loopback): "
for run in $(seq "$FALSE_RUNS"); do
    for _ in $(seq "$(nproc)"); do
        bash -c 'while :; do :; done' &
        busy+=($!)
    done
    fd_run busy loopback "$run" 2>>"$work/shell.log"
    for p in "${busy[@]}"; do kill -KILL "$p" 2>/dev/null; done
    reap "${busy[@]}"
    busy=()
    printf "."
done
echo

awk -v secs="$(($(date +%s) - start))" -v load0="$load0" \
    -v load1="$(cut -d' ' -f1-3 /proc/loadavg)" -v cores="$(nproc)" '
function kv(    i, p) {
    delete f
    for (i = 2; i <= NF; i++) { p = index($i, "="); if (p) f[substr($i, 1, p - 1)] = substr($i, p + 1) }
}
function sortn(arr, n,    i, j, t) {
    for (i = 2; i <= n; i++) { t = arr[i]; for (j = i - 1; j >= 1 && arr[j] > t; j--) arr[j + 1] = arr[j]; arr[j + 1] = t }
}
function pct(arr, n, p,    i) { if (n == 0) return -1; i = int(p * (n - 1) + 0.5) + 1; return arr[i] }
$1 == "fo" { kv(); w = f["where"]; if (f["failover_ms"] != "inf") fo[w, ++nfo[w]] = f["failover_ms"] + 0 }
$1 == "meta" && /kind=fo/ { kv(); w = f["where"]; runs[w]++; if (f["rc"] == 0) ok[w]++; dd[w] += f["deaths"] }
$1 == "meta" && /kind=fd/ { kv(); k = f["what"]; fr[k]++; fs[k, fr[k]] = f["secs"] + 0
    fdl[k] = fdl[k] (fdl[k] == "" ? "" : " ") f["deaths"]; fdt[k] += f["deaths"]; if (f["rc"] != 0) fbad[k]++ }
END {
    printf "\nFailover: kill -9 of a chain head (server rank 0) -> ack of the first push started after it\n"
    printf "(3 servers, chains of 3, async, 1 worker; heartbeat 100 ms, dead after 2000 ms)\n\n"
    printf "%-9s %4s %4s | %7s %7s %7s %7s | %6s\n", "where", "runs", "ok", "p50 ms", "p90 ms", "min", "max", "deaths"
    for (wi = 1; wi <= 2; wi++) {
        w = wi == 1 ? "loopback" : "netns"; n = nfo[w]
        delete a; for (i = 1; i <= n; i++) a[i] = fo[w, i]; sortn(a, n)
        printf "%-9s %4d %4d | %7.1f %7.1f %7.1f %7.1f | %6d\n", w, runs[w], ok[w], pct(a, n, .5), pct(a, n, .9), a[1], a[n], dd[w]
    }
    printf "(deaths: declared per run set, 1 per run expected: the killed server)\n"
    printf "\nFalse deaths: sync jobs (3 servers, 2 workers) where nothing fails\n\n"
    printf "%-22s %4s | %12s | %s\n", "fault", "runs", "secs (med)", "deaths per run"
    for (ki = 1; ki <= 2; ki++) {
        k = ki == 1 ? "loss" : "busy"; n = fr[k]
        delete a; for (i = 1; i <= n; i++) a[i] = fs[k, i]; sortn(a, n)
        printf "%-22s %4d | %5d (%d-%d) | %s%s\n", k == "loss" ? "1% loss, netns" : "all cores busy, lo", n,
               pct(a, n, .5), a[1], a[n], fdl[k], fbad[k] ? "  (" fbad[k] " jobs failed)" : ""
    }
    printf "\nRun took %d s; load average %s at start, %s at end (%d cores; shared machine).\n", secs, load0, load1, cores
}' "$res"
