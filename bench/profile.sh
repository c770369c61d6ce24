#!/usr/bin/env bash
# Profile one bench_ps case with perf: where do the server and the worker spend their time?
#
#   bench/profile.sh NAME SIZE KIND [SERVERS] [BUILD_DIR]
#     NAME     output prefix (perf data, logs: $TMPDIR/chainps-prof-NAME.*)
#     SIZE     tensor bytes, e.g. 1048576;   KIND  push | pull | pp
#     env REPLICAS: chain length (default: SERVERS, capped by launch at 3); DATA: dense|sparse
#
# Starts `chainps launch` with bench_ps running only that case, pipelined, dense data, for
# about 8 s; once the worker has joined, records the server and the worker for 4 s (one
# `perf record -p` each, DWARF call graphs, so only our processes), reads each thread's CPU
# time from /proc over the same window, lets the job finish and prints: the operation rate, CPU
# per thread, the self-time profile and the inclusive time of the data-path functions, per
# process. Every process is started here or by launch and ended by its PID.
set -u
name=${1:?name}
size=${2:?size}
kind=${3:?kind}
S=${4:-1}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
build=$(cd "${5:-$here/../build-bench}" && pwd) || exit 2
out=${TMPDIR:-/tmp}/chainps-prof-$name
hz=$(getconf CLK_TCK)

"$build/chainps" launch --servers "$S" --replicas "${REPLICAS:-$S}" --workers 1 --timeout 60 -- "$build/bench/bench_ps" \
    --sizes "$size" --data "${DATA:-dense}" --only "$kind" --no-lat --reps 25 --ms 500 >"$out.log" 2>&1 &
launch=$!
perfs=()
cleanup() {
    for p in "${perfs[@]}"; do kill -INT "$p" 2>/dev/null; done
    kill "$launch" 2>/dev/null
    wait 2>/dev/null
}
bench_report "" "$@"
trap cleanup EXIT

# The worker and the servers are launch's children; wait until the worker has joined.
spids=() wpid=
for _ in $(seq 100); do
    sleep 0.1
    grep -q "joined as node" "$out.log" || continue
    for c in $(cat /proc/"$launch"/task/*/children 2>/dev/null); do
        case "$(tr '\0' ' ' </proc/"$c"/cmdline 2>/dev/null)" in
        *" server "*) spids+=("$c") ;;
        *bench_ps*) wpid=$c ;;
        esac
    done
    break
done
[ -n "$wpid" ] && [ ${#spids[@]} -gt 0 ] || {
    echo "profile: job did not start" >&2
    cat "$out.log" >&2
    exit 1
}

# utime+stime ticks per thread: "tid comm ticks"
ticks() {
    for t in /proc/"$1"/task/*; do
        awk -v tid="${t##*/}" '{ sub(/^[^)]*\) /, ""); print tid, $12 + $13 }' "$t/stat" \
            2>/dev/null
    done
}
sleep 1.5 # past calibration
before=$(for p in "${spids[@]}" "$wpid"; do ticks "$p" | sed "s/^/$p /"; done)
t0=$(date +%s.%N)
i=0
for p in "${spids[@]}" "$wpid"; do
    perf record -q -F 499 --call-graph dwarf,8192 -p "$p" -o "$out.$i.perf" -- sleep 4 \
        2>/dev/null &
    perfs+=($!)
    i=$((i + 1))
done
wait "${perfs[@]}"
perfs=()
t1=$(date +%s.%N)
after=$(for p in "${spids[@]}" "$wpid"; do ticks "$p" | sed "s/^/$p /"; done)
wait "$launch"
trap - EXIT

grep -E "^\[worker 0\] (dense|sparse|bench_ps)" "$out.log"
mbps=$(grep -E "^\[worker 0\] (dense|sparse)" "$out.log" | awk -v k="$kind" \
    '{ print k == "push" ? $5 : k == "pull" ? $6 : $7 }')
awk -v m="$mbps" -v sz="$size" -v k="$kind" 'BEGIN {
    r = m * 1e6 / sz / (k == "pp" ? 2 : 1)
    printf "operation rate (median of the runs): %.0f ops/s = %.1f us per op\n", r, 1e6 / r }'
echo "CPU per thread over the $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s window (% of one core):"
LC_ALL=C join <(echo "$before" | awk '{print $1":"$2, $3}' | LC_ALL=C sort) \
    <(echo "$after" | awk '{print $1":"$2, $3}' | LC_ALL=C sort) |
    awk -v hz="$hz" -v dt="$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')" \
        '{ split($1, a, ":"); printf "  pid %s tid %s  %5.1f%%\n", a[1], a[2], ($3 - $2) / hz / dt * 100 }'

i=0
for p in "${spids[@]}" "$wpid"; do
    [ "$p" = "$wpid" ] && who=worker || who=server
    f=$out.$i.perf
    i=$((i + 1))
    echo "== $who (pid $p): CPU by (nearest data-path function | kind of cost), top 22"
    perf script -i "$f" -F tid,ip,sym 2>/dev/null | awk -v hz=499 -f "$here/perf_classify.awk" |
        head -22
    echo "== $who (pid $p): self time by symbol, top 12"
    perf report -i "$f" --no-children --sort dso,symbol --stdio -g none --percent-limit 1 \
        2>/dev/null | grep -E '^ +[0-9]' | head -12 | sed -E 's/ +- +- *$//'
done
echo "perf data: $out.N.perf (perf report -i FILE --children)"
