#!/usr/bin/env bash
# Backup workers (issue 16): a 3-worker sync job with --backup-workers 1 in which rank 2 is a
# straggler (it sleeps 8 ms a step, the others 2 ms) finishes, every step closing with the first
# two gradients: the straggler's pushes come back as dropped (its "late pushes" line), the
# servers count them (their "late gradients dropped" at exit, and the Prometheus counter
# chainps_server_late_gradients_total while the job runs), and the fast workers never wait for
# it. Then the same job with --backup-workers 0 drops nothing (today's behaviour). Bad values of
# the flag and of CHAINPS_BACKUP_WORKERS are refused by name. Loopback only; every job is ended
# by launch's PID (launch ends its children by theirs). usage: backup_workers.sh CHAINPS LSQ
set -euo pipefail
cps=$1
lsq=$2
# shellcheck source=launch_job.sh
. "$(dirname "$0")/launch_job.sh"
fail() { echo "FAIL: $*"; tail -40 "$dir/launch.log" 2>/dev/null || true; exit 1; }

# Refused before anything starts: exit 2, the flag or variable named.
refused() { # want-text, then the command
    local want=$1; shift
    set +e
    "$@" >"$dir/bad.out" 2>&1; local rc=$?
    set -e
    [ "$rc" = 2 ] || { cat "$dir/bad.out"; fail "'$*' exited $rc, not 2"; }
    grep -q -- "$want" "$dir/bad.out" || { cat "$dir/bad.out"; fail "'$*' did not name $want"; }
}
job=(--insecure --servers 2 --workers 3 --mode sync)
refused "--backup-workers" "$cps" launch "${job[@]}" --backup-workers 3 -- /bin/true
refused "--backup-workers" "$cps" launch "${job[@]}" --backup-workers x -- /bin/true
refused "--backup-workers" "$cps" launch --insecure --servers 2 --workers 3 --mode async \
    --backup-workers 1 -- /bin/true
refused "--backup-workers" "$cps" scheduler --insecure --servers 1 --workers 2 --backup-workers 2
refused "CHAINPS_BACKUP_WORKERS" env CHAINPS_BACKUP_WORKERS=-1 "$cps" launch "${job[@]}" -- /bin/true

# A free loopback port for the metrics of the scheduler and the two servers.
base=$("$py" - <<'PY'
import socket
for _ in range(200):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    if p > 65000:
        continue
    held = []
    try:
        for q in (p, p + 1, p + 2):
            t = socket.socket(); t.bind(("127.0.0.1", q)); held.append(t)
        print(p); break
    except OSError:
        pass
    finally:
        for t in held: t.close()
PY
)
[ -n "$base" ] || fail "no three free ports"

run() { # backup workers
    launch_pid=
    "$cps" launch "${job[@]}" --backup-workers "$1" --timeout 60 --metrics-port "$base" -- \
        "$lsq" --steps 250 --base-ms 2 --step-ms 6 --slow-rank 2 --tol 0.05 \
        >"$dir/launch.log" 2>&1 &
    launch_pid=$!
}

run 1
# While it runs: the head of a range counts the straggler's dropped gradients.
scraped=0
for _ in $(seq 100); do
    for port in $((base + 1)) $((base + 2)); do
        n=$("$py" - "$port" <<'PY' 2>/dev/null || true
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=2).read().decode()
for line in text.splitlines():
    if line.startswith("chainps_server_late_gradients_total"):
        print(int(float(line.split()[-1])))
PY
)
        [ -n "$n" ] && [ "$n" -gt 0 ] && scraped=$n
    done
    [ "$scraped" -gt 0 ] && break
    kill -0 "$launch_pid" 2>/dev/null || break
    sleep 0.05
done
wait "$launch_pid" || fail "the job with --backup-workers 1 failed"
launch_pid=
grep -q "launch: job finished" "$dir/launch.log" || fail "no 'job finished'"
[ "$scraped" -gt 0 ] || fail "chainps_server_late_gradients_total never moved above 0"
# The straggler's pushes came back as dropped; the servers dropped them.
line=$(sed -n 's/^\[worker [0-9]*\] rank 2: \([0-9]*\) late pushes dropped.*, of \([0-9]*\) pushes$/\1 \2/p' \
    "$dir/launch.log")
read -r slow pushes <<<"$line"
[ -n "$slow" ] && [ "$slow" -gt 0 ] || fail "rank 2 (the straggler) had no push dropped"
# Each dropped push moved the straggler on to the step the job was on: it made fewer pushes than
# the job has steps, instead of falling further behind (it would make all 250, each late).
[ "$pushes" -lt 250 ] || fail "the straggler pushed $pushes times for 250 steps: it did not catch up"
served=$(sed -n 's/.*stopping: .*, \([0-9]*\) late gradients dropped$/\1/p' "$dir/launch.log" |
    awk '{ n += $1 } END { print n + 0 }')
[ "$served" -ge "$slow" ] || fail "servers dropped $served late gradients, the straggler saw $slow"
# Every worker ends with the same parameters (the straggler pulls what the others made).
sums=$(sed -n 's/.*final: rank [0-9] .*checksum \([0-9a-f]*\)$/\1/p' "$dir/launch.log" | sort -u)
[ "$(echo "$sums" | wc -l)" = 1 ] && [ -n "$sums" ] || fail "workers ended with different values"
echo "backup 1: straggler's dropped pushes $slow of $pushes, servers' late gradients $served (scraped $scraped)"
grep "trained" "$dir/launch.log"

# b = 0: every step waits for the straggler; nothing is dropped.
run 0
wait "$launch_pid" || fail "the job with --backup-workers 0 failed"
launch_pid=
if grep -q "late" "$dir/launch.log"; then fail "late pushes without backup workers"; fi
grep "trained" "$dir/launch.log"
echo "PASS"
