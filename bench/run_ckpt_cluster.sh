#!/usr/bin/env bash
# Checkpoints of a running job (project issue 6): export and restore throughput against the raw
# disk, and what an export costs the training steps it overlaps.
#
#   bench/run_ckpt_cluster.sh [BUILD_DIR]     (default: build-bench beside this folder's parent)
#
# Builds nothing: needs BUILD_DIR/chainps and BUILD_DIR/bench/ckpt_worker (Release). On 127.0.0.1
# only, in a fresh `mktemp -d` directory (removed at the end; KEEP=1 keeps it and its logs):
#   1. dd: `dd if=/dev/zero of=DIR/dd.bin bs=4M count=100 conv=fsync` REPS times, in the same
#      directory the exports write to, before the job starts (the raw disk write speed);
#   2. a training job: `chainps launch --servers 2 --workers 1 --port P --data DIR/data` running
#      ckpt_worker (one dense tensor of PARAMS float32, SGD, a cheap synthetic gradient, one
#      cps_push_pull per sync step; it prints each step's CLOCK_MONOTONIC end time and duration).
#      After WARM steps (not counted: first touch of the store) and one more, REPS exports run one
#      after the other, `chainps checkpoint export --scheduler 127.0.0.1:P --out DIR/ckpt-r`, each
#      followed by GAP steps that start after it ended; then a stop file ends the worker;
#   3. a restore job: the last checkpoint's pages dropped from the page cache (dd iflag=nocache),
#      then `chainps launch ... --restore-from DIR/ckpt-REPS/model.safetensors` with ckpt_worker
#      --steps 1 --crc: the scheduler's "restored ... in S s" line gives the restore MB/s; the
#      worker's CRC-32 of the pulled values must equal the one in the checkpoint's metadata.
# Figures: export MB/s = MB / the command's own "in S s" (it includes the wait for the next step
# boundary of the sync job: the cut is exactly at a step); "cut wait" = from the command's start
# to the moment the last range opened its read view (servers' log, ms), "write" = the command's
# "in S s" minus that (reading the views, CRC-32, writing, fsync, rename); step times: median
# duration of steps whose [start, end] overlaps an export command's [start, end] vs of the other
# steps (after the warm-up). Medians over REPS. Memory: the servers' and the worker's RSS sampled
# every 0.5 s (anonymous and file-backed, /proc/PID/status), peak per phase. Each export's log
# (export-r.log, KEEP=1) says where its time went: the cut, the wait for the servers' answers,
# the wait for the disk, the fsync; bench/profile_ckpt.sh adds CPU per thread and perf profiles.
#
# REPLICAS (default 1: chains of 1, see below) is passed to both launches as --replicas.
#
# Chains of 1 by default, as the figures before were taken; REPLICAS=2 works as well since
# tensors are cut into 512 KB chunks and workers and heads keep a window of them in flight (with
# one 200 MB chunk per range, heads re-sent whole chunks every 200 ms to a tail still applying
# them and the job stalled).
#
# Knobs: PARAMS (100000000), REPS (3), WARM (2), GAP (2), TIMEOUT (launch --timeout, 330 s; the
# safety net), EXPORT_TIMEOUT (chainps checkpoint export --timeout, 120 s), DEAD_MS and REQUEST_MS
# (CHAINPS_DEAD_AFTER_MS and CHAINPS_REQUEST_TIMEOUT_MS for every process; unset: the defaults,
# which 512 KB chunks keep well clear of: no server is silent for long), MEM_LIMIT_MB (6000: the run is
# stopped if the job's processes together use more), PORT (first of two scheduler ports;
# default free ones), KEEP=1.
# Every process started here is ended by its PID on exit (launch first, which ends its own
# children; whatever is left of them is then killed by PID).
set -u

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$here/lib.sh"
build=${1:-$here/../build-bench}
build=$(cd "$build" && pwd) || exit 2
CHAINPS=$build/chainps
WORKER=$build/bench/ckpt_worker
for b in "$CHAINPS" "$WORKER"; do
    [ -x "$b" ] || { echo "run_ckpt_cluster: $b not built" >&2; exit 2; }
done
PARAMS=${PARAMS:-100000000}
REPS=${REPS:-3}
WARM=${WARM:-2}
GAP=${GAP:-2}
TIMEOUT=${TIMEOUT:-330}
EXPORT_TIMEOUT=${EXPORT_TIMEOUT:-120}
[ -n "${DEAD_MS:-}" ] && export CHAINPS_DEAD_AFTER_MS=$DEAD_MS
[ -n "${REQUEST_MS:-}" ] && export CHAINPS_REQUEST_TIMEOUT_MS=$REQUEST_MS
MEM_LIMIT_MB=${MEM_LIMIT_MB:-6000}
REPLICAS=${REPLICAS:-1}
export LC_ALL=C

tmp=$(mktemp -d "${TMPDIR:-/tmp}/chainps-ckpt-bench-XXXXXX") || exit 2
# One secret for the job and the export tool that talks to it.
if [ -z "${CHAINPS_SECRET_FILE:-}" ] && [ "${CHAINPS_INSECURE:-0}" != 1 ]; then
    "$CHAINPS" secret "$tmp/job.secret" >/dev/null || exit 2
    export CHAINPS_SECRET_FILE=$tmp/job.secret
fi
launch_pid=
monitor_pid=
export_pid=
dd_pid=
kids_of() { ps -o pid= --ppid "$1" 2>/dev/null | tr -d ' '; }
# End PID (and the children it had): SIGTERM, up to 10 s, then SIGKILL for whoever is left
# (reported unless QUIET is given: the monitor's last `sleep`).
end_tree() {
    local p=$1 quiet=${2:-} kids k
    [ -n "$p" ] || return 0
    kids=$(kids_of "$p")
    if alive "$p"; then
        kill -TERM "$p" 2>/dev/null
        for _ in $(seq 100); do
            alive "$p" || break
            sleep 0.1
        done
        alive "$p" && kill -KILL "$p" 2>/dev/null
    fi
    { wait "$p"; } 2>/dev/null
    for k in $kids; do
        if alive "$k"; then
            [ -n "$quiet" ] || echo "run_ckpt_cluster: process $k (child of $p) still alive: killed" >&2
            kill -KILL "$k" 2>/dev/null
        fi
    done
}
cleanup() {
    end_tree "$export_pid"
    end_tree "$dd_pid"
    end_tree "$launch_pid"
    end_tree "$monitor_pid" quiet
    if [ "${KEEP:-0}" = 1 ]; then
        echo "kept $tmp (train.log, restore.log, export-*.log, rss.txt, steps.txt, windows.txt)"
    else
        rm -rf "$tmp"
    fi
}
bench_report "" "$@"
trap cleanup EXIT
trap 'exit 130' INT TERM
die() {
    echo "run_ckpt_cluster: $*" >&2
    exit 1
}

free_port() {
    local p
    for _ in $(seq 200); do
        p=$((20000 + RANDOM % 40000))
        ss -Htan 2>/dev/null | awk '{print $4; print $5}' | grep -q ":$p\$" || { echo "$p"; return; }
    done
    echo 0
}
if [ -n "${PORT:-}" ]; then
    port1=$PORT
    port2=$((PORT + 1))
else
    port1=$(free_port)
    port2=$(free_port)
    [ "$port2" = "$port1" ] && port2=$(free_port)
fi
mono() { "$WORKER" --now; }
tod() { date -u +%H:%M:%S.%N; } # the logs' clock: UTC time of day
phase() { echo "$1" >"$tmp/phase"; }
tstart=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
mb=$(awk -v n="$PARAMS" 'BEGIN { printf "%.1f", n * 4 / 1e6 }')

# ---- memory monitor: every 0.5 s, the RSS of every child of the running launch ----
phase idle
echo 0 >"$tmp/launch"
(
    while :; do
        lp=$(cat "$tmp/launch" 2>/dev/null)
        ph=$(cat "$tmp/phase" 2>/dev/null)
        if [ -n "$lp" ] && [ "$lp" != 0 ]; then
            total=0
            for k in $(ps -o pid= --ppid "$lp" 2>/dev/null); do
                args=$({ tr '\0' ' ' <"/proc/$k/cmdline"; } 2>/dev/null)
                case $args in
                *" server "*) role=server ;;
                *ckpt_worker*) role=worker ;;
                *) continue ;;
                esac
                awk -v ph="$ph" -v role="$role" -v pid="$k" '
                    /^RssAnon:/ { a = $2 } /^RssFile:/ { f = $2 } /^RssShmem:/ { s = $2 }
                    END { if (a != "") print ph, role, pid, a, f + s }' "/proc/$k/status" 2>/dev/null
                total=$((total + $(awk '/^VmRSS:/ { print $2 }' "/proc/$k/status" 2>/dev/null || echo 0)))
            done
            [ "$total" -gt $((MEM_LIMIT_MB * 1024)) ] && echo "$((total / 1024))" >"$tmp/memguard"
        fi
        sleep 0.5
    done >>"$tmp/rss.txt"
) &
monitor_pid=$!

echo "chainps checkpoint benchmark on $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo |
    cut -d: -f2 | sed 's/^ *//')), $(date -u '+%Y-%m-%d %H:%M UTC'), load average $load0"
echo "model: $PARAMS float32 parameters in one dense tensor ($mb MB), SGD (no optimizer state);" \
    "2 servers (chains of $REPLICAS: --replicas $REPLICAS), 1 worker, sync; files in $tmp ($(df -PT "$tmp" | awk 'NR == 2 {
    print $2 " on " $1}'))"
echo "uptime:$(uptime)"
echo "knobs: PARAMS=$PARAMS REPS=$REPS WARM=$WARM GAP=$GAP REPLICAS=$REPLICAS" \
    "CHAINPS_DEAD_AFTER_MS=${CHAINPS_DEAD_AFTER_MS:-default} CHAINPS_REQUEST_TIMEOUT_MS=${CHAINPS_REQUEST_TIMEOUT_MS:-default}" \
    "TIMEOUT=$TIMEOUT EXPORT_TIMEOUT=$EXPORT_TIMEOUT MEM_LIMIT_MB=$MEM_LIMIT_MB"

# ---- 1. raw disk write speed ----
phase dd
for r in $(seq "$REPS"); do
    dd if=/dev/zero of="$tmp/dd.bin" bs=4M count=100 conv=fsync 2>"$tmp/dd-$r.log" &
    dd_pid=$!
    wait "$dd_pid" || die "dd failed: $(cat "$tmp/dd-$r.log")"
    dd_pid=
    # "419430400 bytes (419 MB, 400 MiB) copied, 1.2 s, 350 MB/s"
    awk '/copied/ { for (i = 1; i <= NF; i++) if ($i ~ /^copied/) s = $(i + 1)
                    printf "dd %d %.1f\n", r, $1 / s / 1e6 }' r="$r" "$tmp/dd-$r.log" >>"$tmp/results.txt"
    rm -f "$tmp/dd.bin"
done

# ---- 2. the training job, and the exports ----
phase warm
"$CHAINPS" launch --servers 2 --workers 1 --replicas "$REPLICAS" --port "$port1" --data "$tmp/data" \
    --timeout "$TIMEOUT" -- "$WORKER" --params "$PARAMS" --steps 1000000 --stop-file "$tmp/stop" >"$tmp/train.log" 2>&1 &
launch_pid=$!
echo "$launch_pid" >"$tmp/launch"

memguard() {
    [ -f "$tmp/memguard" ] && die "the job's processes use $(cat "$tmp/memguard") MB (more than" \
        "MEM_LIMIT_MB=$MEM_LIMIT_MB): stopped. Last lines: $(grep -v refused "$tmp/train.log" |
            tail -5)"
    return 0
}
# Steps done (optionally: that started after monotonic time $1).
steps_done() {
    [ -f "$tmp/train.log" ] || { echo 0; return; }
    awk -v after="${1:-0}" '$3 == "step" && $5 == "t_ms" && $6 - $8 > after { n++ }
        END { print n + 0 }' \
        "$tmp/train.log"
}
wait_steps() { # N [AFTER_MS]: wait until N steps are done (that started after AFTER_MS)
    local n
    while :; do
        n=$(steps_done "${2:-0}")
        [ "$n" -ge "$1" ] && return 0
        alive "$launch_pid" || die "the training job ended early: $(tail -5 "$tmp/train.log")"
        memguard
        sleep 0.3
    done
}
wait_steps $((WARM + 1))
echo "training: $(grep -m1 'declared bench/w' "$tmp/train.log" | sed 's/^\[worker 0\] //')"

for r in $(seq "$REPS"); do
    phase export
    t0=$(mono)
    d0=$(tod)
    "$CHAINPS" checkpoint export --scheduler "127.0.0.1:$port1" --out "$tmp/ckpt-$r" \
        --timeout "$EXPORT_TIMEOUT" >"$tmp/export-$r.log" 2>&1 &
    export_pid=$!
    while alive "$export_pid"; do
        memguard
        sleep 0.1
    done
    wait "$export_pid"
    erc=$?
    export_pid=
    t1=$(mono)
    d1=$(tod)
    phase train
    echo "window $r $t0 $t1 $d0 $d1 $erc" >>"$tmp/windows.txt"
    # "exported 1 tensors (400.0 MB with optimizer state) at step 20 in 1.23 s: PATH"
    line=$(grep -m1 '^exported ' "$tmp/export-$r.log")
    if [ "$erc" != 0 ] || [ -z "$line" ]; then
        echo "export $r FAILED (exit $erc): $(tail -3 "$tmp/export-$r.log")" >&2
        echo "exportfail $r" >>"$tmp/results.txt"
    else
        echo "$line" | awk -v r="$r" '{ for (i = 1; i <= NF; i++) {
                if ($i == "step") st = $(i + 1); if ($i == "in") s = $(i + 1)
                if ($i == "(" || $i ~ /^\(/) m = substr($i, 2) }
            print "export", r, st, m, s }' >>"$tmp/results.txt"
    fi
    # Keep only the newest checkpoint on disk.
    [ "$r" -gt 1 ] && rm -rf "$tmp/ckpt-$((r - 1))"
    wait_steps "$GAP" "$t1"
done
phase stop
touch "$tmp/stop"
for _ in $(seq 600); do
    alive "$launch_pid" || break
    memguard
    sleep 0.1
done
wait "$launch_pid"
train_rc=$?
launch_pid=
echo 0 >"$tmp/launch"
grep -E '^\[worker 0\] step ' "$tmp/train.log" | awk '{ print $4, $6, $8 }' >"$tmp/steps.txt"

# ---- 3. restore into a fresh job ----
ck=$tmp/ckpt-$REPS/model.safetensors
restore_rc=skipped
if [ -f "$ck" ]; then
    # The file was just written: drop its pages so the restore reads it from the disk.
    dd if="$ck" iflag=nocache count=0 status=none
    cached=$(fincore -nb -o RES "$ck" 2>/dev/null | tr -d ' ')
    want=$(head -c 65536 "$ck" | grep -a -o '"checksum/bench/w":"crc32:[0-9a-f]*"' | cut -d: -f3 |
        tr -d '"')
    phase restore
    "$CHAINPS" launch --servers 2 --workers 1 --replicas "$REPLICAS" --port "$port2" --data "$tmp/data2" \
        --timeout "$TIMEOUT" --restore-from "$ck" \
        -- "$WORKER" --params "$PARAMS" --steps 1 --crc >"$tmp/restore.log" 2>&1 &
    launch_pid=$!
    echo "$launch_pid" >"$tmp/launch"
    while alive "$launch_pid"; do
        memguard
        sleep 0.3
    done
    wait "$launch_pid"
    restore_rc=$?
    launch_pid=
    echo 0 >"$tmp/launch"
    phase finished
    # "[scheduler] ... ckpt: restored PATH: 1 tensors, 400.0 MB at step 20 in 0.85 s; ..."
    grep -m1 'ckpt: restored ' "$tmp/restore.log" | awk -v c="${cached:-?}" '{
        for (i = 1; i <= NF; i++) { if ($i == "MB") m = $(i - 1); if ($i == "step") st = $(i + 1)
                                    if ($i == "in") s = $(i + 1) }
        print "restore", st, m, s, c }' >>"$tmp/results.txt"
    got=$(grep -m1 'values crc32:' "$tmp/restore.log" | grep -o 'crc32:[0-9a-f]*' | cut -d: -f2)
    gotstep=$(grep -m1 'values crc32:' "$tmp/restore.log" | awk '{ for (i = 1; i <= NF; i++)
        if ($i == "step") print $(i + 1) }')
    echo "crc ${want:-none} ${got:-none} ${gotstep:-?}" >>"$tmp/results.txt"
fi
phase finished
end_tree "$monitor_pid" quiet
monitor_pid=

# ---- log notes: errors and warnings of every process ----
notes=$(cat "$tmp/train.log" "$tmp/restore.log" "$tmp"/export-*.log 2>/dev/null |
    grep -E ' (WARN|ERROR) ' | sed -E 's/^(\[[a-z]+ ?[0-9]*\]) [0-9:.]+ /\1 /; s/[0-9]+/N/g' |
    sort | uniq -c | sort -rn | head -8)
dead=$(cat "$tmp/train.log" "$tmp/restore.log" 2>/dev/null | grep -c 'declared dead')

# ---- the table ----
awk -v reps="$REPS" -v mb="$mb" -v params="$PARAMS" -v warm="$WARM" -v gap="$GAP" \
    -v train_rc="$train_rc" -v restore_rc="$restore_rc" -v load0="$load0" \
    -v load1="$(cut -d' ' -f1-3 /proc/loadavg)" -v secs="$(($(date +%s) - tstart))" \
    -v dead="$dead" -v dead_ms="${CHAINPS_DEAD_AFTER_MS:-default}" -v req_ms="${CHAINPS_REQUEST_TIMEOUT_MS:-default}" -v tmp="$tmp" -v repl="$REPLICAS" '
function med(a, n,    i, j, t, b) {
    if (n == 0) return -1
    for (i = 1; i <= n; i++) b[i] = a[i]
    for (i = 2; i <= n; i++) for (j = i; j > 1 && b[j - 1] > b[j]; j--) { t = b[j]; b[j] = b[j - 1]; b[j - 1] = t }
    return n % 2 ? b[(n + 1) / 2] : (b[n / 2] + b[n / 2 + 1]) / 2
}
function tods(s,    p) { split(s, p, ":"); return p[1] * 3600 + p[2] * 60 + p[3] }
function f1(x) { return x < 0 ? "-" : sprintf("%.1f", x) }
function f2(x) { return x < 0 ? "-" : sprintf("%.2f", x) }
function ratio(a, b) { return (a > 0 && b > 0) ? sprintf("%.2f", a / b) : "-" }
FILENAME ~ /results.txt$/ {
    if ($1 == "dd") dd[++ndd] = $3
    if ($1 == "export") { r = $2; ex_step[r] = $3; ex_mb[r] = $4; ex_s[r] = $5; ok[r] = 1 }
    if ($1 == "exportfail") fails++
    if ($1 == "restore") { rs_step = $2; rs_mb = $3; rs_s = $4; rs_cached = $5 }
    if ($1 == "crc") { crc_want = $2; crc_got = $3; crc_step = $4 }
    next
}
FILENAME ~ /windows.txt$/ { r = $2; w0[r] = $3; w1[r] = $4; d0[r] = tods($5); d1[r] = tods($6); nw = r; next }
FILENAME ~ /train.log$/ {
    # servers: "range R: checkpoint read view ID opened at step S, ..." (UTC time of day)
    if ($0 ~ /checkpoint read view [0-9]+ opened/ &&
        match($0, /[0-9][0-9]:[0-9][0-9]:[0-9][0-9]\.[0-9]+/))
        opened[++nop] = tods(substr($0, RSTART, RLENGTH))
    next
}
FILENAME ~ /steps.txt$/ {
    s = $1; e = $2; d = $3
    if (s <= warm) { nwarm++; next }
    hit = 0
    for (r = 1; r <= nw; r++) if (e - d < w1[r] && e > w0[r]) hit = 1
    if (hit) dur_ex[++nex] = d; else dur_no[++nno] = d
    next
}
FILENAME ~ /rss.txt$/ {
    # phase role pid anon_kB file_kB: sum over the servers per sample (one sample = one pid set)
    key = $1
    if ($2 == "server") {
        sa[key, ++ns[key]] = $4; sf[key, ns[key]] = $5
        if ($4 > pan[key]) pan[key] = $4
        if ($4 + $5 > ptot[key]) ptot[key] = $4 + $5
    } else if ($2 == "worker") {
        if ($4 > wan[key]) wan[key] = $4
    }
    next
}
END {
    ddm = med(dd, ndd)
    line = "----------------------------------------------------------------------------------------------------------"
    printf "%s\n", line
    printf "raw disk: dd if=/dev/zero bs=4M count=100 conv=fsync (419 MB) in the export directory, %d runs: ", ndd
    for (i = 1; i <= ndd; i++) printf "%s%.1f", (i > 1 ? ", " : ""), dd[i]
    printf " MB/s; median %.1f MB/s\n", ddm
    printf "%s\n", line
    printf "export (chainps checkpoint export, training running)    |            write phase (read views open -> file renamed)\n"
    printf "%4s %8s %8s %9s %8s %8s | %9s %8s %8s %8s\n", "rep", "at step", "MB", "export s",
           "MB/s", "/dd", "cut wait s", "write s", "MB/s", "/dd"
    n = 0
    for (r = 1; r <= nw; r++) {
        if (!ok[r]) { printf "%4d   FAILED (see export-%d.log)\n", r, r; continue }
        mbps = ex_mb[r] / ex_s[r]
        # the last "opened" line inside this export: the moment the cut was complete
        cut = -1
        for (i = 1; i <= nop; i++) if (opened[i] >= d0[r] - 0.01 && opened[i] <= d1[r] + 0.01) cut = opened[i]
        wait_s = cut >= 0 ? cut - d0[r] : -1
        wr_s = cut >= 0 ? ex_s[r] - wait_s : -1
        wmbps = wr_s > 0 ? ex_mb[r] / wr_s : -1
        printf "%4d %8d %8.1f %9.2f %8.1f %8s | %9s %8s %8s %8s\n", r, ex_step[r], ex_mb[r],
               ex_s[r], mbps, ratio(mbps, ddm), f2(wait_s), f2(wr_s), f1(wmbps), ratio(wmbps, ddm)
        n++; e_mbps[n] = mbps; e_s[n] = ex_s[r]; e_w[n] = wait_s; e_wr[n] = wr_s; e_wm[n] = wmbps
    }
    if (n > 0) {
        m = med(e_mbps, n); wm = med(e_wm, n)
        printf "%4s %8s %8s %9.2f %8.1f %8s | %9s %8s %8s %8s\n", "med", "", "", med(e_s, n), m,
               ratio(m, ddm), f2(med(e_w, n)), f2(med(e_wr, n)), f1(wm), ratio(wm, ddm)
    }
    printf "%s\n", line
    if (rs_s > 0) {
        rm_ = rs_mb / rs_s
        printf "restore (chainps launch --restore-from, 2 servers, chains of %s; file pages in cache before: %s B):\n", repl, rs_cached
        printf "     %8.1f MB at step %d in %.2f s = %.1f MB/s (%s x dd write); values after restore: crc32 %s, checkpoint says %s: %s\n",
               rs_mb, rs_step, rs_s, rm_, ratio(rm_, ddm), crc_got, crc_want,
               (crc_got == crc_want && crc_got != "none") ? "match" : "MISMATCH"
    } else {
        printf "restore: FAILED or not run (launch exit %s; see restore.log)\n", restore_rc
    }
    printf "%s\n", line
    mn = med(dur_no, nno); mx = med(dur_ex, nex)
    printf "training step (cps_push_pull of %d float32, sync, 1 worker), median duration:\n", params
    printf "     without an export: %8.1f ms (%d steps)    overlapping an export: %8.1f ms (%d steps)    ratio %s\n",
           mn, nno, mx, nex, ratio(mx, mn)
    printf "     (first %d steps not counted: warm-up; %d export(s), %d steps at least between them)\n", warm, nw, gap
    printf "%s\n", line
    printf "peak RSS, MB (anon = heap; file = LMDB pages mapped):  servers (largest one)   worker\n"
    split("warm train export stop restore", ph, " ")
    for (i = 1; i <= 5; i++) {
        k = ph[i]
        if (!(k in ptot) && !(k in wan)) continue
        printf "     %-8s anon %7.0f  anon+file %7.0f          anon %7.0f\n", k, pan[k] / 1024,
               ptot[k] / 1024, wan[k] / 1024
    }
    printf "%s\n", line
    printf "exports failed: %d of %d; training job exit %s; restore job exit %s; \"declared dead\" in the logs: %d (CHAINPS_DEAD_AFTER_MS=%s, CHAINPS_REQUEST_TIMEOUT_MS=%s)\n",
           fails + 0, reps, train_rc, restore_rc, dead, dead_ms, req_ms
    printf "bench run took %d s; load average %s at start, %s at end\n", secs, load0, load1
}' "$tmp/results.txt" "$tmp/windows.txt" "$tmp/train.log" "$tmp/steps.txt" "$tmp/rss.txt"
if [ -n "$notes" ]; then
    echo "warnings/errors in the logs (count, numbers replaced by N):"
    echo "$notes"
fi
[ "$train_rc" = 0 ] && [ "$restore_rc" = 0 ]
