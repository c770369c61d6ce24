#!/usr/bin/env bash
# chainps against ps-lite, side by side on this machine, in ps-lite's own benchmark loop.
#
#   bench/run_pslite.sh PSLITE_DIR [CHAINPS_BUILD_DIR]   (default build dir: build-bench)
#   bench/run_pslite.sh --smoke CHAINPS_BUILD_DIR        (the chainps side only, a few iterations:
#                                                          the ctest check of this script)
#
# PSLITE_DIR is a checkout of https://github.com/dmlc/ps-lite (the reference figures of project
# issue 14 used commit 15b8adf). It is not modified: ps-lite is built in a scratch directory
# (PSLITE_SCRATCH, default ~/.cache/chainps-pslite) keyed by its commit (and a hash of its
# sources when the checkout has local changes), against the system's ZeroMQ and protobuf
# instead of the ones ps-lite's Makefile downloads: Debian packages libzmq3-dev,
# libprotobuf-dev, protobuf-compiler, and g++ (`scripts/deps.sh pslite` installs those missing,
# as this script does first). bench/pslite_bench.cc, our ps-lite program, is
# compiled against it there too. chainps wants a Release build: cmake -DCMAKE_BUILD_TYPE=Release.
#
# The loop of both sides (bench_ps --loop pslite and pslite_bench): per tensor size, after a
# warm-up, N times {push, wait; pull, wait} of one dense tensor of normal(0, 1e-3) float32
# values (the same values on both sides); pp GB/s = pushed + pulled bytes (10^9 B/s) over the
# wall time; push p50 / p99 and pull p50 in microseconds. Cells:
#   1 worker, 1 server: 4 KB, 64 KB, 1 MB, 16 MB (one run per side covers the four sizes);
#   2 workers, 2 servers, 1 MB: chainps with every key range in a chain of both servers
#     (--replicas 2: every push crosses both); ps-lite with its keys split over the two
#     servers (it keeps no replica). GB/s summed over the workers, latencies of the slower one.
# Up to six sides per cell (SIDES), in interleaved rounds (the order rotating from round to
# round, so a slow minute of the machine does not fall on one side only):
#   chainps               as users run it: `chainps launch` with a job secret, so the processes
#                         talk over ipc:// in the job's private directory (same host: no MAC) and
#                         would use tcp:// with a MAC across hosts; snappy on pushes when it pays
#                         (dense random data: it does not, after a probe);
#   chainps_insecure      --insecure, no authentication anywhere;
#   chainps_tcp           authenticated, every channel tcp:// with a MAC (CHAINPS_RUNTIME_DIR set
#                         empty: no ipc), as between hosts, and as every job ran before ipc;
#   chainps_insecure_tcp  --insecure over tcp://: the apples-to-apples one against ps-lite;
#   pslite                scheduler, servers and workers on 127.0.0.1 over TCP (DMLC_NODE_HOST);
#   pslite_local          the same with DMLC_LOCAL=1: ZeroMQ ipc:// sockets in /tmp.
# The tables: per cell and metric the median of the rounds (min-max) of every side, then the
# ratios chainps / ps-lite: the median of the per-round ratios, with their min-max (GB/s: above 1
# means chainps is faster; microseconds and CPU: below 1 means chainps is faster). Also the
# commits of both and the load average at the start and at the end (2 cores: above ~0.5 at the
# start means other programs shared the CPU). About 140 s a round with the defaults.
#
# CPU=1 runs each size in a job of its own, every process under /usr/bin/time, and adds "CPU
# ms/GB": the CPU time (user + system) of all the job's processes, start and warm-up included,
# per 10^9 bytes pushed and pulled (as bench/run_ab.sh does).
#
# Environment: SIDES (the sides above, space-separated; default all six), ROUNDS (3), ITERS (iterations per size; default per size 1 GiB / size within
# [60, 2000]), SIZES (of the 1x1 cell, bytes, comma-separated; default 4096,65536,1048576,16777216),
# MODE (chainps launch --mode: sync, the default of launch, or async, which is what ps-lite's
# independent workers do; it matters for the 2-worker cell only), KEEP=1 keeps the raw results
# and logs, PSLITE_SCRATCH. Every process started here runs under `timeout` and is ended by its
# PID on exit; everything listens on 127.0.0.1 only.
set -u

here=$(cd "$(dirname "$0")" && pwd)
usage() {
    echo "usage: $0 PSLITE_DIR [CHAINPS_BUILD_DIR] | --smoke CHAINPS_BUILD_DIR" >&2
    exit 2
}
smoke=0
if [ "${1:-}" = --smoke ]; then
    smoke=1
    [ $# -eq 2 ] || usage
    shift
    set -- "" "$1"
else
    [ $# -ge 1 ] && [ $# -le 2 ] || usage
fi
pslite_arg=$1
# shellcheck source=lib.sh
. "$here/lib.sh"
bench_prepare run_pslite "${2:-}" chainps bench/bench_ps
CHAINPS=$build/chainps
BENCH_PS=$build/bench/bench_ps

ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-}
SIZES=${SIZES:-4096,65536,1048576,16777216}
MODE=${MODE:-sync}
# The smoke run (a ctest) is no result: it leaves bench/results/run_pslite.md alone.
[ "$smoke" = 1 ] || bench_report "" "$@"
if [ "$smoke" = 1 ]; then
    ROUNDS=1
    ITERS=${ITERS:-3}
    SIZES=4096,65536
fi
case $ROUNDS in '' | *[!0-9]* | 0) usage ;; esac
unset CHAINPS_INSECURE # the first chainps side is the default, authenticated one
unset CHAINPS_RUNTIME_DIR # launch makes the job's private directory (the *_tcp sides: none)
SIDES=${SIDES:-chainps chainps_insecure chainps_tcp chainps_insecure_tcp pslite pslite_local}
CPU=${CPU:-0}

work=$res.d
mkdir -p "$work" && : >"$work/run.txt" && : >"$work/run.log" || exit 2
cleanup() {
    stop_all
    if [ "${KEEP:-0}" = 1 ]; then
        echo "logs kept in $work"
    else
        rm -rf "$work"
    fi
    bench_cleanup
}
trap cleanup EXIT

commit_of() { # DIR: short commit, "-dirty" when it has local changes; "unknown" if not a checkout
    local c top
    top=$(git -C "$1" rev-parse --show-toplevel 2>/dev/null)
    # (a copy without .git inside some other repository is not that repository's commit)
    if [ -z "$top" ] || [ "$(cd "$top" && pwd -P)" != "$(cd "$1" && pwd -P)" ]; then
        echo unknown
        return
    fi
    c=$(git -C "$1" rev-parse --short=7 HEAD 2>/dev/null) || { echo unknown; return; }
    [ -n "$(git -C "$1" status --porcelain --untracked-files=no 2>/dev/null)" ] && c=$c-dirty
    echo "$c"
}

# 1. ps-lite, built once per commit (and source hash when dirty) in the scratch directory.
pslite_bench=
pslite_commit=-
if [ "$smoke" = 0 ]; then
    src=$(cd "$pslite_arg" && pwd) || exit 2
    for f in src/meta.proto src/van.cc src/postoffice.cc src/customer.cc include/ps/ps.h; do
        [ -f "$src/$f" ] || { echo "run_pslite: $src is not a ps-lite checkout (no $f)" >&2; exit 2; }
    done
    # g++, protoc, ZeroMQ and protobuf: installed when missing, like the project's own packages.
    "$here/../scripts/deps.sh" pslite || {
        echo "run_pslite: could not install g++ protobuf-compiler libprotobuf-dev libzmq3-dev" >&2
        exit 2
    }
    for t in g++ protoc pkg-config; do
        command -v "$t" >/dev/null || {
            echo "run_pslite: $t not found (Debian: apt-get install g++ protobuf-compiler" \
                "libprotobuf-dev libzmq3-dev pkg-config)" >&2
            exit 2
        }
    done
    pkg-config --exists libzmq protobuf || {
        echo "run_pslite: ZeroMQ or protobuf development files not found (Debian: apt-get" \
            "install libzmq3-dev libprotobuf-dev)" >&2
        exit 2
    }
    pslite_commit=$(commit_of "$src")
    key=${pslite_commit%-dirty}
    if [ "$key" != "$pslite_commit" ] || [ "$key" = unknown ]; then
        key=$key-$(cat "$src"/src/*.cc "$src"/src/*.h "$src"/src/meta.proto \
            $(find "$src/include" -type f | sort) | sha1sum | cut -c1-12)
    fi
    scratch=${PSLITE_SCRATCH:-${XDG_CACHE_HOME:-$HOME/.cache}/chainps-pslite}
    pdir=$scratch/$key
    cxxflags=(-std=c++11 -O3 -fPIC -w -pthread)
    if [ ! -f "$pdir/libps.a" ]; then
        echo "run_pslite: building ps-lite $pslite_commit in $pdir"
        # Compiled from a copy of src/ (a meta.pb.h left in the checkout by an earlier `make`,
        # from another protoc, must not be the one van.cc's #include "meta.pb.h" finds).
        rm -rf "$pdir.tmp"
        mkdir -p "$pdir.tmp/src" || exit 2
        cp "$src"/src/*.cc "$src"/src/*.h "$src/src/meta.proto" "$pdir.tmp/src/" || exit 2
        rm -f "$pdir.tmp"/src/meta.pb.*
        blog=$pdir.tmp/build.log
        ok=1
        protoc --cpp_out="$pdir.tmp/src" --proto_path="$pdir.tmp/src" "$pdir.tmp/src/meta.proto" \
            >>"$blog" 2>&1 || ok=0
        cc_pids=()
        for f in customer postoffice van; do
            g++ "${cxxflags[@]}" -I"$pdir.tmp/src" -I"$src/include" \
                $(pkg-config --cflags libzmq protobuf) -c "$pdir.tmp/src/$f.cc" \
                -o "$pdir.tmp/$f.o" >>"$blog" 2>&1 &
            cc_pids+=($!)
            pids+=($!)
            if [ ${#cc_pids[@]} -ge 2 ]; then # two compilers at a time
                wait "${cc_pids[0]}" || ok=0
                cc_pids=("${cc_pids[@]:1}")
            fi
        done
        g++ "${cxxflags[@]}" -I"$pdir.tmp/src" $(pkg-config --cflags protobuf) \
            -c "$pdir.tmp/src/meta.pb.cc" -o "$pdir.tmp/meta.pb.o" >>"$blog" 2>&1 || ok=0
        for p in "${cc_pids[@]}"; do
            wait "$p" || ok=0
        done
        pids=()
        [ "$ok" = 1 ] && ar crs "$pdir.tmp/libps.a" "$pdir.tmp"/*.o >>"$blog" 2>&1 || ok=0
        if [ "$ok" != 1 ]; then
            echo "run_pslite: building ps-lite failed:" >&2
            tail -30 "$blog" >&2
            exit 1
        fi
        mkdir -p "$pdir/include"
        cp -r "$src/include/." "$pdir/include/"
        cp "$pdir.tmp/libps.a" "$blog" "$pdir/"
        rm -rf "$pdir.tmp"
    fi
    pslite_bench=$pdir/pslite_bench
    if [ ! -x "$pslite_bench" ] || [ "$here/pslite_bench.cc" -nt "$pslite_bench" ]; then
        if ! g++ "${cxxflags[@]}" -isystem "$pdir/include" "$here/pslite_bench.cc" \
            "$pdir/libps.a" $(pkg-config --libs libzmq protobuf) -o "$pslite_bench.tmp" \
            >"$work/pslite_bench.log" 2>&1; then
            echo "run_pslite: compiling bench/pslite_bench.cc failed:" >&2
            tail -30 "$work/pslite_bench.log" >&2
            exit 1
        fi
        mv "$pslite_bench.tmp" "$pslite_bench"
    fi
fi

# 2. The runs. Each appends its worker lines to $res, tagged with round and side.
iters_flag() { [ -n "$ITERS" ] && echo "$1 $ITERS"; }
# One run's end: its worker lines into $res tagged with round and side, its log into $log.
collect() { # SIDE ROUND FAILED(0|1) WHAT [CPU_S]
    if [ "$3" != 0 ]; then
        failed=$((failed + 1))
        echo "run_pslite: $4 failed:" >&2
        tail -15 "$work/run.log" >&2
    fi
    sed "s/\$/ round=$2 side=$1${5:+ cpu_s=$5}/" "$work/run.txt" >>"$res"
    cat "$work/run.log" >>"$log"
    : >"$work/run.txt"
    : >"$work/run.log"
}
# The CPU seconds (user + system) in the /usr/bin/time files $work/time.*, and removes them.
cpu_of() {
    [ "$CPU" = 1 ] || return 0
    awk -F, '/^[0-9.]+,[0-9.]+$/ { s += $1 + $2 } END { printf "%.3f", s }' "$work"/time.* 2>/dev/null
    rm -f "$work"/time.*
}
timer() { # N: the /usr/bin/time prefix for process N of a run (nothing unless CPU=1)
    [ "$CPU" = 1 ] && echo "/usr/bin/time -f %U,%S -o $work/time.$1"
}
run_chainps() { # SIDE SERVERS WORKERS SIZES ROUND
    local side=$1 S=$2 W=$3 sizes=$4 flags=() fail=0 env=()
    case $side in *insecure*) flags=(--insecure) ;; esac
    case $side in *_tcp) env=(CHAINPS_RUNTIME_DIR=) ;; esac
    # launch ends every process it started; its --timeout (and ours) bound the job.
    # shellcheck disable=SC2046 # timer's words
    env "${env[@]}" $(timer 0) timeout -k 5 200 "$CHAINPS" launch --servers "$S" --replicas "$S" --workers "$W" \
        --mode "$MODE" --timeout 180 "${flags[@]}" -- "$BENCH_PS" --loop pslite \
        --sizes "$sizes" $(iters_flag --ops) --out "$work/run.txt" >"$work/run.log" 2>&1 &
    pids+=($!)
    wait "$!" || fail=1
    pids=()
    collect "$side" "$5" "$fail" "chainps ($side, $S servers, $W workers)" "$(cpu_of)"
}
run_pslite() { # SIDE SERVERS WORKERS SIZES ROUND
    local side=$1 S=$2 W=$3 sizes=$4 i wpids=() fail=0 p
    shift
    export DMLC_PS_ROOT_URI=127.0.0.1 DMLC_NODE_HOST=127.0.0.1 DMLC_NUM_SERVER=$S \
        DMLC_NUM_WORKER=$W
    [ "$side" = pslite_local ] && export DMLC_LOCAL=1
    DMLC_PS_ROOT_PORT=$(free_port)
    export DMLC_PS_ROOT_PORT
    # shellcheck disable=SC2046 # timer's words
    DMLC_ROLE=scheduler $(timer s) timeout -k 5 180 "$pslite_bench" >>"$work/run.log" 2>&1 &
    pids+=($!)
    for ((i = 0; i < S; i++)); do
        # shellcheck disable=SC2046
        DMLC_ROLE=server $(timer "s$i") timeout -k 5 180 "$pslite_bench" >>"$work/run.log" 2>&1 &
        pids+=($!)
    done
    for ((i = 0; i < W; i++)); do
        # shellcheck disable=SC2046
        DMLC_ROLE=worker $(timer "w$i") timeout -k 5 180 "$pslite_bench" --sizes "$sizes" \
            $(iters_flag --iters) --out "$work/run.txt" >>"$work/run.log" 2>&1 &
        pids+=($!)
        wpids+=($!)
    done
    for p in "${wpids[@]}"; do
        wait "$p" || fail=1
    done
    # The scheduler and the servers leave once the workers have finalized; stop_all gives 2 s.
    stop_all
    unset DMLC_PS_ROOT_URI DMLC_NODE_HOST DMLC_NUM_SERVER DMLC_NUM_WORKER DMLC_PS_ROOT_PORT \
        DMLC_LOCAL
    collect "$side" "$4" "$fail" "$side ($S servers, $W workers)" "$(cpu_of)"
}
run_side() { # SIDE SERVERS WORKERS SIZES ROUND: all sizes in one job, or one job per size (CPU=1)
    local s run=run_chainps
    case $1 in pslite*) run=run_pslite ;; esac
    if [ "$CPU" = 1 ]; then
        for s in ${4//,/ }; do
            "$run" "$1" "$2" "$3" "$s" "$5"
        done
    else
        "$run" "$@"
    fi
}

failed=0
start=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
chainps_commit=$(commit_of "$here/..")
echo "chainps ($chainps_commit, $build) vs ps-lite ($pslite_commit) on $(nproc) cores," \
    "$(date -u '+%Y-%m-%d %H:%M UTC'), load average $load0; $ROUNDS rounds, mode $MODE"
read -r -a sides <<<"$SIDES"
[ "$smoke" = 1 ] && sides=(chainps chainps_insecure chainps_tcp)
for ((r = 1; r <= ROUNDS; r++)); do
    n=${#sides[@]}
    for cell in "1:1:$SIZES" "2:2:1048576"; do
        IFS=: read -r S W sizes <<<"$cell"
        for ((k = 0; k < n; k++)); do
            run_side "${sides[$(((k + r - 1) % n))]}" "$S" "$W" "$sizes" "$r"
        done
    done
    echo "round $r of $ROUNDS done ($(($(date +%s) - start)) s)"
done

# 3. The table.
# The END rule; the lines and stat(): bench/pslite_loop.awk.
table='
END {
    nm = split("pp_gbps push_p50_us push_p99_us pull_p50_us", metrics, " ")
    split("pp GB/s,push p50 us,push p99 us,pull p50 us", mname, ",")
    for (k in bytes) {
        sum[k, "cpu_ms_gb"] = cpu[k] * 1e12 / bytes[k]
        if (nm == 4) { metrics[++nm] = "cpu_ms_gb"; mname[nm] = "CPU ms/GB" }
    }
    nside = split(sidelist, sides, " ")
    # Ratios: every chainps side against every ps-lite side of the same round.
    nrat = 0
    for (i = 1; i <= nside; i++)
        for (j = 1; j <= nside; j++)
            if (sides[i] !~ /^pslite/ && sides[j] ~ /^pslite/) ratios[++nrat] = sides[i] "/" sides[j]
    for (k in runs) {
        split(k, p, SUBSEP)
        for (i = 1; i <= nm; i++) {
            m = metrics[i]
            key = p[1] SUBSEP p[2] SUBSEP m
            if ((k SUBSEP m) in sum) val[key, ++cnt[key]] = sum[k, m]
            if (p[2] ~ /^pslite/) continue
            for (j = 1; j <= nside; j++) {
                if (sides[j] !~ /^pslite/) continue
                o = p[1] SUBSEP sides[j] SUBSEP p[3]
                if ((o in runs) && sum[o, m] > 0 && ((k SUBSEP m) in sum)) {
                    key = p[1] SUBSEP p[2] "/" sides[j] SUBSEP m
                    val[key, ++cnt[key]] = sum[k, m] / sum[o, m]
                }
            }
        }
    }
    printf "\nchainps (%s) vs ps-lite (%s): ps-lite\x27s loop, each push waited then each pull " \
           "waited, dense random float32\n", cc, pc
    printf "median of %d interleaved rounds (min-max); pp GB/s counts pushed + pulled bytes " \
           "(10^9 B/s), summed over the workers; latencies of the slower worker\n", rounds
    printf "chainps: launch --mode %s; chainps and chainps_insecure: ipc:// between the job\x27s " \
           "processes (no MAC: the private directory is the boundary); *_tcp: tcp:// only (with " \
           "a MAC unless insecure); ps-lite authenticates nothing, pslite_local: DMLC_LOCAL=1 " \
           "(ZeroMQ ipc://)\n", mode
    printf "2w2s: chainps with chains of 2 (--replicas 2, every push crosses both servers); " \
           "ps-lite with its keys split over 2 servers, no replica\n"
    line = sprintf("%0" (24 + 24 * nside) "d", 0); gsub(/0/, "-", line)
    printf "%s\n%-10s %-12s |", line, "cell", "metric"
    for (j = 1; j <= nside; j++) printf " %-22s", sides[j]
    printf "\n%s\n", line
    for (ci = 1; ci <= ncells; ci++) {
        c = cells[ci]
        for (i = 1; i <= nm; i++) {
            m = metrics[i]
            fmt = m == "pp_gbps" ? "%.3f" : m == "cpu_ms_gb" ? "%.1f" : "%.0f"
            printf "%-10s %-12s |", i == 1 ? c : "", mname[i]
            for (j = 1; j <= nside; j++) printf " %-22s", stat(c SUBSEP sides[j] SUBSEP m, fmt)
            printf "\n"
        }
        printf "%s\n", line
    }
    if (nrat) {
        printf "\nratio = chainps side / ps-lite side, median of the per-round ratios (min-max): " \
               "GB/s above 1, us and CPU below 1 mean chainps is ahead\n"
        printf "c = chainps, ins = --insecure, tcp = tcp:// only; ps = ps-lite, ps-ipc = ps-lite " \
               "DMLC_LOCAL=1\n"
        line = sprintf("%0" (24 + 18 * nrat) "d", 0); gsub(/0/, "-", line)
        printf "%s\n%-10s %-12s |", line, "cell", "metric"
        for (r = 1; r <= nrat; r++) {
            h = ratios[r]
            gsub(/chainps/, "c", h); gsub(/_insecure/, "-ins", h); gsub(/_tcp/, "-tcp", h)
            gsub(/pslite_local/, "ps-ipc", h); gsub(/pslite/, "ps", h)
            printf " %-17s", h
        }
        printf "\n%s\n", line
        for (ci = 1; ci <= ncells; ci++) {
            c = cells[ci]
            for (i = 1; i <= nm; i++) {
                printf "%-10s %-12s |", i == 1 ? c : "", mname[i]
                for (r = 1; r <= nrat; r++)
                    printf " %-17s", stat(c SUBSEP ratios[r] SUBSEP metrics[i], "%.2f")
                printf "\n"
            }
            printf "%s\n", line
        }
    }
    printf "took %d s; load average %s at start, %s at end\n", secs, load0, load1
}'
awk -v secs="$(($(date +%s) - start))" -v load0="$load0" -v load1="$(cut -d' ' -f1-3 /proc/loadavg)" \
    -v cc="$chainps_commit" -v pc="$pslite_commit" -v mode="$MODE" -v rounds="$ROUNDS" \
    -v sidelist="${sides[*]}" \
    -f "$here/pslite_loop.awk" -f <(printf '%s\n' "$table") "$res"
lines=$(grep -c '^pslite_loop ' "$res")
# Every side writes one line per size and worker: 1 worker x the sizes, 2 workers x 1 MB.
want=$((ROUNDS * ${#sides[@]} * ($(echo "$SIZES" | tr ',' '\n' | grep -c .) + 2)))
if [ "$failed" != 0 ] || [ "$lines" != "$want" ]; then
    echo "run_pslite: $failed runs failed; $lines result lines of $want" >&2
    exit 1
fi
