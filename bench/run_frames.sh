#!/usr/bin/env bash
# Large authenticated messages between "hosts" as frames (issue 30, src/transport/frame.h): which
# frame size, and how far the MAC's cost hides behind the transfer, against ps-lite across the
# same two network namespaces.
#
#   bench/run_frames.sh BUILD_DIR [PSLITE_BENCH]     (root; iproute2 and nftables)
#
# Two namespaces joined by veth pairs to a bridge (tests/integration/lib_netns.sh): the scheduler
# and one server in one, the worker (bench_ps --loop pslite, the loop of bench/run_pslite.sh) in
# the other, so every push and pull crosses the veth over tcp:// with a MAC. Sides, in
# interleaved rounds (the order rotating): chainps with CHAINPS_FRAME_KB set to each of FRAMES
# (KiB; 0: unframed, one MAC over the whole message, as before), chainps --insecure, and
# ps-lite (PSLITE_BENCH: the pslite_bench that bench/run_pslite.sh built, e.g.
# ~/.cache/chainps-pslite/15b8adf/pslite_bench) with its scheduler and server in the first
# namespace and its worker in the second. Per size: pp GB/s (pushed + pulled, 10^9 B/s), push
# and pull p50 in microseconds, and CPU ms/GB (user + system of all the job's processes, start
# included, per 10^9 bytes moved: /usr/bin/time), median (min-max) of the rounds, and the ratio
# to ps-lite per round.
#
# Environment: ROUNDS (3), SIZES (1048576,16777216), FRAMES ("0 64 256 1024"; `auth` in it is a
# side with CHAINPS_FRAME_KB unset, the default), REPORT_NAME (bench/results/NAME.md; default
# run_frames), ITERS (per size;
# default bench_ps's rule), KEEP=1, PERF=DIR (every process under `perf record`, DWARF call
# graphs, into DIR/SIDE.SIZE.rROUND.{s,0,w}.perf: for profiles, not figures, so no report is
# written unless BENCH_RESULTS_DIR names a directory), PERF_STAT=DIR (every process under `perf
# stat` for context switches, CPU migrations, syscalls and task clock, into
# DIR/SIDE.SIZE.rROUND.{s,0,w}.stat), ALT=BUILD_DIR (an A/B run: sides `a-auth` and `a-insecure`
# run the chainps and bench_ps of BUILD_DIR, interleaved with this build's; the table then also
# gives this build / ALT per round as the rows `auth/a-auth` and `insecure/a-insecure`; ALT_ENV:
# VAR=value assignments, space-separated, for the ALT sides only).
# Namespaces cpsf<PID>-*; every process is ended by its PID and every namespace deleted on exit.
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
build=$(cd "${1:?usage: run_frames.sh BUILD_DIR [PSLITE_BENCH]}" && pwd) || exit 2
pslite=${2:-}
if [ -n "$pslite" ]; then
    pslite=$(readlink -f "$pslite")
    [ -x "$pslite" ] || { echo "run_frames: $2 not found" >&2; exit 2; }
fi
alt=
[ -n "${ALT:-}" ] && { alt=$(cd "$ALT" && pwd) || exit 2; }
for p in chainps bench/bench_ps; do
    for b in "$build" $alt; do
        [ -x "$b/$p" ] || { echo "run_frames: $b/$p not built" >&2; exit 2; }
    done
done
ROUNDS=${ROUNDS:-3}
SIZES=${SIZES:-1048576,16777216}
FRAMES=${FRAMES:-0 64 256 1024}
ITERS=${ITERS:-}
[ "$(id -u)" = 0 ] || { echo "run_frames: needs root (network namespaces)" >&2; exit 2; }
# shellcheck source=../tests/integration/lib_netns.sh
. "$here/../tests/integration/lib_netns.sh"
why=$(netns_can_run) || { echo "run_frames: $why" >&2; exit 2; }
work=$(mktemp -d "${TMPDIR:-/tmp}/chainps-frames-XXXXXX") || exit 2
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    netns_delete
    if [ "${KEEP:-0}" = 1 ]; then echo "kept $work"; else rm -rf "$work"; fi
}
# A profiling run's figures carry perf's cost: they do not replace the last report.
[ -n "${PERF:-}" ] && BENCH_RESULTS_DIR=${BENCH_RESULTS_DIR:-none}
bench_report "${REPORT_NAME:-}" "$@"
trap cleanup EXIT
trap 'exit 130' INT TERM
tag=cpsf$$
netns_hub "$tag" || { echo "run_frames: cannot make a namespace" >&2; exit 2; }
netns_node a 10.213.2.1
netns_node b 10.213.2.2
"$build/chainps" secret "$work/job.secret" >/dev/null || exit 2
A=10.213.2.1 B=10.213.2.2

prof_side=""
in_ns() { # NS TIMEFILE CMD...: in the background, timed, its PID kept
    local n=$1 tf=$2 rec=()
    shift 2
    # PERF: each process under perf record, named by side, size, round and role (the time file's
    # suffix); perf's own CPU then counts in the side's CPU ms/GB, so such a run is for profiles.
    [ -n "${PERF:-}" ] &&
        rec=(perf record -q -F 499 --call-graph dwarf,8192 -o "$PERF/$prof_side.${tf##*/t.}.perf" --)
    [ -n "${PERF_STAT:-}" ] &&
        rec=(perf stat -e task-clock,context-switches,cpu-migrations,raw_syscalls:sys_enter
            -o "$PERF_STAT/$prof_side.${tf##*/t.}.stat" --)
    ip netns exec "$tag-$n" /usr/bin/time -f %U,%S -o "$tf" timeout -k 5 200 "${rec[@]}" "$@" \
        >>"$work/run.log" 2>&1 &
    pids+=($!)
}
finish() { # SIDE ROUND WORKER_PID: wait for the worker, end the rest, tag its lines
    local rc=0 p
    wait "$3" || rc=$?
    for p in "${pids[@]}"; do
        [ "$p" = "$3" ] && continue
        for _ in $(seq 30); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -TERM "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    pids=()
    [ "$rc" = 0 ] || { echo "run_frames: side $1 failed:" >&2; tail -15 "$work/run.log" >&2; }
    local cpu
    cpu=$(awk -F, '/^[0-9.]+,[0-9.]+$/ { s += $1 + $2 } END { printf "%.3f", s }' "$work"/t.*)
    rm -f "$work"/t.*
    sed "s/\$/ round=$2 side=$1 cpu_s=$cpu/" "$work/run.txt" >>"$work/all.txt"
    : >"$work/run.txt"
    : >"$work/run.log"
}
run_chainps() { # SIDE ROUND SIZE
    local env=(CHAINPS_SECRET_FILE="$work/job.secret" CHAINPS_SCHEDULER="$A:9091"
        CHAINPS_RUNTIME_DIR=) build=$build ae=()
    case $1 in
    a-*) build=$alt ;;
    esac
    case ${1#a-} in
    insecure) env=(CHAINPS_INSECURE=1 CHAINPS_SCHEDULER="$A:9091" CHAINPS_RUNTIME_DIR=) ;;
    auth) ;; # the default: CHAINPS_FRAME_KB unset
    *) env+=(CHAINPS_FRAME_KB="${1#frames}") ;;
    esac
    # ALT_ENV: assignments for the ALT sides only (the same build with a knob set, say).
    case $1 in
    a-*) [ -n "${ALT_ENV:-}" ] && read -ra ae <<<"$ALT_ENV" && env+=("${ae[@]}") ;;
    esac
    rm -rf "$work/d"
    in_ns a "$work/t.s" env "${env[@]}" "$build/chainps" scheduler --servers 1 --workers 1 \
        --mode sync --port 9091 --bind $A --data "$work/d/sched"
    in_ns a "$work/t.0" env "${env[@]}" CHAINPS_BIND=$A CHAINPS_ADVERTISE=$A \
        "$build/chainps" server --rank 0 --port 9100 --data "$work/d/s0"
    in_ns b "$work/t.w" env "${env[@]}" CHAINPS_BIND=$B CHAINPS_ADVERTISE=$B CHAINPS_ROLE=worker \
        CHAINPS_RANK=0 "$build/bench/bench_ps" --loop pslite --sizes "$3" ${ITERS:+--ops "$ITERS"} \
        --out "$work/run.txt"
    finish "$1" "$2" "${pids[-1]}"
}
run_pslite() { # ROUND SIZE
    local env=(DMLC_PS_ROOT_URI="$A" DMLC_PS_ROOT_PORT=9092 DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=1)
    in_ns a "$work/t.s" env "${env[@]}" DMLC_ROLE=scheduler DMLC_NODE_HOST=$A "$pslite"
    in_ns a "$work/t.0" env "${env[@]}" DMLC_ROLE=server DMLC_NODE_HOST=$A "$pslite"
    in_ns b "$work/t.w" env "${env[@]}" DMLC_ROLE=worker DMLC_NODE_HOST=$B "$pslite" \
        --sizes "$2" ${ITERS:+--iters "$ITERS"} --out "$work/run.txt"
    finish pslite "$1" "${pids[-1]}"
}
sides=()
for f in $FRAMES; do
    if [ "$f" = auth ]; then sides+=(auth); else sides+=("frames$f"); fi
done
sides+=(insecure)
[ -n "$alt" ] && sides+=(a-auth a-insecure)
[ -n "$pslite" ] && sides+=(pslite)
: >"$work/all.txt"
: >"$work/run.txt"
echo "frames across two namespaces: $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load" \
    "$(cut -d' ' -f1-3 /proc/loadavg); $ROUNDS rounds; sides: ${sides[*]}"
start=$(date +%s)
for ((r = 1; r <= ROUNDS; r++)); do
    for s in ${SIZES//,/ }; do
        n=${#sides[@]}
        for ((k = 0; k < n; k++)); do
            side=${sides[$(((k + r - 1) % n))]}
            prof_side=$side.$s.r$r
            if [ "$side" = pslite ]; then run_pslite "$r" "$s"; else run_chainps "$side" "$r" "$s"; fi
        done
    done
    echo "round $r of $ROUNDS done ($(($(date +%s) - start)) s, load $(cut -d' ' -f1 /proc/loadavg))"
done
awk -v sidelist="${sides[*]}" -f "$here/pslite_loop.awk" -f <(cat <<'EOF'
END {
    nside = split(sidelist, sides, " ")
    nm = split("pp_gbps push_p50_us pull_p50_us cpu_ms_gb", metrics, " ")
    split("pp GB/s,push p50 us,pull p50 us,CPU ms/GB", mname, ",")
    for (k in bytes) sum[k, "cpu_ms_gb"] = cpu[k] * 1e12 / bytes[k]
    for (k in runs) {
        split(k, p, SUBSEP)
        for (i = 1; i <= nm; i++) {
            m = metrics[i]
            val[p[1] SUBSEP p[2] SUBSEP m, ++cnt[p[1] SUBSEP p[2] SUBSEP m]] = sum[k, m]
            o = p[1] SUBSEP "pslite" SUBSEP p[3]
            if (p[2] != "pslite" && (o in runs) && sum[o, m] > 0) {
                key = p[1] SUBSEP p[2] "/pslite" SUBSEP m
                val[key, ++cnt[key]] = sum[k, m] / sum[o, m]
            }
            # ALT: this build / the other one, per round.
            o = p[1] SUBSEP "a-" p[2] SUBSEP p[3]
            if (p[2] !~ /^a-/ && (o in runs) && sum[o, m] > 0) {
                key = p[1] SUBSEP p[2] "/a-" p[2] SUBSEP m
                val[key, ++cnt[key]] = sum[k, m] / sum[o, m]
                ab[p[2]] = 1
            }
        }
    }
    printf "\n%-10s %-12s", "cell", "metric"
    for (j = 1; j <= nside; j++) printf " | %-20s", sides[j]
    printf "\n"
    for (ci = 1; ci <= ncells; ci++) {
        c = cells[ci]
        for (i = 1; i <= nm; i++) {
            m = metrics[i]
            fmt = m == "pp_gbps" ? "%.3f" : "%.0f"
            printf "%-10s %-12s", i == 1 ? c : "", mname[i]
            for (j = 1; j <= nside; j++) printf " | %-20s", stat(c SUBSEP sides[j] SUBSEP m, fmt)
            printf "\n"
        }
    }
    if (length(ab)) {
        printf "\nthis build / ALT (median of per-round ratios, min-max)\n"
        printf "%-10s %-12s", "cell", "metric"
        for (s in ab) printf " | %-20s", s "/a-" s
        printf "\n"
        for (ci = 1; ci <= ncells; ci++) {
            c = cells[ci]
            for (i = 1; i <= nm; i++) {
                printf "%-10s %-12s", i == 1 ? c : "", mname[i]
                for (s in ab)
                    printf " | %-20s", stat(c SUBSEP s "/a-" s SUBSEP metrics[i], "%.2f")
                printf "\n"
            }
        }
    }
    if ("pslite" in seenside || sidelist ~ /pslite/) {
        printf "\nratio to ps-lite across the same namespaces (median of per-round ratios, min-max)\n"
        for (ci = 1; ci <= ncells; ci++) {
            c = cells[ci]
            for (i = 1; i <= nm; i++) {
                printf "%-10s %-12s", i == 1 ? c : "", mname[i]
                for (j = 1; j < nside; j++)
                    printf " | %-20s", stat(c SUBSEP sides[j] "/pslite" SUBSEP metrics[i], "%.2f")
                printf "\n"
            }
        }
    }
}
EOF
) "$work/all.txt"
