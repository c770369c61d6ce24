#!/usr/bin/env bash
# Catch-up of a restarted server, and what it costs the pushes meanwhile (project issue 5).
#
#   bench/run_catchup.sh [BUILD_DIR]      (default: build-bench beside this folder's parent)
#
# RUNS times (default 3), on 127.0.0.1 only:
#   - a fresh cluster: `chainps scheduler` (S=3 servers, 1 worker, async, --replicas 3, so
#     3 ranges and every server holds every range) and three `chainps server --rank i`, each
#     started here so its PID is known, each on a fresh data dir;
#   - bench_catchup as the worker (CHAINPS_ROLE=worker, ...): it declares the model (TENSORS x
#     TENSOR_MB MB of float32, default 100 x 4 = 400 MB, optimizer OPTIM = sgd, or adam for 3x
#     the bytes), then pushes a 1 MB tensor (PUSH_KB) in a steady loop with DEPTH (4) pushes in
#     flight and records when each was acknowledged;
#   - once the load runs: BEFORE_S (4) s later SIGKILL the server of rank 0; wait for the
#     scheduler to declare it dead; GAP_S (1) s later restart it (`chainps server --data SAME
#     --rank 0`); wait (at most CATCHUP_LIMIT_S, 240) until the scheduler has logged "server N
#     joined range R as its tail" for every range; AFTER_S (4) s later tell the worker to stop
#     (a stop file); it checks exactly-once on the load tensor and writes its ack times;
#   - every process is ended by its PID: the job ends by itself when the worker is done; whoever
#     is left after 2 s gets SIGTERM, then SIGKILL (reported: a product bug if not 0). The worker
#     runs under `timeout -s KILL` (WORKER_LIMIT_S, 600).
# Then, from the logs (server lines carry UTC wall-clock times to the ms) and the worker's ack
# times: the catch-up time (restart -> last "joined range", and first JOIN_RANGE -> last "joined
# range"), the MB the joiner installed and so MB/s, the tails' per-range "snapshot ... MB/s"
# lines, and the push throughput in four windows: before the kill ([kill - BEFORE_S + 0.5,
# kill)), degraded (chains of 2: [declared dead, restart)), during the catch-up ([restart, last
# joined)) and after ([last joined + 0.5, last joined + AFTER_S)). Medians over the runs.
# KEEP=1 keeps the raw results and logs.
set -u

here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build-bench}
build=$(cd "$build" && pwd) || exit 2
CHAINPS=$build/chainps
BENCH=$build/bench/bench_catchup
for b in "$CHAINPS" "$BENCH"; do
    [ -x "$b" ] || { echo "run_catchup: $b not built" >&2; exit 2; }
done
RUNS=${RUNS:-3}
TENSORS=${TENSORS:-100}
TENSOR_MB=${TENSOR_MB:-4}
OPTIM=${OPTIM:-sgd}
PUSH_KB=${PUSH_KB:-1024}
DEPTH=${DEPTH:-4}
BEFORE_S=${BEFORE_S:-4}
GAP_S=${GAP_S:-1}
AFTER_S=${AFTER_S:-4}
CATCHUP_LIMIT_S=${CATCHUP_LIMIT_S:-240}
# Failure detection: the loopback defaults (100/400) declare live servers dead on a loaded 2-core
# machine (a server writing a 400 MB model can be silent for > 400 ms); this benchmark is about
# the copy, not the detection, so it allows 5 s of silence (2 s was not enough here).
export CHAINPS_HEARTBEAT_MS=${HB_MS:-100} CHAINPS_DEAD_AFTER_MS=${DEAD_MS:-5000}
WORKER_LIMIT_S=${WORKER_LIMIT_S:-600}
S=3
R=3

res=$(mktemp "${TMPDIR:-/tmp}/chainps-catchup-XXXXXX")
work=$(mktemp -d "${TMPDIR:-/tmp}/chainps-catchup-XXXXXX")
# shellcheck source=lib.sh
. "$here/lib.sh"
bench_procs
bench_report "" "$@"

# wait_for FILE REGEX SECONDS [COUNT] [PID] [FROM]: until FILE has COUNT (1) lines matching REGEX
# from its line FROM (1) on; gives up after SECONDS or when PID (if given) is gone.
wait_for() {
    local f=$1 re=$2 limit=$3 count=${4:-1} pid=${5:-} from=${6:-1} i
    for i in $(seq $((limit * 20))); do
        [ "$(tail -n "+$from" "$f" 2>/dev/null | grep -cE "$re")" -ge "$count" ] && return 0
        [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null && return 1
        sleep 0.05
    done
    return 1
}

stamp() { date +%s.%N; }

# One run. Its stderr goes to a log (bash reports the SIGKILLed server there when it is reaped);
# messages for the user go to fd 3.
one_run() {
    d=$work/run-$run
    mkdir -p "$d"
    port=$(free_port)
    "$CHAINPS" scheduler --servers "$S" --workers 1 --mode async --replicas "$R" \
        --port "$port" --bind 127.0.0.1 --join-timeout 30 >"$d/scheduler.log" 2>&1 &
    pids+=($!)
    spid=()
    for i in $(seq 0 $((S - 1))); do
        "$CHAINPS" server --scheduler "127.0.0.1:$port" --data "$d/data-$i" --rank "$i" \
            --bind 127.0.0.1 --advertise 127.0.0.1 --join-timeout 30 >"$d/server-$i.log" 2>&1 &
        spid+=($!)
        pids+=($!)
    done
    CHAINPS_ROLE=worker CHAINPS_SCHEDULER=127.0.0.1:$port CHAINPS_NUM_SERVERS=$S \
        CHAINPS_NUM_WORKERS=1 CHAINPS_ADVERTISE=127.0.0.1 \
        timeout -s KILL "$WORKER_LIMIT_S" "$BENCH" --tensors "$TENSORS" --tensor-mb "$TENSOR_MB" \
        --optim "$OPTIM" --push-kb "$PUSH_KB" --depth "$DEPTH" --stop-file "$d/stop" \
        --out "$d/acks.txt" >"$d/worker.out" 2>"$d/worker.log" &
    wpid=$!
    pids+=($wpid)
    status=ok
    t_kill=0 t_restart=0
    if ! wait_for "$d/worker.out" "load running" "$WORKER_LIMIT_S" 1 "$wpid"; then
        status=no-load
    else
        sleep "$BEFORE_S"
        du_mb=$(du -sm "$d/data-0" | cut -f1)
        from=$(($(wc -l <"$d/scheduler.log") + 1))
        t_kill=$(stamp)
        kill -KILL "${spid[0]}"
        reap "${spid[0]}"
        if ! wait_for "$d/scheduler.log" "\(rank 0\) silent for .* declared dead" 20 1 "" "$from"; then
            status=not-declared-dead
        else
            sleep "$GAP_S"
            from=$(($(wc -l <"$d/scheduler.log") + 1))
            t_restart=$(stamp)
            "$CHAINPS" server --scheduler "127.0.0.1:$port" --data "$d/data-0" --rank 0 \
                --bind 127.0.0.1 --advertise 127.0.0.1 --join-timeout 30 \
                >"$d/server-0-restarted.log" 2>&1 &
            pids+=($!)
            if ! wait_for "$d/scheduler.log" "joined range [0-9]+ as its tail" "$CATCHUP_LIMIT_S" \
                "$R" "$wpid" "$from"; then
                status=not-caught-up
            else
                sleep "$AFTER_S"
            fi
        fi
    fi
    touch "$d/stop"
    { wait "$wpid"; } 2>/dev/null
    rc=$?
    echo "meta run=$run rc=$rc status=$status kill=$t_kill restart=$t_restart" \
        "data0_mb=${du_mb:-0} dir=$d" >>"$res"
    stop_all
    # Everything the table needs from this run's logs, as key=value lines in $res.
    awk -v run="$run" -v R="$R" -v tk="$t_kill" -v tr="$t_restart" -v before="$BEFORE_S" \
        -v after="$AFTER_S" -v pushkb="$PUSH_KB" '
function epoch(hms,    a, t) {   # "HH:MM:SS.mmm" (UTC) -> epoch seconds near the kill
    split(hms, a, /[:.]/)
    t = int(tk / 86400) * 86400 + a[1] * 3600 + a[2] * 60 + a[3] + a[4] / 1000
    if (t - tk > 43200) t -= 86400
    if (tk - t > 43200) t += 86400
    return t
}
function sortn(arr, n,    i, j, t) {
    for (i = 2; i <= n; i++) { t = arr[i]; for (j = i - 1; j >= 1 && arr[j] > t; j--) arr[j + 1] = arr[j]; arr[j + 1] = t }
}
function win(name, a, b,    i, n, lat, m, gap, prev) {
    n = 0; m = 0; gap = 0; prev = a
    for (i = 1; i <= na; i++) {
        if (done[i] < a || done[i] >= b) continue
        n++; lat[++m] = (done[i] - st[i]) * 1e3
        if (done[i] - prev > gap) gap = done[i] - prev
        prev = done[i]
    }
    if (b - prev > gap) gap = b - prev
    sortn(lat, m)
    printf " %s_mbs=%.1f %s_p50ms=%.1f %s_gapms=%.0f %s_s=%.2f", name,
           (b > a ? n * pushkb * 1024 / 1e6 / (b - a) : 0), name, m ? lat[int((m + 1) / 2)] : 0,
           name, gap * 1e3, name, b - a
}
FILENAME ~ /restarted.log$/ && /joined as node [0-9]+/ { match($0, /joined as node [0-9]+/); jid = substr($0, RSTART + 15, RLENGTH - 15) }
FILENAME ~ /scheduler.log$/ && /\(rank 0\) silent for .* declared dead/ { t = epoch($1); if (t >= tk && !dead) dead = t }
FILENAME ~ /scheduler.log$/ && /silent for .* declared dead/ && !/\(rank 0\)/ { falsedead++ }
FILENAME ~ /scheduler.log$/ && /copies it from the tail/ { t = epoch($1); if (t >= tr && (!join0 || t < join0)) join0 = t }
FILENAME ~ /scheduler.log$/ && /joined range [0-9]+ as its tail/ && $0 ~ ("server " jid " joined") {
    t = epoch($1)
    if (t >= tr) {
        if (t > last) last = t
        joined++
        match($0, /joined range [0-9]+/); rr = substr($0, RSTART + 13, RLENGTH - 13)
        if (!(rr in failed) && t > oklast) oklast = t
    }
}
FILENAME ~ /scheduler.log$/ && /came back|joined from/ { t = epoch($1); if (t >= tr && !hello) hello = t }
FILENAME ~ /restarted.log$/ && /joining failed/ { match($0, /range [0-9]+:/); failed[substr($0, RSTART + 6, RLENGTH - 7)] = 1; nfailed++ }
FILENAME ~ /restarted.log$/ && /installed \(/ && epoch($1) >= tr {
    match($0, /range [0-9]+:/); rr = substr($0, RSTART + 6, RLENGTH - 7)
    x = substr($0, index($0, "installed (") + 11) + 0; mb += x
    if (!(rr in failed)) okmb += x
}
FILENAME ~ /server-[0-9].log$/ && /snapshot at seq .* sent to node/ && epoch($1) >= tr &&
    $0 ~ ("sent to node " jid ":") {
    match($0, /range [0-9]+:/); r = substr($0, RSTART + 6, RLENGTH - 7)
    match($0, /[0-9]+ records, [0-9.]+ MB in [0-9]+ ms \([0-9]+ MB\/s\)/)
    split(substr($0, RSTART, RLENGTH), f, /[ (]+/)
    printf "snap run=%s range=%s records=%s mb=%s ms=%s mbs=%s\n", run, r, f[1], f[3], f[6], f[8]
}
FILENAME ~ /acks.txt$/ && $1 == "info" { info = $0; sub(/^info /, "", info) }
FILENAME ~ /acks.txt$/ && $1 == "ack" { st[++na] = $2; done[na] = $3 }
END {
    if (!tk || !last || joined < R) { printf "cu run=%s complete=no %s\n", run, info; exit }
    printf "cu run=%s complete=yes %s falsedead=%d joined=%d copied_mb=%.1f hello_s=%.3f join_s=%.3f", run, info,
           falsedead, joined, mb, hello ? hello - tr : -1, join0 ? join0 - tr : -1
    printf " failed_joins=%d ok_mb=%.1f ok_join_to_joined_s=%.3f", nfailed, okmb, join0 && oklast ? oklast - join0 : -1
    printf " restart_to_joined_s=%.3f join_to_joined_s=%.3f detect_s=%.3f", last - tr,
           join0 ? last - join0 : -1, dead - tk
    win("before", tk - before + 0.5, tk)
    win("degraded", dead, tr)
    win("during", tr, last)
    if (join0) win("copy", join0, last)
    win("after", last + 0.5, last + after)
    printf "\n"
}' "$d/server-0-restarted.log" "$d/scheduler.log" "$d"/server-[0-9].log "$d/acks.txt" \
        >>"$res" 2>>"$work/awk.log"
    if [ "$rc" != 0 ] || [ "$status" != ok ]; then
        fails=$((fails + 1))
        echo
        echo "run_catchup: run $run: worker exited $rc, $status; worker output:" >&3
        tail -5 "$d/worker.out" "$d/worker.log" >&3
        KEEP=1
    fi
    if [ "$run" = 1 ]; then
        grep -hE "declared dead|copies it from the tail|joined range|range [0-9]+: [0-9]+ ->" \
            "$d/scheduler.log" | sed -n '1,40p' >"$work/first-scheduler.txt"
        grep -hE "snapshot at seq|installed \(" "$d"/server-*.log >"$work/first-transfer.txt"
        head -1 "$d/worker.out" >"$work/first-model.txt"
    fi
    [ "${KEEP:-0}" = 1 ] || rm -rf "$d"
}

exec 3>&2
start=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "chainps catch-up benchmark on $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load average $load0"
echo "each run: fresh scheduler + $S servers (chains of $R, async) + 1 worker; model $TENSORS x" \
    "$TENSOR_MB MB ($OPTIM); load: $PUSH_KB KB pushes, $DEPTH in flight; SIGKILL server rank 0" \
    "$BEFORE_S s into the load, restart it ${GAP_S} s after it is declared dead"
printf "runs: "
fails=0
for run in $(seq "$RUNS"); do
    one_run 2>>"$work/shell.log"
    printf "."
done
echo

if [ "$signalled" != 0 ]; then
    echo
    echo "Processes that had to be signalled after their job ended (should be 0):" \
        "$(grep -c . "$work/stop.log") signals; by program:"
    sed -E 's/^left after the job: pid [0-9]+ \(([^ ]+ [^ ]+).*\): (SIG[A-Z]+)$/\1 \2/' \
        "$work/stop.log" | sed "s|$build/||" | sort | uniq -c | sed 's/^/  /'
fi
if [ -s "$work/first-scheduler.txt" ]; then
    echo
    echo "First run: $(sed 's/^bench_catchup: //' "$work/first-model.txt")"
    echo "scheduler and transfer log lines of the first run:"
    sed 's/^/  /' "$work/first-scheduler.txt" "$work/first-transfer.txt"
fi

awk -v secs="$(($(date +%s) - start))" -v load0="$load0" -v load1="$(cut -d' ' -f1-3 /proc/loadavg)" \
    -v cores="$(nproc)" -v before="$BEFORE_S" -v after="$AFTER_S" '
function kv(    i, p) {
    delete f
    for (i = 2; i <= NF; i++) {
        p = index($i, "=")
        if (p) f[substr($i, 1, p - 1)] = substr($i, p + 1)
    }
}
function sortn(arr, n,    i, j, t) {
    for (i = 2; i <= n; i++) { t = arr[i]; for (j = i - 1; j >= 1 && arr[j] > t; j--) arr[j + 1] = arr[j]; arr[j + 1] = t }
}
function med(key,    i, n, a) {
    n = 0
    for (i = 1; i <= nr; i++) if ((runs[i], key) in v && v[runs[i], key] != "") a[++n] = v[runs[i], key] + 0
    if (!n) return "-"
    sortn(a, n)
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
$1 == "cu" { kv(); r = f["run"]; runs[++nr] = r; for (k in f) v[r, k] = f[k] }
$1 == "meta" { kv(); rcs[f["run"]] = f["rc"] " " f["status"] }
$1 == "snap" { kv(); r = f["run"]; snap[r] = snap[r] sprintf("%s%.0f", snap[r] == "" ? "" : "/", f["mbs"])
               v[r, "snapmbs" f["range"]] = f["mbs"]; v[r, "snapmb"] += f["mb"]; if (f["ms"] > v[r, "snapms"]) v[r, "snapms"] = f["ms"]
               if (!(f["range"] in rg)) { rg[f["range"]] = 1; ranges = ranges (ranges == "" ? "" : " ") f["range"] } }
END {
    printf "\nCatch-up of a restarted server (rank 0, killed and restarted with its data), 3 servers, chains of 3,\n"
    printf "async, 127.0.0.1; MB = 10^6 bytes. restart: the new process started; JOIN: the scheduler sent the\n"
    printf "first JOIN_RANGE (log); joined: the last \"joined range R as its tail\" (log). copied: MB the joiner\n"
    printf "installed (its log); snapshot: per-range MB/s the tails logged (thread start -> last chunk queued)\n\n"
    hdr = sprintf("%-6s | %7s %7s | %6s %6s %7s | %8s %8s %8s | %-17s | %5s %s",
                  "run", "model", "copied", "r->JOIN", "J->jnd", "r->jnd", "MB/s r", "MB/s J", "MB/s 1st", "snapshot MB/s", "exact", "status")
    print hdr; gsub(/./, "-", hdr); print hdr
    for (i = 1; i <= nr; i++) {
        r = runs[i]
        if (v[r, "complete"] != "yes") { printf "%-6s | incomplete (%s)\n", r, rcs[r]; continue }
        v[r, "rate_r"] = v[r, "copied_mb"] / v[r, "restart_to_joined_s"]
        v[r, "rate_j"] = v[r, "join_to_joined_s"] > 0 ? v[r, "copied_mb"] / v[r, "join_to_joined_s"] : ""
        v[r, "rate_ok"] = v[r, "ok_join_to_joined_s"] > 0 ? v[r, "ok_mb"] / v[r, "ok_join_to_joined_s"] : ""
        printf "%-6s | %7.1f %7.1f | %6.2fs %5.2fs %6.2fs | %8.0f %8.0f %8.0f | %-17s | %5s %s\n", r, v[r, "state_mb"],
               v[r, "copied_mb"], v[r, "join_s"], v[r, "join_to_joined_s"], v[r, "restart_to_joined_s"],
               v[r, "rate_r"], v[r, "rate_j"], v[r, "rate_ok"], snap[r], v[r, "exact"],
               rcs[r] (v[r, "falsedead"] > 0 ? "; " v[r, "falsedead"] " live server(s) declared dead" : "")
               (v[r, "failed_joins"] > 0 ? "; " v[r, "failed_joins"] " join(s) failed on the joiner" : "")
    }
    sm = ""
    n = split(ranges, rl, " ")
    for (k = 1; k <= n; k++) { x = med("snapmbs" rl[k]); sm = sm (k > 1 ? "/" : "") (x == "-" ? "-" : sprintf("%.0f", x)) }
    printf "%-6s | %7.1f %7.1f | %6.2fs %5.2fs %6.2fs | %8.0f %8.0f %8.0f | %-17s |\n", "median", med("state_mb"),
           med("copied_mb"), med("join_s"), med("join_to_joined_s"), med("restart_to_joined_s"), med("rate_r"),
           med("rate_j"), med("rate_ok"), sm
    printf "(MB/s 1st: MB of the ranges joined at the first attempt / (JOIN -> the last of them joined); a range\n"
    printf " whose join failed on the joiner is retried only when the scheduler gives up on it, 120 s later)\n"
    printf "(snapshot MB/s listed per range %s; the 3 ranges are copied at the same time, each from its own tail)\n", ranges

    printf "\nPush throughput of the steady load (MB/s of acknowledged pushes; p50: push latency in ms; gap: longest\n"
    printf "time without an acknowledgement in the window, ms). before: [kill-%.1fs, kill); degraded: chains of 2,\n", before - 0.5
    printf "[declared dead, restart); during: [restart, joined); copy: [JOIN, joined); after: [joined+0.5s, joined+%ds)\n\n", after
    hdr = sprintf("%-6s | %7s %5s | %8s %5s | %7s %5s %5s | %7s %5s | %7s %5s | %6s %6s",
                  "run", "before", "p50", "degraded", "p50", "during", "p50", "gap", "copy", "p50", "after", "p50", "dur/bef", "aft/bef")
    print hdr; gsub(/./, "-", hdr); print hdr
    for (i = 1; i <= nr; i++) {
        r = runs[i]
        if (v[r, "complete"] != "yes") continue
        v[r, "ratio_d"] = v[r, "before_mbs"] > 0 ? v[r, "during_mbs"] / v[r, "before_mbs"] : ""
        v[r, "ratio_a"] = v[r, "before_mbs"] > 0 ? v[r, "after_mbs"] / v[r, "before_mbs"] : ""
        printf "%-6s | %7.0f %5.1f | %8.0f %5.1f | %7.0f %5.1f %5.0f | %7.0f %5.1f | %7.0f %5.1f | %6.2f %6.2f\n", r,
               v[r, "before_mbs"], v[r, "before_p50ms"], v[r, "degraded_mbs"], v[r, "degraded_p50ms"],
               v[r, "during_mbs"], v[r, "during_p50ms"], v[r, "during_gapms"], v[r, "copy_mbs"], v[r, "copy_p50ms"],
               v[r, "after_mbs"], v[r, "after_p50ms"], v[r, "ratio_d"], v[r, "ratio_a"]
    }
    printf "%-6s | %7.0f %5.1f | %8.0f %5.1f | %7.0f %5.1f %5.0f | %7.0f %5.1f | %7.0f %5.1f | %6.2f %6.2f\n", "median",
           med("before_mbs"), med("before_p50ms"), med("degraded_mbs"), med("degraded_p50ms"), med("during_mbs"),
           med("during_p50ms"), med("during_gapms"), med("copy_mbs"), med("copy_p50ms"), med("after_mbs"),
           med("after_p50ms"), med("ratio_d"), med("ratio_a")
    printf "\nAlso per run: detection (kill -> declared dead) median %.2f s; model declare median %.1f s; retries %s.\n",
           med("detect_s"), med("declare_s"), med("retries")
    printf "Run took %d s; load average %s at start, %s at end (%d cores).\n", secs, load0, load1, cores
}' "$res"
[ "$fails" = 0 ]
