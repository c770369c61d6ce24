#!/usr/bin/env bash
# Issue 28, way 2 out of a stranded range (docs/operations.md, "An empty disk as a range's last
# replica"): restore a checkpoint. A sync job exports a checkpoint while it trains; both servers
# of its ranges die, the last one comes back on an empty disk, and the ranges are stranded
# (`chainps status`, /metrics). The operator does what the page says: ends the job and starts it
# again from the checkpoint (`--restore-from`, a new scheduler --data, servers --reset-data). The
# restored workers pull the checkpoint's values bit for bit (the XXH3-64 they log at resume is
# that of the export's lsq/w bytes, read with numpy), their pushes are accepted again (they train
# to the end), and the new job strands nothing (status, chainps_ranges_stranded 0).
# Loopback only; every process is ended by its PID. KEEP=1 keeps the logs.
# usage: stranded_restore.sh CHAINPS LSQ_WORKER
set -euo pipefail
cps=$1
lsq=$2
# shellcheck source=stranded_job.sh
. "$(dirname "$0")/stranded_job.sh"
# Free loopback ports: the two jobs' schedulers and metrics, server 0, server 1.
read -r P M P2 M2 P0 P1 < <(free_ports 6)
server() { # RANK SCHEDULER_PORT LOG [flags]
    "$cps" server --scheduler "127.0.0.1:$2" --data "$dir/s$1" --rank "$1" \
        --port "$([ "$1" = 0 ] && echo "$P0" || echo "$P1")" "${@:4}" >"$dir/$3" 2>&1 &
    pids+=("$!")
}
worker() { # SCHEDULER_PORT LOG [flags]
    CHAINPS_UNAVAILABLE_TIMEOUT_MS=600000 CHAINPS_SCHEDULER=127.0.0.1:$1 "$lsq" --dim 64 "${@:3}" \
        >"$dir/$2" 2>&1 &
    pids+=("$!")
}

# ---- the job, its checkpoint, the incident ----
start_job 5 20 --metrics-port "$M"
sleep 1
timeout 60 "$cps" checkpoint export --scheduler "127.0.0.1:$P" --out "$dir/ckpt" \
    >"$dir/export.log" 2>&1 || fail "the export failed"
timeout 30 "$cps" checkpoint inspect "$dir/ckpt" >"$dir/inspect.log" 2>&1 || fail "inspect"
step=$(sed -n 's/^step: *//p' "$dir/inspect.log")
if [ -z "$step" ] || [ "$step" -le 0 ]; then fail "the export has no step ($step)"; fi
sleep 1 # training goes on past the checkpoint
both_servers_die "$dir/sched.log" "$s0" "$s1"
server 1 "$P" s1b.log --reset-data
s1b=${pids[-1]}
wait_for "$dir/sched.log" "range 1 is UNAVAILABLE" 20 || fail "no ERROR for the stranded range"
"$cps" status --scheduler "127.0.0.1:$P" >"$dir/status.txt" 2>/dev/null || fail "status"
[ "$(grep -c "UNAVAILABLE: server .* kept out (fallback: server" "$dir/status.txt")" = 2 ] ||
    { cat "$dir/status.txt"; fail "status shows no stranded range"; }
stranded_metric_is "$M" 2 || fail "chainps_ranges_stranded is not 2"

# ---- way 2: end the job, start it again from the checkpoint ----
ended "$w0" "$w1" "$s1b" "$sp"
"$cps" scheduler --servers 2 --workers 2 --replicas 2 --port "$P2" --data "$dir/sched2" \
    --metrics-port "$M2" --restore-from "$dir/ckpt" --hold >"$dir/sched2.log" 2>&1 &
pids+=("$!")
server 0 "$P2" s0r.log --reset-data
server 1 "$P2" s1r.log --reset-data
end=$((step + 40))
worker "$P2" r0.log --steps "$end" --tol 100
r0=${pids[-1]}
worker "$P2" r1.log --steps "$end" --tol 100
r1=${pids[-1]}
for p in "$r0" "$r1"; do
    for _ in $(seq 600); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && fail "a restored worker did not finish"
    wait "$p" || fail "a restored worker failed"
done
for w in r0 r1; do
    grep -q "resuming at step $step, values checksum" "$dir/$w.log" ||
        fail "$w did not resume at the checkpoint's step $step"
    grep -q "trained 40 steps" "$dir/$w.log" || fail "$w's pushes were not accepted"
done
seen=$(sed -n 's/.*values checksum \([0-9a-f]*\).*/\1/p' "$dir/r0.log")
[ "$seen" = "$(sed -n 's/.*values checksum \([0-9a-f]*\).*/\1/p' "$dir/r1.log")" ] ||
    fail "the two workers pulled different values"
want=$(ckpt_hash "$dir/ckpt/model.safetensors" "$step" 64) || fail "reading the export"
[ "$seen" = "$want" ] || fail "pulled values $seen are not the checkpoint's $want"
stranded_metric_is "$M2" 0 || fail "the restored job strands a range"
"$cps" status --scheduler "127.0.0.1:$P2" >"$dir/status2.txt" 2>/dev/null || fail "status (2)"
grep -q UNAVAILABLE "$dir/status2.txt" && { cat "$dir/status2.txt"; fail "status shows a stranded range"; }
echo "PASS (checkpoint step $step, values $want)"
