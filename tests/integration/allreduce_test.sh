#!/bin/bash
# cps_allreduce among real worker processes (issue 29), through `chainps launch`:
#  1. 2 and 4 workers: every worker holds the same bits after every all-reduce, and a second run
#     gives the same bits again, as does a run over authenticated tcp:// instead of ipc://;
#  2. 4 workers, one killed -9 in the middle of the all-reduces: the job finishes without a
#     restart, and the survivors agree on every all-reduce, the ones after the kill included.
#  3. --restart-workers: the replacement fetches the trained values from a live worker
#     (cps_allreduce_fetch) and both workers end with the same values; with 3 workers and one
#     killed in the last all-reduce, its replacement learns that the job has ended and the job
#     succeeds; with 5 workers and two killed there, both replacements learn it (3c).
#  4. checkpoints of a job whose every tensor is all-reduced: step-based periodic exports (their
#     step is the workers' cps_local_commit) hold the all-reduced values (cps_local_add/commit),
#     sent in chunks of 4 KiB (CHAINPS_LOCAL_CHUNK); a job restored from one gives both workers
#     those bits back (cps_local_fetch), and an export whose all-reduced tensor is damaged is
#     refused naming it.
#  5. two `chainps checkpoint export --step` of such a job at once both succeed, each with the
#     workers' w of its own step.
#  6. nine at once: the oldest waiting request gives way to the ninth (refused, CPS_EAGAIN), the
#     other eight succeed at their steps.
# Usage: allreduce_test.sh CHAINPS ALLREDUCE_APP [KILLS]
# With KILLS > 0 (bench/allreduce_kill.sh) step 2 is repeated KILLS times and the time from each
# kill to the moment every survivor had completed an all-reduce begun after the kill is printed
# as "kill_to_next_ms N". EQUAL_WORKERS="" skips step 1.
set -u
CHAINPS=$1
APP=$2
KILLS=${3:-1}
dir=$(mktemp -d "${TMPDIR:-/tmp}/allreduce.XXXXXX")
lp=
cleanup() {
    [ -n "$lp" ] && kill "$lp" 2>/dev/null && wait "$lp" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    exit 1
}

# hashes DIR RANK: the "<iteration> <hash>" pairs of one worker
hashes() { awk '{print $1, $2}' "$1/rank$2.txt"; }

run() { # run OUTDIR WORKERS ARGS...: a job, in the foreground
    local out=$1 w=$2
    shift 2
    mkdir -p "$out"
    timeout 120 "$CHAINPS" launch --servers 1 --workers "$w" --timeout 100 -- \
        "$APP" --out "$out" "$@" >"$out.log" 2>&1 || { tail -30 "$out.log"; fail "job $out"; }
}

for w in ${EQUAL_WORKERS-2 4}; do
    for r in a b; do
        run "$dir/w$w$r" "$w" --len 100003 --iters 12 --mean
    done
    # Over tcp:// with the job's secret (no runtime directory: no ipc://), where every chunk is
    # sealed as the ring writes it and each all-gather chunk checked as the ring copies it.
    CHAINPS_RUNTIME_DIR= run "$dir/w${w}t" "$w" --len 100003 --iters 12 --mean
    for rank in $(seq 0 $((w - 1))); do
        [ "$(hashes "$dir/w${w}a" $rank | wc -l)" = 12 ] || fail "$w workers: rank $rank did not complete 12"
        cmp -s <(hashes "$dir/w${w}a" 0) <(hashes "$dir/w${w}a" $rank) ||
            fail "$w workers: rank $rank holds other bits than rank 0"
        cmp -s <(hashes "$dir/w${w}a" $rank) <(hashes "$dir/w${w}b" $rank) ||
            fail "$w workers: rank $rank's bits differ between two runs"
        cmp -s <(hashes "$dir/w${w}a" $rank) <(hashes "$dir/w${w}t" $rank) ||
            fail "$w workers: rank $rank's bits differ between ipc:// and authenticated tcp://"
    done
    echo "ok: $w workers, 12 all-reduces of 100003 values: equal bits on every worker, in both runs and over authenticated tcp://"
done

# A bad CHAINPS_ALLREDUCE_CHUNK fails the job with the variable named, instead of a silent default.
if [ -z "${EQUAL_WORKERS+x}" ]; then
    out=$dir/badchunk
    mkdir -p "$out"
    CHAINPS_ALLREDUCE_CHUNK=lots timeout 60 "$CHAINPS" launch --servers 1 --workers 2 --timeout 50 -- \
        "$APP" --out "$out" --len 1000 --iters 2 >"$out.log" 2>&1 && fail "CHAINPS_ALLREDUCE_CHUNK=lots: the job succeeded"
    grep -q 'CHAINPS_ALLREDUCE_CHUNK' "$out.log" || { tail -20 "$out.log"; fail "CHAINPS_ALLREDUCE_CHUNK=lots: no error naming it"; }
    echo "ok: CHAINPS_ALLREDUCE_CHUNK=lots: the job fails, naming the variable"
fi

# pid of the worker of rank $1 among launch's children
worker_of_rank() {
    local p
    for p in $(pgrep -P "$lp"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "CHAINPS_RANK=$1" && {
            echo "$p"
            return
        }
    done
}

export CHAINPS_WORKER_DEAD_AFTER_MS=${CHAINPS_WORKER_DEAD_AFTER_MS:-2000}
for k in $(seq 1 "$KILLS"); do
    out="$dir/kill$k"
    mkdir -p "$out"
    victim=$((k % 4))
    "$CHAINPS" launch --servers 1 --workers 4 --timeout 100 -- \
        "$APP" --out "$out" --len 65536 --iters 400 --step-ms 5 >"$out.log" 2>&1 &
    lp=$!
    # Kill once the workers are well into their all-reduces.
    for t in $(seq 1 100); do
        [ -s "$out/rank$victim.txt" ] && [ "$(wc -l <"$out/rank$victim.txt")" -ge 40 ] && break
        sleep 0.1
    done
    pid=$(worker_of_rank $victim)
    [ -n "$pid" ] || { tail -20 "$out.log"; fail "no worker of rank $victim"; }
    killed_at=$(date +%s%3N)
    kill -9 "$pid"
    wait "$lp"
    rc=$?
    lp=
    [ $rc = 0 ] || { tail -30 "$out.log"; fail "the job with a killed worker exited $rc"; }
    survivors=
    for rank in 0 1 2 3; do
        [ $rank = $victim ] || survivors="$survivors $rank"
    done
    first=${survivors# }
    first=${first%% *}
    for rank in $survivors; do
        [ "$(hashes "$out" $rank | wc -l)" = 400 ] || fail "kill $k: rank $rank did not complete 400"
        cmp -s <(hashes "$out" $first) <(hashes "$out" $rank) ||
            fail "kill $k: survivors $first and $rank hold other bits"
    done
    # The ring carried on once every survivor completed an all-reduce it began after the kill:
    # its second completion after the kill (the first may have needed nothing more from the
    # victim). Conservative by up to one iteration. The first is printed too.
    next=0
    first_done=0
    for rank in $survivors; do
        t=$(awk -v k="$killed_at" '$3 > k {n++; if (n == 2) {print $3; exit}}' "$out/rank$rank.txt")
        [ -n "$t" ] && [ "$t" -gt "$next" ] && next=$t
        t=$(awk -v k="$killed_at" '$3 > k {print $3; exit}' "$out/rank$rank.txt")
        [ -n "$t" ] && [ "$t" -gt "$first_done" ] && first_done=$t
    done
    echo "kill_to_next_ms $((next - killed_at)) (first completion after the kill: $((first_done - killed_at)) ms)"
    grep -h 'restarts' "$out.log" | sed 's/^/  /'
done
echo "ok: a worker killed -9 in the middle: the survivors finished all 400 all-reduces with equal bits"

# 3. Under --restart-workers: a 2-worker job training w (allreduce_app --train), rank 1 killed
#    -9 after 100 steps; its replacement fetches w and the step from rank 0 (whose ring waits for
#    it) and both end with the same w. The answer comes in parts of 1000 values
#    (CHAINPS_FETCH_PART), 4 per request: w's 5000 values and the last result's take 3 requests.
#    The replacement then starts its first all-reduce and fetches again under it (--busy-fetch):
#    refused CPS_EBUSY with nothing written, and the all-reduce goes on where the first fetch put
#    it (the equal final w shows it).
if [ "${EQUAL_WORKERS-x}" != "" ]; then
    out="$dir/replace"
    mkdir -p "$out"
    CHAINPS_FETCH_PART=1000 "$CHAINPS" launch --servers 1 --workers 2 --restart-workers --timeout 150 -- \
        "$APP" --out "$out" --train --busy-fetch --len 5000 --iters 600 --step-ms 10 >"$out.log" 2>&1 &
    lp=$!
    for t in $(seq 1 150); do
        [ -s "$out/rank1.txt" ] && [ "$(wc -l <"$out/rank1.txt")" -ge 100 ] && break
        sleep 0.1
    done
    pid=$(worker_of_rank 1)
    [ -n "$pid" ] || { tail -20 "$out.log"; fail "no worker of rank 1"; }
    kill -9 "$pid"
    wait "$lp"
    rc=$?
    lp=
    [ $rc = 0 ] || { tail -30 "$out.log"; fail "the job with a replaced worker exited $rc"; }
    grep -q 'rank 1: replacement starts at step [1-9]' "$out.log" ||
        { tail -30 "$out.log"; fail "the replacement did not fetch w from a live worker"; }
    grep -q 'rank 1: busy fetch refused' "$out.log" ||
        { grep 'rank 1' "$out.log" | tail -5; fail "a fetch under a running all-reduce was not refused"; }
    # The last window ends at the answer's total: w and, past its 5000 values, the result.
    grep -q 'sent values 4000\.\.[0-9]* of ' "$out.log" &&
        grep -Eq 'sent values 8000\.\.10000 of 10000 ' "$out.log" ||
        { grep 'sent values' "$out.log"; fail "the answer did not come in parts with the result"; }
    finals=$(sed -n 's/.*final w \([0-9a-f]*\).*/\1/p' "$out.log" | sort -u)
    [ "$(sed -n 's/.*final w \([0-9a-f]*\).*/\1/p' "$out.log" | wc -l)" = 2 ] &&
        [ "$(echo "$finals" | wc -l)" = 1 ] ||
        { grep 'final w\|replacement' "$out.log"; fail "the workers ended with different w"; }
    echo "ok: --restart-workers: $(grep -o 'replacement starts at step [0-9]*' "$out.log"), a fetch under its first all-reduce refused, both workers end with w $finals"
fi
# 3b. Under --restart-workers with 3 workers, rank 2 killed -9 in the job's last all-reduce (its
#    99th line of 100 written): the survivors complete it without rank 2, pass the barrier (a
#    dead worker does not hold it) and leave. Rank 2's replacement then has nobody to fetch from,
#    but the scheduler's views say every other worker finished (CPS_VIEW_WORKERS_SETTLED): its
#    fetch returns CPS_ESHUTDOWN, it says the job has ended and exits 0, and the job succeeds
#    (it failed "job FAILED" when the fetch returned CPS_ENOPEER). The survivors end with equal w.
if [ "${EQUAL_WORKERS-x}" != "" ]; then
    # The window is a step (30 ms) and the last all-reduce: a loaded machine may miss it (the
    # victim already wrote its 100th line). That run proves nothing, and the job is run again.
    for attempt in 1 2 3; do
        out="$dir/lastkill$attempt"
        mkdir -p "$out"
        "$CHAINPS" launch --servers 1 --workers 3 --restart-workers --timeout 100 -- \
            "$APP" --out "$out" --train --len 5000 --iters 100 --step-ms 30 >"$out.log" 2>&1 &
        lp=$!
        for t in $(seq 1 300); do
            [ -s "$out/rank2.txt" ] && break
            sleep 0.1
        done
        pid=$(worker_of_rank 2)
        [ -n "$pid" ] || { tail -20 "$out.log"; fail "no worker of rank 2"; }
        # Every 5 ms: the 99th line stays the last for a step and the last all-reduce.
        for t in $(seq 1 6000); do
            [ "$(wc -l <"$out/rank2.txt")" -ge 99 ] && break
            sleep 0.005
        done
        kill -9 "$pid"
        lines=$(wc -l <"$out/rank2.txt")
        wait "$lp"
        rc=$?
        lp=
        [ "$lines" = 99 ] && break
        echo "last kill, attempt $attempt: rank 2 was killed after $lines all-reduces, not in the last one: again"
    done
    [ "$lines" = 99 ] || fail "rank 2 was never killed in the last all-reduce (3 attempts)"
    [ $rc = 0 ] || { tail -30 "$out.log"; fail "the job whose worker died in the last all-reduce exited $rc"; }
    grep -q 'rank 2: the job has ended before this replacement could join' "$out.log" ||
        { grep 'rank 2\|replacement' "$out.log" | tail -10; fail "the replacement did not end saying the job had ended"; }
    for rank in 0 1; do
        [ "$(hashes "$out" $rank | wc -l)" = 100 ] || fail "last kill: rank $rank did not complete 100"
    done
    cmp -s <(hashes "$out" 0) <(hashes "$out" 1) || fail "last kill: the survivors hold other bits"
    finals=$(sed -n 's/.*final w \([0-9a-f]*\).*/\1/p' "$out.log")
    [ "$(echo "$finals" | wc -l)" = 2 ] && [ "$(echo "$finals" | sort -u | wc -l)" = 1 ] ||
        { grep 'final w' "$out.log"; fail "last kill: the survivors ended with different w"; }
    echo "ok: --restart-workers, 3 workers, rank 2 killed in the last all-reduce: the job succeeds, the replacement says the job has ended, the survivors end with w $(echo "$finals" | head -1)"
fi

# 3c. The same with 5 workers and two of them, ranks 3 and 4, killed -9 in the job's last
#    all-reduce: ranks 0 to 2 complete it and leave. The first replacement finds nobody to ask
#    while rank 4 awaits its own (no word yet): it waits instead of failing CPS_ENOPEER. Once
#    both are live, each asks the other, which refuses saying it is a replacement that never
#    held a state; with the word (every rank held by a live or a finished worker) and a finished
#    rank, both end CPS_ESHUTDOWN: they say the job has ended and exit 0, and the job succeeds.
#    Before (issue 29) the first failed CPS_ENOPEER at once, or both CPS_ENOTFOUND: "job FAILED".
if [ "${EQUAL_WORKERS-x}" != "" ]; then
    for attempt in 1 2 3; do
        out="$dir/twokill$attempt"
        mkdir -p "$out"
        "$CHAINPS" launch --servers 1 --workers 5 --restart-workers --timeout 100 -- \
            "$APP" --out "$out" --train --len 5000 --iters 100 --step-ms 30 >"$out.log" 2>&1 &
        lp=$!
        for t in $(seq 1 300); do
            [ -s "$out/rank3.txt" ] && [ -s "$out/rank4.txt" ] && break
            sleep 0.1
        done
        p3=$(worker_of_rank 3)
        p4=$(worker_of_rank 4)
        [ -n "$p3" ] && [ -n "$p4" ] || { tail -20 "$out.log"; fail "no workers of ranks 3 and 4"; }
        for t in $(seq 1 6000); do
            [ "$(wc -l <"$out/rank3.txt")" -ge 99 ] && [ "$(wc -l <"$out/rank4.txt")" -ge 99 ] && break
            sleep 0.005
        done
        kill -9 "$p3" "$p4"
        l3=$(wc -l <"$out/rank3.txt")
        l4=$(wc -l <"$out/rank4.txt")
        wait "$lp"
        rc=$?
        lp=
        [ "$l3" = 99 ] && [ "$l4" = 99 ] && break
        echo "two kills, attempt $attempt: ranks 3 and 4 were killed after $l3 and $l4 all-reduces, not both in the last one: again"
    done
    [ "$l3" = 99 ] && [ "$l4" = 99 ] || fail "ranks 3 and 4 were never both killed in the last all-reduce (3 attempts)"
    [ $rc = 0 ] || { grep 'rank [34]\|replacement\|FAIL' "$out.log" | tail -20; fail "the job whose two workers died in the last all-reduce exited $rc"; }
    for rank in 3 4; do
        grep -q "rank $rank: the job has ended before this replacement could join" "$out.log" ||
            { grep "rank $rank\|replacement" "$out.log" | tail -10; fail "rank $rank's replacement did not end saying the job had ended"; }
    done
    for rank in 0 1 2; do
        [ "$(hashes "$out" $rank | wc -l)" = 100 ] || fail "two kills: rank $rank did not complete 100"
        cmp -s <(hashes "$out" 0) <(hashes "$out" $rank) || fail "two kills: ranks 0 and $rank hold other bits"
    done
    finals=$(sed -n 's/.*final w \([0-9a-f]*\).*/\1/p' "$out.log")
    [ "$(echo "$finals" | wc -l)" = 3 ] && [ "$(echo "$finals" | sort -u | wc -l)" = 1 ] ||
        { grep 'final w' "$out.log"; fail "two kills: the survivors ended with different w"; }
    echo "ok: --restart-workers, 5 workers, ranks 3 and 4 killed in the last all-reduce: the job succeeds, both replacements say the job has ended, the survivors end with w $(echo "$finals" | head -1)"
fi

# 4. Checkpoints hold the all-reduced w: a 2-worker job (allreduce_app --train --ckpt, no server
#    tensor at all) with a checkpoint every 100 steps; w (20 KB, 5 chunks) at the export's step
#    (printed by both workers as they commit it) is what both workers of a job restored from it
#    start from.
if [ "${EQUAL_WORKERS-x}" != "" ]; then
    out="$dir/ckpt"
    mkdir -p "$out"
    CHAINPS_LOCAL_CHUNK=4096 timeout 120 "$CHAINPS" launch --servers 1 --workers 2 --timeout 100 --checkpoint-every 100 \
        --checkpoint-dir "$out/ck" --keep 5 -- "$APP" --train --ckpt --len 5000 --iters 400 \
        --step-ms 5 >"$out.log" 2>&1 || { tail -30 "$out.log"; fail "the checkpointed job"; }
    ck=$(ls -d "$out"/ck/step-* 2>/dev/null | head -1)
    [ -n "$ck" ] || { tail -30 "$out.log"; fail "no periodic checkpoint"; }
    ls -d "$out"/ck/step-* | sed 's/.*step-0*//' | while read -r n; do
        [ $((n % 100)) = 0 ] || fail "a periodic checkpoint at step $n, not a multiple of 100"
    done || exit 1
    grep -q 'local tensors of step [0-9]* sent to an exporter (20[0-9]* bytes in 5 messages;' "$out.log" ||
        { grep 'local tensors' "$out.log" | head -3; fail "the local part did not come in 4 KiB chunks"; }
    s=$((10#${ck##*step-}))
    want=$(sed -n "s/^\[worker 0\] commit $s \([0-9a-f]*\) [0-9a-f]*$/\1/p" "$out.log")
    other=$(sed -n "s/^\[worker 1\] commit $s \([0-9a-f]*\) [0-9a-f]*$/\1/p" "$out.log")
    [ -n "$want" ] && [ "$want" = "$other" ] || fail "the workers' w at step $s: '$want' '$other'"
    timeout 120 "$CHAINPS" launch --servers 2 --workers 2 --timeout 100 --restore-from "$ck" -- \
        "$APP" --train --ckpt --len 5000 --iters $((s + 50)) >"$out.restore.log" 2>&1 ||
        { tail -30 "$out.restore.log"; fail "the restored job"; }
    got=$(sed -n 's/.*restored w \([0-9a-f]*\) at step \([0-9]*\)$/\1 \2/p' "$out.restore.log" | sort -u)
    [ "$(grep -c 'restored w' "$out.restore.log")" = 2 ] && [ "$got" = "$want $s" ] ||
        { grep 'restored w' "$out.restore.log"; fail "restored w is not the exported one ($want at $s)"; }
    finals=$(sed -n 's/.*final w \([0-9a-f]*\).*/\1/p' "$out.restore.log" | sort -u | wc -l)
    [ "$finals" = 1 ] || fail "the restored workers ended with different w"
    # One flipped bit in the exported w: the restore is refused, naming the tensor.
    cp -r "$ck" "$out/bad"
    /usr/bin/python3 - "$out/bad/model.safetensors" <<'PY' || fail "cannot damage the export"
import json, struct, sys
with open(sys.argv[1], "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    begin = json.loads(f.read(n))["w"]["data_offsets"][0]
    f.seek(8 + n + begin + 3)
    b = f.read(1)
    f.seek(8 + n + begin + 3)
    f.write(bytes([b[0] ^ 0x10]))
PY
    timeout 60 "$CHAINPS" launch --servers 1 --workers 2 --timeout 40 --restore-from "$out/bad" -- \
        "$APP" --train --ckpt --len 5000 --iters 10 >"$out.bad.log" 2>&1 &&
        fail "a damaged export was restored"
    grep -q "tensor 'w'.*checksum\|w.*checksum mismatch\|checksum.*'w'" "$out.bad.log" ||
        { tail -10 "$out.bad.log"; fail "the refusal does not name the damaged tensor w"; }
    echo "ok: checkpoints of an all-reduce-only job: periodic at $(ls "$out/ck" | tr '\n' ' ')in 4 KiB chunks; w at step $s restored bitwise on both workers ($want); a damaged w is refused naming it"
fi
# A launched checkpointing job (log $1) under way: sets addr (its scheduler) and now (worker 0's
# last committed step), once worker 1 committed step 5.
job_started() {
    addr=
    for _ in $(seq 200); do
        addr=$(sed -n 's/^launch: scheduler on \([0-9.:]*\),.*/\1/p' "$1")
        [ -n "$addr" ] && grep -q '^\[worker 1\] commit 5 ' "$1" && break
        sleep 0.1
    done
    [ -n "$addr" ] || { tail -20 "$1"; fail "the job did not start"; }
    now=$(sed -n 's/^\[worker 0\] commit \([0-9]*\) .*/\1/p' "$1" | tail -1)
}
# 5. Two exports at once: both are answered, each with w of its own step (the worker queues
#    their requests). The steps are ahead of the job, so both wait at the worker together.
if [ "${EQUAL_WORKERS-x}" != "" ]; then
    out="$dir/two"
    mkdir -p "$out"
    "$CHAINPS" secret "$out/job.key" >/dev/null
    CHAINPS_LOCAL_CHUNK=4096 timeout 150 "$CHAINPS" launch --secret-file "$out/job.key" --servers 1 \
        --workers 2 --timeout 100 -- "$APP" --train --ckpt --len 5000 --iters 1000000 --step-ms 5 \
        >"$out.log" 2>&1 &
    lp=$!
    job_started "$out.log"
    s1=$((now + 150)) s2=$((now + 200))
    pids=
    for s in $s1 $s2; do
        timeout 120 "$CHAINPS" checkpoint export --secret-file "$out/job.key" --scheduler "$addr" \
            --step "$s" --out "$out/e$s" >"$out/e$s.log" 2>&1 &
        pids="$pids $!"
    done
    for p in $pids; do wait "$p" || { cat "$out"/e*.log; fail "one of two exports at once failed"; }; done
    kill "$lp" 2>/dev/null
    wait "$lp" 2>/dev/null
    lp=
    for s in $s1 $s2; do
        grep -q "at step $s " "$out/e$s.log" || { cat "$out/e$s.log"; fail "export --step $s: another step"; }
        want=$(sed -n "s/^\[worker 0\] commit $s [0-9a-f]* \([0-9a-f]*\)$/\1/p" "$out.log")
        got=$(/usr/bin/python3 - "$out/e$s/model.safetensors" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    head = json.loads(f.read(n))
    a, b = head["w"]["data_offsets"]
    f.seek(8 + n + a)
    h = 0xCBF29CE484222325
    for byte in f.read(b - a):
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    meta = head["__metadata__"]
    print("%016x %s %s" % (h, meta["local/step"], meta["step"]))
PY
)
        [ -n "$want" ] && [ "$got" = "$want $s $s" ] ||
            fail "export --step $s holds w '$got', the workers committed '$want $s $s'"
    done
    echo "ok: two exports at once (steps $s1 and $s2) both hold the workers' w of their step"
fi
# 6. Nine exports waiting at once: a worker holds 8 requests (CPS_LSET_QUEUE); the ninth takes the
#    place of the oldest waiting one, which is told CPS_EAGAIN and fails, and the other 8 are each
#    answered at their own step. The requests go out one after another, for steps far enough ahead
#    that all wait together, so the oldest is the first sent.
if [ "${EQUAL_WORKERS-x}" != "" ]; then
    out="$dir/nine"
    mkdir -p "$out"
    "$CHAINPS" secret "$out/job.key" >/dev/null
    timeout 200 "$CHAINPS" launch --secret-file "$out/job.key" --servers 1 \
        --workers 2 --timeout 180 -- "$APP" --train --ckpt --len 500 --iters 1000000 --step-ms 10 \
        >"$out.log" 2>&1 &
    lp=$!
    job_started "$out.log"
    pids= steps=
    for i in 0 1 2 3 4 5 6 7 8; do
        s=$((now + 700 + 10 * i))
        steps="$steps $s"
        timeout 150 "$CHAINPS" checkpoint export --secret-file "$out/job.key" --scheduler "$addr" \
            --step "$s" --out "$out/e$s" >"$out/e$s.log" 2>&1 &
        pids="$pids $!"
        # the next one only once the worker holds this one (its log says nothing: wait a little)
        sleep 0.4
    done
    first=${steps# }
    first=${first%% *}
    i=0
    for p in $pids; do
        s=$((now + 700 + 10 * i))
        if wait "$p"; then
            [ "$s" != "$first" ] || { cat "$out/e$s.log"; fail "the oldest of 9 waiting exports (step $s) was not refused"; }
            grep -q "at step $s " "$out/e$s.log" || { cat "$out/e$s.log"; fail "export --step $s: another step"; }
        else
            [ "$s" = "$first" ] || { cat "$out/e$s.log"; tail -20 "$out.log"; fail "export --step $s failed; only the oldest ($first) should"; }
        fi
        i=$((i + 1))
    done
    kill "$lp" 2>/dev/null
    wait "$lp" 2>/dev/null
    lp=
    grep -q "could not give its local tensors of step $first" "$out/e$first.log" ||
        { cat "$out/e$first.log"; fail "the refused export does not say the worker could not give step $first"; }
    grep -q "8 exports wait for the local tensors: the oldest (step $first) gives way" "$out.log" ||
        { grep -i export "$out.log" | tail; fail "worker 0 did not log the oldest request giving way"; }
    echo "ok: 9 exports at once: the oldest (step $first) is refused, the other 8 hold their steps"
fi
echo "PASS"
