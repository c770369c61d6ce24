#!/usr/bin/env bash
# Failure detection across "hosts" (project issue 15): network namespaces on one machine beside
# loopback, with and without added latency.
#
#   bench/run_netns.sh [BUILD_DIR]     (default: build-bench beside this folder's parent; root)
#
# 1. Failover time: kill -9 of a chain head (server rank 0) to the acknowledgement of the first
#    push started after it (bench_failover, as in bench/run_failover.sh: 3 servers, chains of 3,
#    async, 1 worker pushing 3 x 4 KB), RUNS rounds (default 20) of one run on each side, in
#    turn (a shared machine's load drifts: so every side sees the same drift): 127.0.0.1; every
#    node in a network namespace of its own (tests/integration/lib_netns.sh: veth pairs to a
#    bridge); and for each one-way delay in DELAYS (microseconds, default "1000 2000"), every
#    node in a namespace of its own routed through tests/common/netdelay, which holds each packet
#    that long (a round trip between two nodes gains twice it, as `netem delay` on every node's
#    interface would give: this kernel has no netem). The push column (mean 4 KB push round trip
#    before the kill: worker -> head -> middle -> tail -> worker, 4 one-way hops) shows the delay
#    in the product's own terms; before a side's first run, 200 plain TCP round trips (64 bytes,
#    python3) between two of its namespaces show it on its own. netdelay's account (how late it
#    let packets go) follows the table.
# 2. False deaths: a sync job (3 servers, 2 workers, lsq_worker paced 2 ms a step) run
#    FALSE_RUNS times (default 2) (a) in namespaces with 1% of the packets arriving at every node
#    dropped (nftables), (b) on loopback with every core kept busy by a spinning loop started
#    here (one per core, ended by PID), for about FALSE_SECS (default 120) each. Every death the
#    scheduler declares there is a false one (nothing fails).
# Heartbeats at their defaults (CHAINPS_HEARTBEAT_MS 100, CHAINPS_DEAD_AFTER_MS 2000). Prints
# two tables: p50, p90, p99, min and max (p99 of 20 runs is the largest but one: read it with
# the max), deaths per run, and the 1-minute load average at the start of each run, median and
# range per row (the machine may be shared). Namespaces are named cpsb<PID>-*; every process is ended by its PID and every
# namespace deleted on exit. About 20 minutes at the defaults. KEEP=1 keeps the logs of every run
# (the logs of a failed run are kept anyway and its worker's last lines printed; the servers'
# data directories never: 65 MB each).
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
# shellcheck source=lib.sh
. "$here/lib.sh"
bench_procs
bench_report "" "$@"
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
    bench_procs_cleanup
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

# The delay checked in plain TCP: 200 round trips of 64 bytes (TCP_NODELAY) between the
# namespaces of server rank 0 and worker 0 of a side (netns, delayUS), before its first run.
PP_ECHO='import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(15)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    d = c.recv(4096)
    if not d: break
    c.sendall(d)'
PP_PING='import socket, sys, time
for _ in range(100):
    try: c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5); break
    except OSError: time.sleep(0.02)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
r = []
for _ in range(200):
    t = time.perf_counter(); c.sendall(b"x" * 64); n = 0
    while n < 64: n += len(c.recv(64 - n))
    r.append((time.perf_counter() - t) * 1e6)
r.sort(); print("p50_us=%d p99_us=%d min_us=%d" % (r[100], r[198], r[0]))'
rtt_check() {
    local where=$1 s w sp out
    s=$(ns_of "$where" s0)
    w=$(ns_of "$where" w0)
    ip netns exec "$tag-$s" timeout 20 python3 -c "$PP_ECHO" "${netns_addr[$s]}" 7100 &
    sp=$!
    pids+=("$sp")
    out=$(ip netns exec "$tag-$w" timeout 20 python3 -c "$PP_PING" "${netns_addr[$s]}" 7100)
    kill -TERM "$sp" 2>/dev/null # it ends by itself when the client leaves
    { wait "$sp"; } 2>/dev/null
    pids=() # called between runs, with nothing else started
    echo "rtt where=$where load=$(loadavg) ${out:-p50_us=none}" >>"$res"
}

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
    local dl det kw
    dl=$(grep -c "declared dead" "$d/sched.log")
    # Detection: the kill (the worker's wall clock) to the scheduler's verdict (its log's).
    kw=$(sed -n 's/.* killed pid [0-9]* at \([0-9:.]*\);.*/\1/p' "$d/worker.out")
    det=$(grep -m1 "declared dead" "$d/sched.log" | cut -d' ' -f1)
    echo "meta kind=fo where=$where run=$run rc=$rc deaths=$dl kill_wall=${kw:-none}" \
        "dead_wall=${det:-none}" >>"$res"
    stop_all
    finish_run "$d" "$rc" "$where run $run"
}

# The end of a run's directory: the data directories go; the logs stay with KEEP=1 or when the
# run failed (RC not 0), whose worker's last lines are printed.
finish_run() {
    rm -rf "$1"/sched "$1"/s[0-9]
    if [ "$2" != 0 ]; then
        echo >&3
        echo "run_netns: $3 exited $2 (logs kept in $1); worker:" >&3
        tail -n 4 "$1"/worker.* "$1"/w0.log 2>/dev/null >&3
    elif [ "${KEEP:-0}" != 1 ]; then
        rm -rf "$1"
    fi
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
    # A false death is worth its logs too.
    finish_run "$d" "$((rc != 0 ? rc : dl))" "false deaths, $what run $run"
}

exec 3>&2
start=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "chainps detection benchmark on $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load average $load0"
sides=(loopback netns)
for us in $DELAYS; do sides+=("delay$us"); done
# The sides take turns, one run each per round: on a shared machine whose load drifts, every
# side sees the same drift (side after side, the last ones ran under twice the first's load).
printf "failover, %d rounds of %s: " "$RUNS" "${sides[*]}"
for run in $(seq "$RUNS"); do
    for where in "${sides[@]}"; do
        if [ "${where#delay}" != "$where" ]; then
            netns_delay_start "$NETDELAY" "${where#delay}" "$work/netdelay.log" || {
                echo "run_netns: netdelay did not start:" >&2
                cat "$work/netdelay.log" >&2
                exit 2
            }
        fi
        if [ "$run" = 1 ] && [ "$where" != loopback ]; then
            rtt_check "$where" 2>>"$work/shell.log"
        fi
        echo "load kind=fo where=$where load=$(loadavg)" >>"$res"
        fo_run "$where" "$run" 2>>"$work/shell.log"
        if [ "${where#delay}" != "$where" ]; then
            netns_delay_stop
            echo "netdelay where=$where $(tail -n 1 "$work/netdelay.log")" >>"$res"
        fi
    done
    printf "."
done
echo

# Steps for ~FALSE_SECS: 2 ms of pacing a step plus the step itself (~0.3 ms here).
steps=$((FALSE_SECS * 1000 / 2))
printf "false deaths, 1%% loss (netns): "
for n in sched s0 s1 s2 w0 w1; do netns_loss "$n" 10; done
for run in $(seq "$FALSE_RUNS"); do
    echo "load kind=fd what=loss load=$(loadavg)" >>"$res"
    # Under loss a sync step costs a retransmission now and then: fewer steps for the same time.
    steps=$((FALSE_SECS * 1000 / 14)) fd_run loss netns "$run" 2>>"$work/shell.log"
    printf "."
done
echo
printf "false deaths, every core busy (loopback): "
for run in $(seq "$FALSE_RUNS"); do
    echo "load kind=fd what=busy load=$(loadavg)" >>"$res"
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
function ms_of_day(s,    a) { split(s, a, /[:.]/); return ((a[1] * 60 + a[2]) * 60 + a[3]) * 1000 + a[4] }
function label(w) { return w ~ /^delay/ ? sprintf("netns +%.1fms", substr(w, 6) / 1000) : w }
$1 == "fo" { kv(); w = f["where"]; if (f["failover_ms"] != "inf") { fo[w, ++nfo[w]] = f["failover_ms"] + 0; pu[w] += f["push_us"] }
    if (f["exact"] == "FAILED") bad[w]++ }
$1 == "meta" && /kind=fo/ { kv(); w = f["where"]; runs[w]++; if (f["rc"] == 0) ok[w]++; dd[w] += f["deaths"]
    if (f["kill_wall"] != "none" && f["dead_wall"] != "none") {
        v = ms_of_day(f["dead_wall"]) - ms_of_day(f["kill_wall"]); if (v < -43200000) v += 86400000; det[w, ++ndet[w]] = v } }
$1 == "meta" && /kind=fd/ { kv(); k = f["what"]; fr[k]++; fs[k, fr[k]] = f["secs"] + 0
    fdl[k] = fdl[k] (fdl[k] == "" ? "" : " ") f["deaths"]; fdt[k] += f["deaths"]; if (f["rc"] != 0) fbad[k]++ }
$1 == "rtt" { kv(); rtt[f["where"]] = sprintf("TCP round trip (64 B) p50 %s us, p99 %s, min %s (load %s)", f["p50_us"], f["p99_us"], f["min_us"], f["load"]) }
$1 == "load" { kv(); k = f["kind"] == "fo" ? f["where"] : f["what"]; lds[k, ++nld[k]] = f["load"] + 0 }
$1 == "netdelay" { kv(); w = f["where"]; ndr[w]++
    if (match($0, /[0-9]+ forwarded/)) ndp[w] += substr($0, RSTART, RLENGTH) + 0
    if (match($0, /[0-9]+ queue full/)) ndf[w] += substr($0, RSTART, RLENGTH) + 0
    if (match($0, /[0-9]+ not written/)) ndw[w] += substr($0, RSTART, RLENGTH) + 0
    if (match($0, /mean [0-9]+ us/)) ndm[w] += substr($0, RSTART + 5, RLENGTH - 8) + 0
    if (match($0, /max [0-9]+ us/)) { v = substr($0, RSTART + 4, RLENGTH - 7) + 0; if (v > ndx[w]) ndx[w] = v }
    if (match($0, /[0-9]+ packets over/)) ndo[w] += substr($0, RSTART, RLENGTH) + 0 }
function loads(k,    i, n) {
    n = nld[k]; if (!n) return "-"; delete l; for (i = 1; i <= n; i++) l[i] = lds[k, i]; sortn(l, n)
    return sprintf("%.1f (%.1f-%.1f)", pct(l, n, .5), l[1], l[n])
}
END {
    printf "\nFailover: kill -9 of a chain head (server rank 0) -> ack of the first push started after it\n"
    printf "(3 servers, chains of 3, async, 1 worker; heartbeat 100 ms, dead after 2000 ms; +X ms: X added\n"
    printf " one-way to every packet between two nodes by tests/common/netdelay, so a round trip gains 2X)\n\n"
    hdr = sprintf("%-14s %4s %3s | %6s %6s %6s %6s %6s | %6s %6s | %7s | %6s | %s", "where", "runs", "ok", "p50", "p90", "p99", "min", "max", "det50", "detmax", "push us", "deaths", "load avg")
    print hdr; gsub(/./, "-", hdr); print hdr
    ns = split(sides, side, " ")
    for (wi = 1; wi <= ns; wi++) {
        w = side[wi]; n = nfo[w]
        delete a; for (i = 1; i <= n; i++) a[i] = fo[w, i]; sortn(a, n)
        delete b; m = ndet[w]; for (i = 1; i <= m; i++) b[i] = det[w, i]; sortn(b, m)
        printf "%-14s %4d %3d | %6.1f %6.1f %6.1f %6.1f %6.1f | %6d %6d | %7.0f | %6d | %s%s\n", label(w), runs[w], ok[w], pct(a, n, .5), pct(a, n, .9),
               pct(a, n, .99), a[1], a[n], pct(b, m, .5), b[m], n ? pu[w] / n : 0, dd[w], loads(w), bad[w] ? "  EXACTLY-ONCE FAILED in " bad[w] : ""
    }
    printf "(times in ms; det: the kill to the scheduler declaring the server dead (wall clocks, ms);\n"
    printf " deaths: declared in all runs of the row, 1 per run expected: the killed server;\n"
    printf " push: mean 4 KB push round trip before the kill, 4 one-way hops; load avg: 1-minute, at the\n"
    printf " start of each run, median (min-max); the sides took turns, one run each per round)\n"
    for (wi = 1; wi <= ns; wi++) if (side[wi] in rtt) printf "%s: %s\n", label(side[wi]), rtt[side[wi]]
    for (wi = 1; wi <= ns; wi++) { w = side[wi]; if (ndr[w]) printf "%s: netdelay forwarded %d packets in %d runs, dropped %d (queue full) + %d (device down); late against the delay: mean of the runs %.0f us, max %d us, %d packets over 1 ms\n", label(w), ndp[w], ndr[w], ndf[w], ndw[w], ndm[w] / ndr[w], ndx[w], ndo[w] }
    printf "\nFalse deaths: sync jobs (3 servers, 2 workers) where nothing fails\n\n"
    printf "%-22s %4s | %16s | %-14s | %s\n", "fault", "runs", "secs (med, range)", "deaths per run", "load avg"
    for (ki = 1; ki <= 2; ki++) {
        k = ki == 1 ? "loss" : "busy"; n = fr[k]
        if (!n) continue
        delete a; for (i = 1; i <= n; i++) a[i] = fs[k, i]; sortn(a, n)
        printf "%-22s %4d | %5d (%4d-%4d) | %-14s | %s%s\n", k == "loss" ? "1% loss, netns" : "all cores busy, lo", n,
               pct(a, n, .5), a[1], a[n], fdl[k], loads(k), fbad[k] ? "  (" fbad[k] " jobs failed)" : ""
    }
    printf "\nRun took %d s; load average %s at start, %s at end (%d cores; shared machine).\n", secs, load0, load1, cores
}' "$res"
