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
# Three sides per cell, in interleaved rounds (the order rotating from round to round, so a
# slow minute of the machine does not fall on one side only):
#   chainps           as users run it: messages authenticated (a job secret), snappy on pushes
#                     when it pays (dense random data: it does not, after a probe);
#   chainps insecure  --insecure, no authentication: the apples-to-apples one, since ps-lite
#                     authenticates nothing;
#   ps-lite           scheduler, servers and workers on 127.0.0.1 over TCP (DMLC_NODE_HOST).
# The table: per cell and metric the median of the rounds and their min-max, and the ratio
# chainps / ps-lite: the median of the per-round ratios, with their min-max (GB/s: above 1 means
# chainps is faster; microseconds: below 1 means chainps is faster). Also the commits of both and
# the load average at the start and at the end (2 cores: above ~0.5 at the start means other
# programs shared the CPU). About 70 s with the defaults.
#
# Environment: ROUNDS (3), ITERS (iterations per size; default per size 1 GiB / size within
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
. "$here/lib_results.sh" run_pslite "${2:-}" chainps bench/bench_ps
CHAINPS=$build/chainps
BENCH_PS=$build/bench/bench_ps

ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-}
SIZES=${SIZES:-4096,65536,1048576,16777216}
MODE=${MODE:-sync}
if [ "$smoke" = 1 ]; then
    ROUNDS=1
    ITERS=${ITERS:-3}
    SIZES=4096,65536
fi
case $ROUNDS in '' | *[!0-9]* | 0) usage ;; esac
unset CHAINPS_INSECURE # the first chainps side is the default, authenticated one

work=$res.d
mkdir -p "$work" && : >"$work/run.txt" && : >"$work/run.log" || exit 2
# shellcheck source=lib_pids.sh
. "$here/lib_pids.sh"
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

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
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
collect() { # SIDE ROUND FAILED(0|1) WHAT
    if [ "$3" != 0 ]; then
        failed=$((failed + 1))
        echo "run_pslite: $4 failed:" >&2
        tail -15 "$work/run.log" >&2
    fi
    sed "s/\$/ round=$2 side=$1/" "$work/run.txt" >>"$res"
    cat "$work/run.log" >>"$log"
    : >"$work/run.txt"
    : >"$work/run.log"
}
run_chainps() { # SIDE SERVERS WORKERS SIZES ROUND
    local side=$1 S=$2 W=$3 sizes=$4 flags=() fail=0
    [ "$side" = chainps_insecure ] && flags=(--insecure)
    # launch ends every process it started; its --timeout (and ours) bound the job.
    timeout -k 5 200 "$CHAINPS" launch --servers "$S" --replicas "$S" --workers "$W" \
        --mode "$MODE" --timeout 180 "${flags[@]}" -- "$BENCH_PS" --loop pslite \
        --sizes "$sizes" $(iters_flag --ops) --out "$work/run.txt" >"$work/run.log" 2>&1 &
    pids+=($!)
    wait "$!" || fail=1
    pids=()
    collect "$side" "$5" "$fail" "chainps ($side, $S servers, $W workers)"
}
run_pslite() { # SERVERS WORKERS SIZES ROUND
    local S=$1 W=$2 sizes=$3 i wpids=() fail=0 p
    export DMLC_PS_ROOT_URI=127.0.0.1 DMLC_NODE_HOST=127.0.0.1 DMLC_NUM_SERVER=$S \
        DMLC_NUM_WORKER=$W
    DMLC_PS_ROOT_PORT=$(free_port)
    export DMLC_PS_ROOT_PORT
    DMLC_ROLE=scheduler timeout -k 5 180 "$pslite_bench" >>"$work/run.log" 2>&1 &
    pids+=($!)
    for ((i = 0; i < S; i++)); do
        DMLC_ROLE=server timeout -k 5 180 "$pslite_bench" >>"$work/run.log" 2>&1 &
        pids+=($!)
    done
    for ((i = 0; i < W; i++)); do
        DMLC_ROLE=worker timeout -k 5 180 "$pslite_bench" --sizes "$sizes" $(iters_flag --iters) \
            --out "$work/run.txt" >>"$work/run.log" 2>&1 &
        pids+=($!)
        wpids+=($!)
    done
    for p in "${wpids[@]}"; do
        wait "$p" || fail=1
    done
    # The scheduler and the servers leave once the workers have finalized; stop_all gives 2 s.
    stop_all
    unset DMLC_PS_ROOT_URI DMLC_NODE_HOST DMLC_NUM_SERVER DMLC_NUM_WORKER DMLC_PS_ROOT_PORT
    collect pslite "$4" "$fail" "ps-lite ($S servers, $W workers)"
}

failed=0
start=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
chainps_commit=$(commit_of "$here/..")
echo "chainps ($chainps_commit, $build) vs ps-lite ($pslite_commit) on $(nproc) cores," \
    "$(date -u '+%Y-%m-%d %H:%M UTC'), load average $load0; $ROUNDS rounds, mode $MODE"
sides=(chainps chainps_insecure pslite)
[ "$smoke" = 1 ] && sides=(chainps chainps_insecure)
for ((r = 1; r <= ROUNDS; r++)); do
    n=${#sides[@]}
    for cell in "1:1:$SIZES" "2:2:1048576"; do
        IFS=: read -r S W sizes <<<"$cell"
        for ((k = 0; k < n; k++)); do
            side=${sides[$(((k + r - 1) % n))]}
            if [ "$side" = pslite ]; then
                run_pslite "$S" "$W" "$sizes" "$r"
            else
                run_chainps "$side" "$S" "$W" "$sizes" "$r"
            fi
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
    nside = split("chainps chainps_insecure pslite", sides, " ")
    for (k in runs) {
        split(k, p, SUBSEP)
        for (i = 1; i <= nm; i++) {
            m = metrics[i]
            key = p[1] SUBSEP p[2] SUBSEP m
            val[key, ++cnt[key]] = sum[k, m]
            o = p[1] SUBSEP "pslite" SUBSEP p[3]
            if (p[2] != "pslite" && (o in runs) && sum[o, m] > 0) {
                key = p[1] SUBSEP p[2] "/pslite" SUBSEP m
                val[key, ++cnt[key]] = sum[k, m] / sum[o, m]
            }
        }
    }
    line = "----------------------------------------------------------------------------------" \
           "----------------------------------------------------------------------"
    printf "\nchainps (%s) vs ps-lite (%s): ps-lite\x27s loop, each push waited then each pull " \
           "waited, dense random float32\n", cc, pc
    printf "median of %d interleaved rounds (min-max); pp GB/s counts pushed + pulled bytes " \
           "(10^9 B/s), summed over the workers; latencies of the slower worker\n", rounds
    printf "chainps: launch --mode %s, secure (authenticated, as by default) and --insecure; " \
           "ps-lite authenticates nothing: the apples-to-apples column is chainps --insecure\n", mode
    printf "2w2s: chainps with chains of 2 (--replicas 2, every push crosses both servers); " \
           "ps-lite with its keys split over 2 servers, no replica\n"
    printf "ratio = chainps / ps-lite, median of the per-round ratios (min-max): GB/s above 1 " \
           "and us below 1 mean chainps is ahead\n"
    printf "%s\n", line
    printf "%-10s %-12s | %-22s %-22s %-22s | %-19s %-19s\n", "cell", "metric", "chainps",
           "chainps --insecure", "ps-lite", "ratio", "ratio --insecure"
    printf "%s\n", line
    for (ci = 1; ci <= ncells; ci++) {
        c = cells[ci]
        for (i = 1; i <= nm; i++) {
            m = metrics[i]
            fmt = m == "pp_gbps" ? "%.3f" : "%.0f"
            printf "%-10s %-12s | %-22s %-22s %-22s | %-19s %-19s\n", i == 1 ? c : "", mname[i],
                   stat(c SUBSEP "chainps" SUBSEP m, fmt),
                   stat(c SUBSEP "chainps_insecure" SUBSEP m, fmt),
                   stat(c SUBSEP "pslite" SUBSEP m, fmt),
                   stat(c SUBSEP "chainps/pslite" SUBSEP m, "%.2f"),
                   stat(c SUBSEP "chainps_insecure/pslite" SUBSEP m, "%.2f")
        }
        printf "%s\n", line
    }
    printf "took %d s; load average %s at start, %s at end\n", secs, load0, load1
}'
awk -v secs="$(($(date +%s) - start))" -v load0="$load0" -v load1="$(cut -d' ' -f1-3 /proc/loadavg)" \
    -v cc="$chainps_commit" -v pc="$pslite_commit" -v mode="$MODE" -v rounds="$ROUNDS" \
    -f "$here/pslite_loop.awk" -f <(printf '%s\n' "$table") "$res"
lines=$(grep -c '^pslite_loop ' "$res")
# Every side writes one line per size and worker: 1 worker x the sizes, 2 workers x 1 MB.
want=$((ROUNDS * ${#sides[@]} * ($(echo "$SIZES" | tr ',' '\n' | grep -c .) + 2)))
if [ "$failed" != 0 ] || [ "$lines" != "$want" ]; then
    echo "run_pslite: $failed runs failed; $lines result lines of $want" >&2
    exit 1
fi
