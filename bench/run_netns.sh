#!/usr/bin/env bash
# Failure detection across "hosts" (project issue 15): network namespaces on one machine beside
# loopback, with and without added latency.
#
#   bench/run_netns.sh [BUILD_DIR]     (default: build-bench beside this folder's parent; root)
#
# 1. Failover time: kill -9 of a chain head (server rank 0) to the acknowledgement of the first
#    push started after it (bench_failover, as in bench/run_failover.sh: 3 servers, chains of 3,
#    async, 1 worker pushing 3 x 4 KB), RUNS times (default 20) on each side: 127.0.0.1; every
#    node in a network namespace of its own (tests/integration/lib_netns.sh: veth pairs to a
#    bridge); and for each one-way delay in DELAYS (microseconds, default "1000 2000"), every
#    node in a namespace of its own routed through tests/common/netdelay, which holds each packet
#    that long (a round trip between two nodes gains twice it, as `netem delay` on every node's
#    interface would give: this kernel has no netem). The push column (mean 4 KB push round trip
#    before the kill: worker -> head -> middle -> tail -> worker, 4 one-way hops) shows the delay
#    in the product's own terms; netdelay's own account (how late it let packets go) follows the
#    table.
# 2. False deaths: a sync job (3 servers, 2 workers, lsq_worker paced 2 ms a step) run
#    FALSE_RUNS times (default 2) (a) in namespaces with 1% of the packets arriving at every node
#    dropped (nftables), (b) on loopback with every core kept busy by a spinning loop started
#    here (one per core, ended by PID), for about FALSE_SECS (default 120) each. Every death the
#    scheduler declares there is a false one (nothing fails).
# Heartbeats at their defaults (CHAINPS_HEARTBEAT_MS 100, CHAINPS_DEAD_AFTER_MS 2000). Prints
# two tables: p50, p90, p99, min and max (p99 of 20 runs is the largest but one: read it with
# the max), deaths per run, and the load average at the start and end of every row (the machine
# may be shared). Namespaces are named cpsb<PID>-*; every process is ended by its PID and every
# namespace deleted on exit. About 20 minutes at the defaults. KEEP=1 keeps the logs.
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
NETDELAY=$(need tests/common/netdelay) || exit 2
RUNS=${RUNS:-20}
DELAYS=${DELAYS:-1000 2000}
FALSE_RUNS=${FALSE_RUNS:-2}
FALSE_SECS=${FALSE_SECS:-120}
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
# The delayed side: the same nodes again (named d*), linked only through netdelay.
netns_host dsched 10.213.2.1
for r in 0 1 2; do netns_host "ds$r" "10.213.2.1$((r + 1))"; done
for r in 0 1; do netns_host "dw$r" "10.213.2.2$((r + 1))"; done

# on WHERE NODE CMD...: run CMD in the background in NODE's namespace (WHERE netns, or delayUS:
# the delayed twin dNODE) or here (loopback) with its address as bind and advertise address;
# its PID is appended to pids.
ns_of() { case $1 in netns) echo "$2" ;; delay*) echo "d$2" ;; esac; }
on() {
    local where=$1 n ip=127.0.0.1
    n=$(ns_of "$1" "$2")
    shift 2
    if [ -n "$n" ]; then
        ip=${netns_addr[$n]}
        ip netns exec "$tag-$n" env CHAINPS_BIND="$ip" CHAINPS_ADVERTISE="$ip" "$@" &
    else
        env CHAINPS_BIND="$ip" CHAINPS_ADVERTISE="$ip" "$@" &
    fi
    pids+=($!)
}
addr_of() {
    local n
    n=$(ns_of "$1" "$2")
    if [ -n "$n" ]; then echo "${netns_addr[$n]}"; else echo 127.0.0.1; fi
}
loadavg() { cut -d' ' -f1 /proc/loadavg; }

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
sides=(loopback netns)
for us in $DELAYS; do sides+=("delay$us"); done
for where in "${sides[@]}"; do
    if [ "${where#delay}" != "$where" ]; then
        netns_delay_start "$NETDELAY" "${where#delay}" "$work/netdelay-$where.log" || {
            echo "run_netns: netdelay did not start:" >&2
            cat "$work/netdelay-$where.log" >&2
            exit 2
        }
    fi
    printf "failover, %s: " "$where"
    l0=$(loadavg)
    for run in $(seq "$RUNS"); do
        fo_run "$where" "$run" 2>>"$work/shell.log"
        printf "."
    done
    echo "side kind=fo where=$where load0=$l0 load1=$(loadavg)" >>"$res"
    echo
    if [ "${where#delay}" != "$where" ]; then
        netns_delay_stop
        echo "netdelay where=$where $(tail -n 1 "$work/netdelay-$where.log")" >>"$res"
    fi
done

# Steps for ~FALSE_SECS: 2 ms of pacing a step plus the step itself (~0.3 ms here).
steps=$((FALSE_SECS * 1000 / 2))
printf "false deaths, 1%% loss (netns): "
for n in sched s0 s1 s2 w0 w1; do netns_loss "$n" 10; done
l0=$(loadavg)
for run in $(seq "$FALSE_RUNS"); do
    # Under loss a sync step costs a retransmission now and then: fewer steps for the same time.
    steps=$((FALSE_SECS * 1000 / 14)) fd_run loss netns "$run" 2>>"$work/shell.log"
    printf "."
done
echo "side kind=fd what=loss load0=$l0 load1=$(loadavg)" >>"$res"
echo
printf "false deaths, every core busy (loopback): "
l0=$(loadavg)
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
echo "side kind=fd what=busy load0=$l0 load1=$(loadavg)" >>"$res"
echo

awk -v secs="$(($(date +%s) - start))" -v load0="$load0" -v sides="${sides[*]}" \
    -v load1="$(cut -d' ' -f1-3 /proc/loadavg)" -v cores="$(nproc)" '
function kv(    i, p) {
    delete f
    for (i = 2; i <= NF; i++) { p = index($i, "="); if (p) f[substr($i, 1, p - 1)] = substr($i, p + 1) }
}
function sortn(arr, n,    i, j, t) {
    for (i = 2; i <= n; i++) { t = arr[i]; for (j = i - 1; j >= 1 && arr[j] > t; j--) arr[j + 1] = arr[j]; arr[j + 1] = t }
}
function pct(arr, n, p,    i) { if (n == 0) return -1; i = int(p * (n - 1) + 0.5) + 1; return arr[i] }
function label(w) { return w ~ /^delay/ ? sprintf("netns +%.1fms", substr(w, 6) / 1000) : w }
$1 == "fo" { kv(); w = f["where"]; if (f["failover_ms"] != "inf") { fo[w, ++nfo[w]] = f["failover_ms"] + 0; pu[w] += f["push_us"] }
    if (f["exact"] == "FAILED") bad[w]++ }
$1 == "meta" && /kind=fo/ { kv(); w = f["where"]; runs[w]++; if (f["rc"] == 0) ok[w]++; dd[w] += f["deaths"] }
$1 == "meta" && /kind=fd/ { kv(); k = f["what"]; fr[k]++; fs[k, fr[k]] = f["secs"] + 0
    fdl[k] = fdl[k] (fdl[k] == "" ? "" : " ") f["deaths"]; fdt[k] += f["deaths"]; if (f["rc"] != 0) fbad[k]++ }
$1 == "side" { kv(); k = f["kind"] == "fo" ? f["where"] : f["what"]; ld[k] = f["load0"] "-" f["load1"] }
$1 == "netdelay" { kv(); sub(/^netdelay where=[^ ]* netdelay: /, ""); nd[f["where"]] = $0 }
END {
    printf "\nFailover: kill -9 of a chain head (server rank 0) -> ack of the first push started after it\n"
    printf "(3 servers, chains of 3, async, 1 worker; heartbeat 100 ms, dead after 2000 ms; +X ms: X added\n"
    printf " one-way to every packet between two nodes by tests/common/netdelay, so a round trip gains 2X)\n\n"
    hdr = sprintf("%-14s %4s %3s | %6s %6s %6s %6s %6s | %7s | %6s | %s", "where", "runs", "ok", "p50", "p90", "p99", "min", "max", "push us", "deaths", "load avg")
    print hdr; gsub(/./, "-", hdr); print hdr
    ns = split(sides, side, " ")
    for (wi = 1; wi <= ns; wi++) {
        w = side[wi]; n = nfo[w]
        delete a; for (i = 1; i <= n; i++) a[i] = fo[w, i]; sortn(a, n)
        printf "%-14s %4d %3d | %6.1f %6.1f %6.1f %6.1f %6.1f | %7.0f | %6d | %s%s\n", label(w), runs[w], ok[w], pct(a, n, .5), pct(a, n, .9),
               pct(a, n, .99), a[1], a[n], n ? pu[w] / n : 0, dd[w], ld[w], bad[w] ? "  EXACTLY-ONCE FAILED in " bad[w] : ""
    }
    printf "(times in ms; deaths: declared in all runs of the row, 1 per run expected: the killed server;\n"
    printf " push: mean 4 KB push round trip before the kill, 4 one-way hops; load avg: 1-minute, row start-end)\n"
    for (wi = 1; wi <= ns; wi++) if (side[wi] in nd) printf "%s: netdelay %s\n", label(side[wi]), nd[side[wi]]
    printf "\nFalse deaths: sync jobs (3 servers, 2 workers) where nothing fails\n\n"
    printf "%-22s %4s | %16s | %-14s | %s\n", "fault", "runs", "secs (med, range)", "deaths per run", "load avg"
    for (ki = 1; ki <= 2; ki++) {
        k = ki == 1 ? "loss" : "busy"; n = fr[k]
        delete a; for (i = 1; i <= n; i++) a[i] = fs[k, i]; sortn(a, n)
        printf "%-22s %4d | %5d (%4d-%4d) | %-14s | %s%s\n", k == "loss" ? "1% loss, netns" : "all cores busy, lo", n,
               pct(a, n, .5), a[1], a[n], fdl[k], ld[k], fbad[k] ? "  (" fbad[k] " jobs failed)" : ""
    }
    printf "\nRun took %d s; load average %s at start, %s at end (%d cores; shared machine).\n", secs, load0, load1, cores
}' "$res"
