#!/usr/bin/env bash
# The export of a dense tensor of many chunks is the values the job holds (issue 14): 3 M float32
# (23 chunks, the last one shorter) over 3 ranges, so the exporter reads several consecutive keys
# per message, takes the answers of three ranges in turn, and a chunk straddles the writer's 8 MB
# buffers. A sync job (bench/ckpt_worker, 1 worker, SGD) runs 3 steps, prints the CRC-32 of the
# values its last step returned and holds the job there; the checkpoint's CRC-32 of the tensor
# (computed over the bytes written) must be that one, at that step, and the file must verify.
# Loopback only; the job ends when the hold file appears, or by launch's PID.
# usage: ckpt_dense.sh CHAINPS CKPT_WORKER
set -euo pipefail
cps=$1
worker=$2
# shellcheck source=launch_job.sh
. "$(dirname "$0")/launch_job.sh"
fail() { echo "FAIL: $*"; tail -20 "$dir/launch.log" 2>/dev/null || true; exit 1; }

"$cps" secret "$dir/job.key" >/dev/null
"$cps" launch --secret-file "$dir/job.key" --servers 3 --replicas 1 --workers 1 --mode sync \
    --timeout 110 -- "$worker" --params 3000000 --steps 3 --end-crc --hold "$dir/go" \
    >"$dir/launch.log" 2>&1 &
launch_pid=$!
addr=$(scheduler_addr "$dir/launch.log")
[ -n "$addr" ] || fail "launch did not say where its scheduler is"
line=
for _ in $(seq 600); do
    line=$(grep -m1 'end values crc32:' "$dir/launch.log" || true)
    [ -n "$line" ] && break
    kill -0 "$launch_pid" 2>/dev/null || fail "the job ended early"
    sleep 0.1
done
[ -n "$line" ] || fail "the worker did not print its values' CRC"
want=$(echo "$line" | sed -n 's/.*crc32:\([0-9a-f]*\) at step \([0-9]*\).*/\1/p')
at=$(echo "$line" | sed -n 's/.*crc32:\([0-9a-f]*\) at step \([0-9]*\).*/\2/p')

timeout 60 "$cps" checkpoint export --secret-file "$dir/job.key" --scheduler "$addr" \
    --out "$dir/ckpt" --timeout 30 >"$dir/export.log" 2>&1 || { cat "$dir/export.log"; fail "export"; }
cat "$dir/export.log"
"$cps" checkpoint inspect "$dir/ckpt" >"$dir/inspect.log" 2>&1 ||
    { cat "$dir/inspect.log"; fail "the export does not verify"; }
got=$(head -c 65536 "$dir/ckpt/model.safetensors" | grep -a -o '"checksum/bench/w":"crc32:[0-9a-f]*"' |
    cut -d: -f3 | tr -d '"')
step=$(sed -n 's/^exported .* at step \([0-9]*\) in .*/\1/p' "$dir/export.log")
echo "worker: crc32 $want at step $at; checkpoint: crc32 $got at step $step"
[ "$step" = "$at" ] || fail "cut at step $step, the job holds step $at"
[ "$got" = "$want" ] || fail "the checkpoint's values (crc32 $got) are not the job's ($want)"

touch "$dir/go"
for _ in $(seq 100); do kill -0 "$launch_pid" 2>/dev/null || break; sleep 0.1; done
stop_launch || fail "launch did not stop"
echo "PASS"
