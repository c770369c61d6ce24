#!/usr/bin/env bash
# The scheduler's periodic checkpoint rides through a server's kill -9 (issue 26). A sync fmnist
# MLP job (6 tensors over 3 ranges, chains of 3) runs under `chainps launch --checkpoint-every
# EVERY`: the scheduler's thread exports at every multiple of EVERY, starting the next export as
# soon as one is written, so one is always in flight (its cut waiting for its step on every
# replica, or being read). Once the first checkpoint is written, KIND ("tail" or "head" of range
# 0; default tail) is killed -9, LEAD steps before the step the export in flight waits for
# (default 20: its cut is then pending on every replica, the victim's going with it). The
# checkpoint of that period must not be lost: it completes, or its retry completes at the next
# multiple, within MAX_SECONDS of the kill, and `chainps checkpoint inspect` verifies it. Every
# process is a child of launch, ended by launch's PID; the test kills only one of launch's
# children. ~15 s.
# usage: ckpt_periodic_failover.sh CHAINPS FMNIST
set -euo pipefail
cps=$1
fm=$2
KIND=${KIND:-tail}
EVERY=${EVERY:-200}
LEAD=${LEAD:-20}
MAX_SECONDS=10
data=${FMNIST_DATA:-/usr/share/datasets/fashion-mnist}
if [ ! -r "$data/train-images-idx3-ubyte.gz" ]; then
    echo "no Fashion-MNIST data in $data: skipped"
    exit 77
fi
# shellcheck source=launch_job.sh
. "$(dirname "$0")/launch_job.sh"
fail() {
    echo "FAIL: $*"
    grep -E "ckpt|declared dead" "$dir/job.log" | tail -20 || true
    exit 1
}
ck=$dir/ckpts
"$cps" secret "$dir/job.key" >/dev/null
"$cps" launch --secret-file "$dir/job.key" --servers 3 --workers 2 --mode sync --timeout 100 \
    --checkpoint-every "$EVERY" --checkpoint-dir "$ck" --keep 100 \
    -- "$fm" --model mlp --schedule constant --steps 100000000 --log-every 0 --data "$data" \
    --out "$dir/fm-out" >"$dir/job.log" 2>&1 &
launch_pid=$!
addr=$(scheduler_addr "$dir/job.log")
[ -n "$addr" ] || fail "launch did not say where its scheduler is"
# The highest step of a complete checkpoint in $ck (0: none yet).
last_ckpt() {
    local last
    last=$(ls "$ck" 2>/dev/null | sed -n 's/^step-0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -1)
    echo "${last:-0}"
}
for _ in $(seq 150); do
    [ "$(last_ckpt)" -gt 0 ] && break
    kill -0 "$launch_pid" 2>/dev/null || fail "the job ended early"
    sleep 0.2
done
[ "$(last_ckpt)" -gt 0 ] || fail "no periodic checkpoint within 30 s"
# The victim: the server whose node id the view puts first or last in range 0's chain.
rank=$(status_json | "$py" -c '
import json, sys
d = json.load(sys.stdin)
chain = d["ranges"][0]["chain"]
node = chain[0] if sys.argv[1] == "head" else chain[-1]
print([n["rank"] for n in d["nodes"] if n["id"] == node and n["role"] == "server"][0])' "$KIND")
victim=
for p in $(pgrep -P "$launch_pid"); do
    case $(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null) in
    *" server "*"--rank $rank "*) victim=$p ;;
    esac
done
[ -n "$victim" ] || fail "no $KIND server (rank $rank) to kill"
# The period in flight is the multiple after the last one written; kill LEAD steps before it.
period=$(( $(last_ckpt) + EVERY ))
for _ in $(seq 300); do
    [ "$(step_now)" -ge $((period - LEAD)) ] && break
    sleep 0.02
done
at=$(step_now)
period=$(( $(last_ckpt) + EVERY )) # written meanwhile: the next one is in flight
t0=$(date +%s%3N)
kill -9 "$victim"
echo "killed the $KIND of range 0 (pid $victim) at step $at; the checkpoint in flight is step $period"
got=
for _ in $(seq $((MAX_SECONDS * 10))); do
    for s in "$period" $((period + EVERY)); do
        [ -d "$ck/$(printf 'step-%010d' "$s")" ] && { got=$s; break 2; }
    done
    kill -0 "$launch_pid" 2>/dev/null || fail "the job ended"
    sleep 0.1
done
secs=$(( $(date +%s%3N) - t0 ))
grep -E "declared dead|periodic checkpoint failed|ckpt.*(gone|reading the cut|lost)" "$dir/job.log" | head -8 || true
[ -n "$got" ] || fail "neither the checkpoint of step $period nor its retry at $((period + EVERY)) within $MAX_SECONDS s of the kill (have: $(ls "$ck" | tr '\n' ' '))"
stop_launch || fail "launch did not stop"
path=$ck/$(printf 'step-%010d' "$got")
"$cps" checkpoint inspect "$path" >"$dir/inspect.log" 2>&1 || { cat "$dir/inspect.log"; fail "step $got does not verify"; }
grep -q "^checksums:  all 18 verify" "$dir/inspect.log" || { cat "$dir/inspect.log"; fail "step $got: not 18 verified tensors"; }
if [ "$got" = "$period" ]; then
    echo "PASS: the checkpoint of step $period completed across the kill -9 of the $KIND (${secs} ms after it) and verifies"
else
    echo "PASS: the checkpoint of step $period was lost with the $KIND, and its retry at step $got completed ${secs} ms after the kill and verifies"
fi
