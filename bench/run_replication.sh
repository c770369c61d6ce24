#!/usr/bin/env bash
# What chain replication costs: push+pull throughput, latency and bytes per push for chains of
# R = 1, 2, 3 servers (project issue 4).
#
#   bench/run_replication.sh [BUILD_DIR]     (default: build-bench beside this folder's parent)
#
# For every R in 1 2 3 and mode in sync (2 workers: the head really aggregates two pushes per
# step) and async (1 worker), one `chainps launch --servers 3 --replicas R` runs bench_ps on
# dense (incompressible) 64 KB and 1 MB tensors, all on 127.0.0.1:
#   - push+pull throughput: cps_push_pull_async with up to 16 in flight, bytes of both
#     directions, summed over the workers (the job's rate), median of REPS runs;
#   - p50 / p99 latency of the blocking cps_push_pull, median over the REPS runs of each run's
#     percentile (OPS calls per run);
#   - bytes per acknowledged push: the loopback interface's byte counter (/proc/net/dev) around
#     the pipelined push-only runs, divided by the pushes of all workers: worker -> head pushes,
#     head -> ... -> tail FWDs, tail -> ... -> head CHAIN_ACKs, the acknowledgements, nanomsg
#     framing and TCP/IP headers. "repl" is the part above R=1 (server-to-server traffic).
# Every worker runs the same fixed number of operations (bench_ps --ops), which sync mode needs.
# Environment knobs: REPS (7), OPS (150 per run), SIZES (65536,1048576), RS ("1 2 3"),
# MODES ("sync async"), KEEP=1 keeps the raw results. Requires a Release build.
set -u

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
bench_prepare run_replication "${1:-}" chainps bench/bench_ps
bench_report "" "$@"
CHAINPS=$build/chainps
BENCH_PS=$build/bench/bench_ps
[ -r /proc/net/dev ] || { echo "run_replication: /proc/net/dev unreadable" >&2; exit 2; }
REPS=${REPS:-7}
OPS=${OPS:-150}
SIZES=${SIZES:-65536,1048576}
RS=${RS:-1 2 3}
MODES=${MODES:-sync async}
S=3

lo_bytes() { awk '$1 == "lo:" { print $2 }' /proc/net/dev; }

start=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "chainps replication benchmark on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo |
    cut -d: -f2 | sed 's/^ *//')), $(date -u '+%Y-%m-%d %H:%M UTC'), load average $load0"

for mode in $MODES; do
    W=1
    [ "$mode" = sync ] && W=2
    for R in $RS; do
        # Background loopback traffic from other programs would inflate bytes/push: sample 1 s.
        b0=$(lo_bytes)
        sleep 1
        bg=$(($(lo_bytes) - b0))
        echo "bg R=$R mode=$mode bytes_per_s=$bg" >>"$res"
        rm -f "$res.run"
        if ! "$CHAINPS" launch --servers "$S" --replicas "$R" --workers "$W" --mode "$mode" \
            --timeout 300 -- "$BENCH_PS" --out "$res.run" --reps "$REPS" --ops "$OPS" \
            --sizes "$SIZES" --data dense --only push,pp --lo-bytes >"$log.run" 2>&1; then
            echo "run_replication: R=$R mode=$mode failed:" >&2
            tail -20 "$log.run" >&2
        fi
        [ -f "$res.run" ] && sed "s/^ps /ps R=$R mode=$mode /" "$res.run" >>"$res"
        # Nobody is killed here: a server declared dead is a false positive of the failure
        # detector (a live server silent past CHAINPS_DEAD_AFTER_MS), and its chains shrank.
        nd=$(grep -c "declared dead" "$log.run")
        echo "dead R=$R mode=$mode n=$nd" >>"$res"
        cat "$log.run" >>"$log"
        rm -f "$log.run" "$res.run"
    done
done

awk -v reps="$REPS" -v ops="$OPS" -v secs="$(($(date +%s) - start))" -v load0="$load0" \
    -v load1="$(cut -d' ' -f1-3 /proc/loadavg)" -v cores="$(nproc)" -v S="$S" '
function kv(    i, p) {
    delete f
    for (i = 2; i <= NF; i++) {
        p = index($i, "=")
        f[substr($i, 1, p - 1)] = substr($i, p + 1)
    }
}
function ratio(a, b) { return (b > 0 && a == a && a != "") ? sprintf("%.2f", a / b) : "-" }
function human(n) {
    return n >= 1048576 ? sprintf("%d MB", n / 1048576) : sprintf("%d KB", n / 1024)
}
$1 == "dead" { kv(); if (f["n"] > 0) { dead[f["mode"] SUBSEP f["R"]] = f["n"]; anydead = 1 } }
$1 == "bg" { kv(); if (f["bytes_per_s"] + 0 > bgmax) bgmax = f["bytes_per_s"] + 0 }
$1 == "ps" {
    kv()
    k = f["mode"] SUBSEP f["size"] SUBSEP f["R"]
    modes[f["mode"]] = 1; sizes[f["size"]] = 1; rs[f["R"]] = 1
    W[k] = f["workers"]
    pp[k] += f["pp_mbps"]            # job throughput: sum over the workers
    if (f["rank"] == 0) {             # latency and bytes: worker 0 (sync: the same steps)
        p50[k] = f["pp_p50"]; p99[k] = f["pp_p99"]; push50[k] = f["push_p50"]
        bpp[k] = f["push_lo_bytes"]
    }
}
END {
    nm = 0
    for (m in modes) ml[++nm] = m
    # sync first, then async
    if (nm == 2 && ml[1] != "sync") { t = ml[1]; ml[1] = ml[2]; ml[2] = t }
    ns = 0
    for (s in sizes) sl[++ns] = s + 0
    for (i = 1; i <= ns; i++) for (j = i + 1; j <= ns; j++)
        if (sl[j] < sl[i]) { t = sl[i]; sl[i] = sl[j]; sl[j] = t }
    nr = 0
    for (r in rs) rl[++nr] = r + 0
    for (i = 1; i <= nr; i++) for (j = i + 1; j <= nr; j++)
        if (rl[j] < rl[i]) { t = rl[i]; rl[i] = rl[j]; rl[j] = t }
    printf "\nChain replication cost, %d servers on 127.0.0.1, dense float32 tensors, median of %d runs of %d operations\n", S, reps, ops
    printf "(x1: ratio to R=1 in the same mode and size; B/push: loopback bytes per acknowledged push, all traffic;\n"
    printf " repl: B/push above R=1, i.e. server-to-server FWD + CHAIN_ACK; ideal: tensor copies per push)\n\n"
    hdr = sprintf("%-5s %-2s %-6s %2s | %8s %5s | %7s %5s | %7s %5s | %8s | %10s %5s %10s %6s %5s",
                  "mode", "W", "size", "R", "pp MB/s", "x1", "pp p50", "x1", "pp p99", "x1",
                  "push p50", "B/push", "x1", "repl B", "copies", "ideal")
    print hdr
    gsub(/./, "-", hdr); print hdr
    for (a = 1; a <= nm; a++) for (b = 1; b <= ns; b++) {
        m = ml[a]; s = sl[b]; k1 = m SUBSEP s SUBSEP 1
        for (c = 1; c <= nr; c++) {
            R = rl[c]; k = m SUBSEP s SUBSEP R
            if (!(k in W)) continue
            w = W[k] + 0
            ideal = m == "sync" ? (w + R - 1) / w : R
            repl = (k1 in bpp && bpp[k] != "nan") ? sprintf("%.0f", bpp[k] - bpp[k1]) : "-"
            printf "%-5s %-2d %-6s %2d | %8.0f %5s | %7.0f %5s | %7.0f %5s | %8.0f | %10.0f %5s %10s %6.2f %5.2f%s\n",
                   m, w, human(s), R, pp[k], ratio(pp[k], pp[k1]), p50[k], ratio(p50[k], p50[k1]),
                   p99[k], ratio(p99[k], p99[k1]), push50[k], bpp[k], ratio(bpp[k], bpp[k1]),
                   repl, bpp[k] / s, ideal, ((m SUBSEP R) in dead) ? " *" : ""
        }
    }
    printf "\nUnits: MB/s = 10^6 bytes/s of tensor data (push+pull counts both directions), latency in microseconds.\n"
    printf "ideal copies: async R (the worker sends one copy, each of the R-1 hops forwards one);\n"
    printf "sync (W+R-1)/W (W workers push, the head forwards the step aggregate once per hop).\n"
    if (anydead)
        printf "* INVALID: during this launch the scheduler declared a live server dead (failure-detector false\n  positive under load; see the log), so chains were shorter than R for part of the run.\n"
    printf "Loopback traffic from other programs: up to %.0f B/s in the 1 s before a launch%s.\n",
           bgmax, (bgmax > 100000) ? " (NOT quiet: bytes/push are inflated)" : " (quiet)"
    printf "\nWhat limits these figures: everything shares one machine with %d cores and its loopback. The\n", cores
    printf "scheduler, %d servers and the workers compete for the CPU, so R=3 pays, on the same cores, the\n", S
    printf "LMDB applies and copies of every replica that separate machines would do in parallel: the\n"
    printf "throughput ratios here are CPU ratios, a lower bound for a real cluster. On separate\n"
    printf "machines each hop of the chain adds about one network RTT (plus one apply) to push latency\n"
    printf "(R=3: two extra hops before the tail acknowledges), pipelined throughput is bounded by the\n"
    printf "slowest link or server of the chain rather than by the sum of their work, and every\n"
    printf "replica link carries the copies counted above (async: R-1 extra tensor copies per push;\n"
    printf "sync: R-1 per step, shared by the W workers). Pulls are served by the tail, so they do\n"
    printf "not get slower with R except through the tail sharing the CPU.\n"
    printf "Run took %d s; load average %s at start, %s at end (%d cores: a load above ~0.5 at\n", secs, load0, load1, cores
    printf "the start means other programs shared the CPU and the numbers are low and noisy).\n"
}' "$res"
