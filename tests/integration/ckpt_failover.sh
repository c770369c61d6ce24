#!/usr/bin/env bash
# Checkpoint exports ride through failovers (issue 26). A sync job (the fmnist MLP: 6 tensors
# over 3 ranges, chains of 3) runs under `chainps launch`; `chainps checkpoint export` starts
# DELAY ms before a kill -9 of (a) range 0's head, (b) range 0's tail, (c) the scheduler (which
# launch restarts). Each export must finish well inside its timeout with a file that `chainps
# checkpoint inspect` verifies. Before the fix an export racing a tail kill waited out its whole
# timeout ("1 of 3 ranges did not say where they are").
#
# Then the same job runs without faults, and exports at each step the racing exports were cut at
# (`--step S`, all started at once, before the job gets there). Sync mode with a fixed seed and a
# constant schedule is deterministic and failovers do not change it, so each racing export must
# hold the very bytes of its fault-free twin: values, optimizer state and step counts.
#
# One job per race (fresh chains of 3 each time). DELAYS (ms, default "0 5 20") and KINDS
# (default "head tail scheduler") choose the races; long.ckpt_failover runs more delays, spread
# over the export's whole life (it opens its cut ~0.1 s in and reads for ~0.01 s). Every process
# is a child of launch, ended by launch's PID; the test kills only launch's own children.
# usage: ckpt_failover.sh CHAINPS FMNIST
set -euo pipefail
cps=$1
fm=$2
DELAYS=${DELAYS:-0 5 20}
KINDS=${KINDS:-head tail scheduler}
data=${FMNIST_DATA:-/usr/share/datasets/fashion-mnist}
if [ ! -r "$data/train-images-idx3-ubyte.gz" ]; then
    echo "no Fashion-MNIST data in $data: skipped"
    exit 77
fi
# shellcheck source=launch_job.sh
. "$(dirname "$0")/launch_job.sh"
fail() { echo "FAIL: $*"; exit 1; }
EXPORT_TIMEOUT=30 # the export's own --timeout; an export that rides through ends far sooner
MAX_SECONDS=8     # ... within this, or it waited for something that was not coming

"$cps" secret "$dir/job.key" >/dev/null
start_job() { # $1: log file. Sets launch_pid and addr.
    "$cps" launch --secret-file "$dir/job.key" --servers 3 --workers 2 --mode sync --timeout 100 \
        -- "$fm" --model mlp --schedule constant --steps 100000000 --log-every 0 --data "$data" \
        --out "$dir/fm-out" >"$1" 2>&1 &
    launch_pid=$!
    addr=$(scheduler_addr "$1")
    [ -n "$addr" ] || fail "launch did not say where its scheduler is ($1)"
}
wait_step() { # until the job passes step $1 (30 s at most)
    local s=0
    for _ in $(seq 150); do
        s=$(step_now)
        [ "$s" -gt "$1" ] && return 0
        kill -0 "$launch_pid" 2>/dev/null || fail "the job ended early"
        sleep 0.2
    done
    fail "the job did not pass step $1 (at $s)"
}
# The PID of the launch child that is $1: "scheduler", or "head"/"tail" of range 0 (the server
# whose node id the view puts first or last in range 0's chain, found by its --rank).
victim_pid() {
    local what=$1 rank= p
    if [ "$what" != scheduler ]; then
        rank=$(status_json | "$py" -c '
import json, sys
d = json.load(sys.stdin)
chain = d["ranges"][0]["chain"]
node = chain[0] if sys.argv[1] == "head" else chain[-1]
print([n["rank"] for n in d["nodes"] if n["id"] == node and n["role"] == "server"][0])' "$what") ||
            return 0
    fi
    for p in $(pgrep -P "$launch_pid"); do
        local cmd
        cmd=$(tr '\0' ' ' </proc/"$p"/cmdline 2>/dev/null) || continue
        if [ "$what" = scheduler ]; then
            case $cmd in *" scheduler "*) echo "$p"; return 0 ;; esac
        else
            case $cmd in *" server "*"--rank $rank "*) echo "$p"; return 0 ;; esac
        fi
    done
}
now_ms() { date +%s%3N; }

races=0
for kind in $KINDS; do
    for delay in $DELAYS; do
        name=$kind-$delay
        start_job "$dir/job-$name.log"
        wait_step 150
        v=$(victim_pid "$kind")
        [ -n "$v" ] || fail "$name: no $kind process to kill"
        t0=$(now_ms)
        timeout $((EXPORT_TIMEOUT + 15)) "$cps" checkpoint export --secret-file "$dir/job.key" \
            --scheduler "$addr" --out "$dir/ck-$name" --timeout "$EXPORT_TIMEOUT" \
            >"$dir/export-$name.log" 2>&1 &
        xp=$!
        [ "$delay" = 0 ] || sleep "$(printf '0.%03d' "$delay")"
        kill -9 "$v"
        set +e
        wait "$xp"
        rc=$?
        set -e
        secs=$(( $(now_ms) - t0 ))
        if [ "$kind" = scheduler ]; then
            for _ in $(seq 100); do grep -q "restarted the scheduler" "$dir/job-$name.log" && break; sleep 0.1; done
        fi
        stop_launch || fail "$name: launch did not stop"
        grep -E "declared dead|restarted the scheduler" "$dir/job-$name.log" | head -3 || true
        cat "$dir/export-$name.log"
        [ "$rc" = 0 ] || fail "$name: the export exited $rc after ${secs} ms"
        [ "$secs" -lt $((MAX_SECONDS * 1000)) ] || fail "$name: the export took ${secs} ms"
        step=$(sed -n 's/^exported .* at step \([0-9]*\) in .*/\1/p' "$dir/export-$name.log")
        [ -n "$step" ] || fail "$name: no step in the export's output"
        "$cps" checkpoint inspect "$dir/ck-$name" >"$dir/inspect-$name.log" 2>&1 ||
            { cat "$dir/inspect-$name.log"; fail "$name: the export does not verify"; }
        grep -q "^checksums:  all 18 verify" "$dir/inspect-$name.log" ||
            { cat "$dir/inspect-$name.log"; fail "$name: not 18 verified tensors"; }
        echo "race $name: export of step $step in ${secs} ms across a kill -9 of the $kind"
        echo "$name $step" >>"$dir/races"
        races=$((races + 1))
    done
done

# The fault-free twin: exports at every step above, all waiting for their step at once.
start_job "$dir/job-ref.log"
wait_step 0
first=$(sort -k2 -n "$dir/races" | head -1 | cut -d' ' -f2)
[ "$(step_now)" -lt "$first" ] || fail "the fault-free job passed step $first before its exports started"
pids=()
while read -r name step; do
    "$cps" checkpoint export --secret-file "$dir/job.key" --scheduler "$addr" --step "$step" \
        --out "$dir/ref-$name" --timeout 60 >"$dir/ref-$name.log" 2>&1 &
    pids+=($!)
done <"$dir/races"
for p in "${pids[@]}"; do wait "$p" || fail "a fault-free export failed: $(cat "$dir"/ref-*.log | grep -v INFO)"; done
stop_launch || fail "the fault-free job did not stop"
while read -r name step; do
    "$py" - "$dir/ck-$name/model.safetensors" "$dir/ref-$name/model.safetensors" <<'EOF' ||
import json, struct, sys
def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        body = f.read()
    meta = head.pop("__metadata__", {})
    return meta, {k: body[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in head.items()}
(ma, a), (mb, b) = load(sys.argv[1]), load(sys.argv[2])
if ma.get("step") != mb.get("step"):
    sys.exit("steps differ: %s and %s" % (ma.get("step"), mb.get("step")))
if sorted(a) != sorted(b):
    sys.exit("tensor names differ")
bad = [k for k in a if a[k] != b[k]]
if bad:
    sys.exit("tensors differ: " + ", ".join(sorted(bad)))
print("%d tensors bitwise equal at step %s" % (len(a), ma["step"]))
EOF
        fail "$name: the export is not its fault-free twin at step $step"
done <"$dir/races"
echo "PASS: $races exports racing kill -9 (${KINDS// /, }; ${DELAYS// /, } ms) completed and equal their fault-free twins"
