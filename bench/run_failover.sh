#!/usr/bin/env bash
# Failover time when the head of a chain is SIGKILLed (project issue 5).
#
#   bench/run_failover.sh [BUILD_DIR]     (default: build-bench beside this folder's parent)
#
# For each heartbeat setting (SETTINGS, default "100/2000 100/400": CHAINPS_HEARTBEAT_MS /
# CHAINPS_DEAD_AFTER_MS, exported to every process), RUNS times (default 30), on 127.0.0.1:
#   - a fresh cluster: `chainps scheduler` (3 servers, 1 worker, async, --replicas 3) and three
#     `chainps server --rank i`, each started here so its PID is known, each on a fresh data dir;
#   - bench_failover as the worker (CHAINPS_ROLE=worker, CHAINPS_SCHEDULER=127.0.0.1:PORT, ...):
#     it pushes a table spanning every key range in a loop, SIGKILLs the server of rank 0 after
#     KILL_AFTER_MS (1000) + a random 0..heartbeat ms (so the kill lands anywhere in the phase of
#     the victim's heartbeats) and measures the time from the kill to the acknowledgement of the first
#     push started after it; it then checks exactly-once on the pulled values;
#   - before the kill, `chainps status` confirms that the victim heads a range (the first run's
#     status before and after the failover is printed);
#   - every process is ended by its PID: the job should end by itself when the worker is done;
#     whoever is left after 2 s gets SIGTERM, then SIGKILL (counted and reported: a product
#     bug if not 0); each run is bounded (worker: 30 s, under `timeout`).
# Then one table: p50 / p99 / max failover time and longest stall per setting, and when the
# worker installed the new view (from its log), which splits the failover into detection + view
# change and re-sent pushes. KEEP=1 keeps the raw results and logs.
set -u

here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build-bench}
build=$(cd "$build" && pwd) || exit 2
CHAINPS=$build/chainps
BENCH_FO=$build/bench/bench_failover
for b in "$CHAINPS" "$BENCH_FO"; do
    [ -x "$b" ] || { echo "run_failover: $b not built" >&2; exit 2; }
done
RUNS=${RUNS:-30}
SETTINGS=${SETTINGS:-100/2000 100/400}
KILL_AFTER_MS=${KILL_AFTER_MS:-1000}
S=3

res=$(mktemp "${TMPDIR:-/tmp}/chainps-failover-XXXXXX")
work=$(mktemp -d "${TMPDIR:-/tmp}/chainps-failover-XXXXXX")
# shellcheck source=lib.sh
. "$here/lib.sh"
bench_procs
bench_report "" "$@"

# Node id of the server with rank 0, and whether it heads a range, from `chainps status`.
victim_heads() {
    awk '$2 == "server" && $3 == "0" { id = $1 }
         /^ranges:/ { inr = 1; next }
         inr && NF >= 3 && $3 == id && $1 ~ /^[0-9]+$/ { head = 1 }
         END { exit !(id != "" && head) }' "$1"
}

# One run: a fresh cluster, the worker that kills rank 0, then everything ended by its PID. Its
# stderr goes to a log (bash reports the SIGKILLed server there when it is reaped); messages for
# the user go to fd 3.
one_run() {
    d=$work/$hb-$dead-$run
    mkdir -p "$d"
    port=$(free_port)
    "$CHAINPS" scheduler --servers "$S" --workers 1 --mode async --replicas 3 \
        --port "$port" --bind 127.0.0.1 --join-timeout 20 >"$d/scheduler.log" 2>&1 &
    pids+=($!)
    spid=()
    for i in $(seq 0 $((S - 1))); do
        "$CHAINPS" server --scheduler "127.0.0.1:$port" --data "$d/data-$i" --rank "$i" \
            --bind 127.0.0.1 --advertise 127.0.0.1 --join-timeout 20 >"$d/server-$i.log" 2>&1 &
        spid+=($!)
        pids+=($!)
    done
    CHAINPS_ROLE=worker CHAINPS_SCHEDULER=127.0.0.1:$port CHAINPS_NUM_SERVERS=$S \
        CHAINPS_NUM_WORKERS=1 CHAINPS_ADVERTISE=127.0.0.1 \
        timeout -s KILL 30 "$BENCH_FO" --kill-pid "${spid[0]}" \
        --kill-after-ms "$KILL_AFTER_MS" --kill-jitter-ms "$hb" --out "$res" --tag "run=$run" \
        >"$d/worker.out" 2>"$d/worker.log" &
    wpid=$!
    pids+=($wpid)
    # Before the kill: the victim (rank 0) must head a range the table lives in (all ranges).
    checked=no
    for _ in $(seq 100); do
        if grep -q "killing pid" "$d/worker.out" 2>/dev/null; then
            "$CHAINPS" status --scheduler "127.0.0.1:$port" >"$d/status-before.txt" 2>&1
            victim_heads "$d/status-before.txt" && checked=yes
            break
        fi
        kill -0 "$wpid" 2>/dev/null || break
        sleep 0.05
    done
    if [ "$run" = 1 ]; then
        # The view after the failover, while the worker keeps pushing.
        for _ in $(seq 100); do
            grep -q "view epoch .* installed" "$d/worker.log" 2>/dev/null && break
            kill -0 "$wpid" 2>/dev/null || break
            sleep 0.05
        done
        "$CHAINPS" status --scheduler "127.0.0.1:$port" >"$d/status-after.txt" 2>&1
    fi
    { wait "$wpid"; } 2>/dev/null
    rc=$?
    # Wall-clock time the worker installed the first new view (its log), for the breakdown.
    vt=$(grep -m1 -oE '[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3} .*view epoch [0-9]+ installed' \
        "$d/worker.log" | cut -d' ' -f1)
    dl=$(grep -m1 -oE 'silent for [0-9]+ ms: declared dead' "$d/scheduler.log" |
        grep -oE '[0-9]+' | head -1)
    echo "meta hb=$hb dead=$dead run=$run rc=$rc victim_head=$checked view_wall=${vt:-none}" \
        "silence_ms=${dl:-none}" >>"$res"
    stop_all
    if [ "$rc" != 0 ]; then
        fails=$((fails + 1))
        echo
        echo "run_failover: run $run ($hb/$dead) exited $rc; worker output:" >&3
        tail -5 "$d/worker.out" "$d/worker.log" >&3
        KEEP=1
    fi
    if [ "$run" = 1 ] && [ "$setting" = "${SETTINGS%% *}" ]; then
        cp "$d/status-before.txt" "$work/first-status-before.txt" 2>/dev/null
        cp "$d/status-after.txt" "$work/first-status-after.txt" 2>/dev/null
    fi
    [ "${KEEP:-0}" = 1 ] || rm -rf "$d"
}

exec 3>&2
start=$(date +%s)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "chainps failover benchmark on $(nproc) cores, $(date -u '+%Y-%m-%d %H:%M UTC'), load average $load0"
echo "each run: fresh scheduler + $S servers (chains of 3, async) + 1 worker pushing $S x 4 KB;" \
    "SIGKILL server rank 0 after $KILL_AFTER_MS ms + U(0, heartbeat)"

fails=0
for setting in $SETTINGS; do
    hb=${setting%/*}
    dead=${setting#*/}
    export CHAINPS_HEARTBEAT_MS=$hb CHAINPS_DEAD_AFTER_MS=$dead
    printf "heartbeat %s ms, dead after %s ms: " "$hb" "$dead"
    for run in $(seq "$RUNS"); do
        one_run 2>>"$work/shell.log"
        printf "."
    done
    echo
done
unset CHAINPS_HEARTBEAT_MS CHAINPS_DEAD_AFTER_MS

if [ "$signalled" != 0 ]; then
    echo
    echo "Processes that had to be signalled after their job ended (should be 0):" \
        "$(grep -c . "$work/stop.log") signals; by program:"
    sed -E 's/^left after the job: pid [0-9]+ \(([^ ]+ [^ ]+).*\): (SIG[A-Z]+)$/\1 \2/' \
        "$work/stop.log" | sed "s|$build/||" | sort | uniq -c | sed 's/^/  /'
fi

for w in before after; do
    f=$work/first-status-$w.txt
    if [ -f "$f" ]; then
        echo
        echo "chainps status $w the failover (first run, ${SETTINGS%% *}): rank 0 is the victim"
        sed -n '/^job:/p; /^nodes:/,/^$/p; /^ranges:/,/^$/p' "$f" | sed 's/^/  /'
    fi
done

awk -v runs="$RUNS" -v secs="$(($(date +%s) - start))" -v load0="$load0" \
    -v load1="$(cut -d' ' -f1-3 /proc/loadavg)" -v cores="$(nproc)" '
function kv(    i, p) {
    delete f
    for (i = 2; i <= NF; i++) {
        p = index($i, "=")
        if (p) f[substr($i, 1, p - 1)] = substr($i, p + 1)
    }
}
function ms_of_day(s,    a) { split(s, a, /[:.]/); return ((a[1] * 60 + a[2]) * 60 + a[3]) * 1000 + a[4] }
function sortn(arr, n,    i, j, t) {
    for (i = 2; i <= n; i++) { t = arr[i]; for (j = i - 1; j >= 1 && arr[j] > t; j--) arr[j + 1] = arr[j]; arr[j + 1] = t }
}
function pct(arr, n, p,    i) { if (n == 0) return -1; i = int(p * (n - 1) + 0.5) + 1; return arr[i] }
$1 == "fo" {
    kv(); s = f["hb"] "/" f["dead"]; run = f["run"]
    if (!(s in seen)) { seen[s] = 1; order[++ns] = s }
    key = s SUBSEP run
    fo[key] = f["failover_ms"]; st[key] = f["stall_ms"]; ex[key] = f["exact"]
    kw[key] = f["kill_wall"]; pu[key] = f["push_us"]; re[key] = f["retries"]
}
$1 == "meta" {
    kv(); s = f["hb"] "/" f["dead"]; key = s SUBSEP f["run"]
    if (!(s in seen)) { seen[s] = 1; order[++ns] = s }
    rc[key] = f["rc"]; vh[key] = f["victim_head"]; vw[key] = f["view_wall"]; sil[key] = f["silence_ms"]
    total[s]++
}
END {
    printf "\nFailover after SIGKILL of a chain head (server rank 0), 3 servers, chains of 3, async, 127.0.0.1\n"
    printf "(failover: kill -> ack of the first push started after it; view: kill -> worker installs the new\n"
    printf " view (its log, ms resolution); silence: what the scheduler measured when it declared the node dead)\n\n"
    hdr = sprintf("%-9s %4s %4s | %6s %6s %6s %6s | %6s %6s | %6s %6s | %6s | %5s %6s %7s",
                  "hb/dead", "runs", "ok", "fo p50", "fo p99", "fo max", "fo min", "view50", "view99",
                  "stall50", "stall99", "sil50", "retry", "push", "exactly")
    print hdr; gsub(/./, "-", hdr); print hdr
    for (o = 1; o <= ns; o++) {
        s = order[o]; n = 0; nv = 0; nsil = 0; ok = 0; bad = 0; head = 0; rsum = 0; psum = 0
        delete a; delete b; delete c; delete d
        for (key in rc) {
            split(key, kk, SUBSEP); if (kk[1] != s) continue
            if (vh[key] == "yes") head++
            if (rc[key] == 0) ok++
            if (ex[key] == "FAILED") bad++
            if (key in fo && fo[key] != "inf") {
                a[++n] = fo[key] + 0; c[n] = st[key] + 0; rsum += re[key]; psum += pu[key]
                if (vw[key] != "none" && kw[key] != "") v = ms_of_day(vw[key]) - ms_of_day(kw[key])
                else v = ""
                if (v != "") { if (v < -43200000) v += 86400000; b[++nv] = v }
            }
            if (sil[key] != "none" && sil[key] != "") d[++nsil] = sil[key] + 0
        }
        sortn(a, n); sortn(b, nv); sortn(c, n); sortn(d, nsil)
        printf "%-9s %4d %4d | %6.0f %6.0f %6.0f %6.0f | %6.0f %6.0f | %6.0f %6.0f | %6.0f | %5.1f %5.0fus %7s\n",
               s, total[s], ok, pct(a, n, .5), pct(a, n, .99), a[n], a[1], pct(b, nv, .5), pct(b, nv, .99),
               pct(c, n, .5), pct(c, n, .99), pct(d, nsil, .5), n ? rsum / n : 0, n ? psum / n : 0,
               bad ? bad " BAD" : "ok"
        if (head < total[s]) printf "  note: the victim headed a range in only %d of %d status checks\n", head, total[s]
        if (s == "100/400" && n) printf "  target (defaults): p99 < 500 ms: %s\n", pct(a, n, .99) < 500 ? "met" : "NOT met"
    }
    printf "\nAll times in ms (push: mean push round trip before the kill; retry: client re-sends per run).\n"
    printf "p99 over %d runs is the second-largest or largest value: read it with the max.\n", runs
    printf "What bounds it: a killed server is declared dead once the scheduler sees its connection\n"
    printf "closed and reconnecting refused (its reconnect interval, 50 ms, and the loop tick, 20 ms),\n"
    printf "whatever dead-after is; the heartbeat timeout only judges servers that stop answering with\n"
    printf "their process alive (paused, cut off). The rest (new view to the worker and the servers,\n"
    printf "re-sent push through the shortened chain) is ~1-2 ms on loopback.\n"
    printf "Run took %d s; load average %s at start, %s at end (%d cores).\n", secs, load0, load1, cores
}' "$res"
[ "$fails" = 0 ]
