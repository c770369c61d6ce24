#!/usr/bin/env bash
# chainps push/pull benchmark: one combined table.
#
#   bench/run_bench.sh [BUILD_DIR]        (default: build-bench beside this folder's parent)
#
# Runs, all on 127.0.0.1 and in one go (about 4 minutes):
#   1. iperf3: loopback TCP bandwidth of this machine (one stream, 3 s) — the ceiling;
#   2. bench_nn: raw nanomsg round trip and bandwidth (PUSH/PULL, 4 MiB buffers, two processes)
#      and the raw TCP round trip — the floor of any protocol over the transport chainps uses;
#   3. bench_ps under `chainps launch` with 1 worker, for 1 server, 2 servers with chains of 1
#      and 2 servers with one chain of 2, compression on and off (--no-compress): push / pull /
#      push+pull throughput with pipelining, and the latency of the blocking calls, for 4 KB ..
#      16 MB tensors, dense and 90%-sparse data; before each, the 4 KB raw round trips again.
# and prints the table with ratios (chainps MB/s / TCP MB/s, chainps us / nanomsg us) and the
# targets (met / not met). Environment knobs: REPS (5), MS (per-metric run length, 30),
# MODE (launch --mode, default sync), SIZES (bytes, comma-separated), KEEP=1 keeps the raw
# result file. Requires a Release build: cmake -DCMAKE_BUILD_TYPE=Release.
set -u

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
build=${1:-$here/../build-bench}
build=$(cd "$build" && pwd) || exit 2
CHAINPS=$build/chainps
BENCH_PS=$build/bench/bench_ps
BENCH_NN=$build/bench/bench_nn
for b in "$CHAINPS" "$BENCH_PS" "$BENCH_NN"; do
    [ -x "$b" ] || { echo "run_bench: $b not built" >&2; exit 2; }
done
REPS=${REPS:-5}
MS=${MS:-30}
MODE=${MODE:-sync}
SIZES=${SIZES:-4096,65536,1048576,16777216}

res=$(mktemp "${TMPDIR:-/tmp}/chainps-bench-XXXXXX")
log=$res.log
iperf_pid=
cleanup() {
    if [ -n "$iperf_pid" ] && kill -0 "$iperf_pid" 2>/dev/null; then
        kill "$iperf_pid" 2>/dev/null
        wait "$iperf_pid" 2>/dev/null
    fi
    if [ "${KEEP:-0}" = 1 ]; then
        echo "raw results kept in $res (log $log)"
    else
        rm -f "$res" "$res.json" "$log"
    fi
}
bench_report "" "$@"
trap cleanup EXIT
trap 'exit 130' INT TERM

start=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "chainps benchmark on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 |
    sed 's/^ *//')), $(date -u '+%Y-%m-%d %H:%M UTC'), load average $load0"

# 1. Loopback TCP with iperf3: server bound to 127.0.0.1 for one test (-1), ended by its PID.
tcp=0
if command -v iperf3 >/dev/null; then
    port=$("$BENCH_NN" --free-port)
    iperf3 -s -1 -B 127.0.0.1 -p "$port" >/dev/null 2>&1 &
    iperf_pid=$!
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        ss -ltn 2>/dev/null | grep -q "127.0.0.1:$port " && break
        sleep 0.1
    done
    if timeout 20 iperf3 -c 127.0.0.1 -p "$port" -t 3 -J >"$res.json" 2>>"$log"; then
        if command -v jq >/dev/null; then
            tcp=$(jq '.end.sum_received.bits_per_second / 8 / 1e6' "$res.json")
        else
            tcp=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"]/8e6)' "$res.json")
        fi
    fi
    kill "$iperf_pid" 2>/dev/null
    wait "$iperf_pid" 2>/dev/null
    iperf_pid=
else
    echo "run_bench: iperf3 not installed; TCP ratios left out" >&2
fi
echo "tcp mbps=$tcp" >>"$res"

# 2. Raw nanomsg baseline.
if ! timeout 120 "$BENCH_NN" --out "$res" --reps "$REPS" --ms "$MS" --sizes "$SIZES" \
    >>"$log" 2>&1; then
    echo "run_bench: bench_nn failed (see below)" >&2
    tail -20 "$log" >&2
fi

# 3. chainps: 1 server; 2 servers each holding half the keys (chains of 1); 2 servers in one
# chain of 2 (every push crosses both); compression on and off. launch ends every process it
# started. The machine's own round trip drifts by tens of microseconds from minute to minute (a
# virtual CPU woken from idle), so the raw nanomsg and TCP round trips are measured again right
# before each configuration and its 4 KB latency is compared with those.
for cfg in 1:1 2:1 2:2; do
    S=${cfg%:*}
    R=${cfg#*:}
    for comp in on off; do
        flag=()
        [ "$comp" = off ] && flag=(--no-compress)
        timeout 60 "$BENCH_NN" --rtt-only --sizes 4096 --reps 3 --ms 100 --out "$res" \
            --tag "$S:$R:$comp" >>"$log" 2>&1 || echo "run_bench: bench_nn --rtt-only failed" >&2
        : >"$res.run"
        if ! "$CHAINPS" launch --servers "$S" --replicas "$R" --workers 1 --mode "$MODE" \
            --timeout 120 "${flag[@]}" -- "$BENCH_PS" --out "$res.run" --reps "$REPS" \
            --ms "$MS" --sizes "$SIZES" >"$log.run" 2>&1; then
            echo "run_bench: chainps run with $S servers, chains of $R, compression $comp" \
                "failed:" >&2
            tail -20 "$log.run" >&2
        fi
        sed "s/\$/ replicas=$R/" "$res.run" >>"$res"
        cat "$log.run" >>"$log"
        rm -f "$log.run" "$res.run"
    done
done

# 4. One table.
awk -v reps="$REPS" -v mode="$MODE" -v secs="$(($(date +%s) - start))" -v load0="$load0" \
    -v load1="$(cut -d' ' -f1-3 /proc/loadavg)" -v cores="$(nproc)" '
function kv(    i, p) {
    delete f
    for (i = 2; i <= NF; i++) {
        p = index($i, "=")
        f[substr($i, 1, p - 1)] = substr($i, p + 1)
    }
}
function ratio(a, b) { return (b > 0 && a == a) ? sprintf("%.2f", a / b) : "-" }
function human(n) {
    return n >= 1048576 ? sprintf("%d MB", n / 1048576) : sprintf("%d KB", n / 1024)
}
$1 == "tcp" { kv(); tcp = f["mbps"] + 0 }
$1 == "nn" { kv(); s = f["size"]; nn_p50[s] = f["rtt_p50"]; nn_p99[s] = f["rtt_p99"]
             nn_push[s] = f["push_mbps"]; nn_echo[s] = f["echo_mbps"]; sizes[s] = 1
             tcp_p50[s] = f["tcp_p50"]; tcp_p99[s] = f["tcp_p99"] }
$1 == "nnrtt" { kv(); adj_nn[f["tag"]] = f["rtt_p50"]; adj_tcp[f["tag"]] = f["tcp_p50"] }
$1 == "ps" {
    kv(); s = f["size"]; sizes[s] = 1
    k = s SUBSEP f["data"] SUBSEP f["servers"] SUBSEP f["replicas"] SUBSEP f["compress"]
    n = ++rows[s]; row[s, n] = k
    for (x in f) v[k, x] = f[x]
}
END {
    line = "------------------------------------------------------------------------------" \
           "-----------------------------------------------------"
    printf "\nchainps push/pull, 1 worker, mode %s; median of %d runs per cell; MB/s = 1e6 B/s " \
           "of tensor values\n", mode, reps
    printf "S servers, R replicas per key range (a chain: a push is acked by the tail, so it " \
           "crosses every replica)\n"
    printf "pp = push+pull (bytes of both directions counted); throughput with async calls in " \
           "flight, latency (us) of blocking calls\n"
    printf "ratios: /TCP = MB/s over loopback TCP MB/s (iperf3, 1 stream); p50/nn = push p50 " \
           "over the raw nanomsg round trip p50\n"
    printf "  (4 KB: the nanomsg round trip measured right before that configuration; other " \
           "sizes: the one of step 2)\n"
    printf "%s\n", line
    printf "%-6s %-6s %1s %1s %4s | %9s %9s %9s | %6s %6s | %8s %8s %8s %8s %8s %8s | %6s | %5s\n",
           "size", "data", "S", "R", "comp", "push MB/s", "pull MB/s", "pp MB/s", "push/T", "pp/T",
           "push p50", "p99", "pull p50", "p99", "pp p50", "p99", "p50/nn", "wire"
    printf "%s\n", line
    printf "%-6s %-6s %1s %1s %4s | %9.0f %9s %9s | %6s %6s | %8s %8s %8s %8s %8s %8s | %6s | %5s\n",
           "TCP", "iperf3", "-", "-", "-", tcp, "-", "-", "1.00", "-", "-", "-", "-", "-", "-", "-",
           "-", "-"
    ns = 0
    for (s in sizes) list[++ns] = s + 0
    for (i = 2; i <= ns; i++)
        for (j = i; j > 1 && list[j - 1] > list[j]; j--) { t = list[j]; list[j] = list[j - 1]; list[j - 1] = t }
    for (i = 1; i <= ns; i++) {
        s = list[i]
        if (s in nn_p50) {
            printf "%-6s %-6s %1s %1s %4s | %9s %9s %9s | %6s %6s | %8.1f %8.1f %8s %8s %8s %8s | %6s | %5s\n",
                   human(s), "tcp rt", "-", "-", "-", "-", "-", "-", "-", "-", tcp_p50[s],
                   tcp_p99[s], "-", "-", "-", "-", ratio(tcp_p50[s], nn_p50[s]), "-"
            printf "%-6s %-6s %1s %1s %4s | %9.0f %9s %9.0f | %6s %6s | %8.1f %8.1f %8s %8s %8s %8s | %6s | %5s\n",
                   human(s), "nn raw", "-", "-", "-", nn_push[s], "-", nn_echo[s], ratio(nn_push[s], tcp),
                   ratio(nn_echo[s], tcp), nn_p50[s], nn_p99[s], "-", "-", "-", "-", "1.00", "-"
        }
        for (n = 1; n <= rows[s]; n++) {
            k = row[s, n]
            S = v[k, "servers"]; R = v[k, "replicas"]; c = v[k, "compress"] + 0 ? "on" : "off"
            tag = S ":" R ":" c
            base = (s == 4096 && (tag in adj_nn)) ? adj_nn[tag] : nn_p50[s]
            printf "%-6s %-6s %1d %1s %4s | %9.0f %9.0f %9.0f | %6s %6s | %8.1f %8.1f %8.1f %8.1f %8.1f %8.1f | %6s | %5.2f\n",
                   human(s), v[k, "data"], S, R, c,
                   v[k, "push_mbps"], v[k, "pull_mbps"], v[k, "pp_mbps"],
                   ratio(v[k, "push_mbps"], tcp), ratio(v[k, "pp_mbps"], tcp),
                   v[k, "push_p50"], v[k, "push_p99"], v[k, "pull_p50"], v[k, "pull_p99"],
                   v[k, "pp_p50"], v[k, "pp_p99"], ratio(v[k, "push_p50"], base),
                   v[k, "wire_ratio"]
            if (v[k, "data"] == "dense" && s == 1048576) {
                tp = v[k, "pp_mbps"] + 0
                t1 = t1 sprintf("  S=%d R=%s comp=%-3s %6.0f MB/s  %s\n", S, R, c, tp,
                                tp >= 3500 ? "met" : "NOT met")
            }
            if (v[k, "data"] == "dense" && s == 4096) {
                lp = v[k, "push_p50"] + 0
                t2 = t2 sprintf("  S=%d R=%s comp=%-3s %6.1f us  %-7s   raw nanomsg %5.1f us, " \
                                "raw TCP %5.1f us just before: %.2fx nanomsg, %s\n", S, R, c, lp,
                                lp < 65 ? "met" : "NOT met", adj_nn[tag], adj_tcp[tag],
                                lp / adj_nn[tag], lp / adj_nn[tag] <= 65 / 53 ? "within" : "beyond")
            }
        }
        printf "%s\n", line
    }
    printf "target: 1 MB push+pull >= 3500 MB/s (both directions), dense data " \
           "(loopback TCP here: %.0f MB/s one way)\n%s", tcp, t1
    printf "target: 4 KB push round trip p50 < 65 us, dense data; the issue set it beside a raw " \
           "nanomsg round trip of 53 us and raw TCP of 20 us,\n  i.e. at most 65/53 = 1.23x " \
           "the own round trip of nanomsg on the same machine at the same moment\n%s", t2
    printf "bench run took %d s; load average %s at start, %s at end (%d cores: a load above " \
           "~0.5 at the start means other programs shared the CPU and the numbers are low)\n",
           secs, load0, load1, cores
}' "$res"
