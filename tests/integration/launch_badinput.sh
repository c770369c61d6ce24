#!/bin/sh
# `chainps launch` checks what it is given before any process starts, and a scheduler that
# refuses the job ends it at once (issue 26). Each bad input must: exit non-zero, print one
# line naming the flag and the problem, end in well under 5 s, start no process (no "launch:
# scheduler on" line), and leave no chainps-job-* / chainps-secret-* directory in $TMPDIR.
# usage: launch_badinput.sh CHAINPS
set -eu
cps=$1
base=$(mktemp -d "${TMPDIR:-/tmp}/chainps-badinput-XXXXXX")
sched_pid=
cleanup() {
    if [ -n "$sched_pid" ]; then
        kill "$sched_pid" 2>/dev/null || true
        wait "$sched_pid" 2>/dev/null || true
    fi
    rm -rf "$base"
}
trap cleanup EXIT
# A TMPDIR of our own, so that anything launch leaves behind is seen (and only its own).
export TMPDIR=$base/tmp
mkdir "$TMPDIR"
good_secret=$base/job.secret
"$cps" secret "$good_secret" >/dev/null

now_ms() { date +%s%3N; }

# expect NAME MAX_MS PATTERN [--one-line|--started] ARGS...: run `chainps ARGS` (bounded by
# timeout 20), and check the exit status, that PATTERN is in its output, the time, and TMPDIR.
expect() {
    name=$1 max_ms=$2 pattern=$3 how=$4
    shift 4
    t0=$(now_ms)
    rc=0
    timeout 20 "$cps" "$@" >"$base/out" 2>"$base/err" || rc=$?
    ms=$(($(now_ms) - t0))
    cat "$base/out" "$base/err" >"$base/all"
    if [ "$rc" = 0 ] || [ "$rc" = 124 ]; then
        cat "$base/all"
        echo "FAIL: $name: exit status $rc (want a quick non-zero exit)"
        exit 1
    fi
    grep -q -e "$pattern" "$base/all" || {
        cat "$base/all"
        echo "FAIL: $name: no line matching '$pattern'"
        exit 1
    }
    [ "$ms" -lt "$max_ms" ] || { echo "FAIL: $name took $ms ms (limit $max_ms)"; exit 1; }
    if [ "$how" = --one-line ]; then
        # Refused before anything started: one line on stderr, nothing on stdout.
        [ "$(wc -l <"$base/err")" = 1 ] && [ ! -s "$base/out" ] || {
            cat "$base/all"
            echo "FAIL: $name: want exactly one line (on stderr) and no process started"
            exit 1
        }
    fi
    left=$(ls -A "$TMPDIR")
    [ -z "$left" ] || { echo "FAIL: $name left $left in TMPDIR"; exit 1; }
    echo "ok: $name: exit status $rc in $ms ms: $(grep -e "$pattern" "$base/all" | head -1)"
}

job="launch --servers 1 --workers 1 --secret-file $good_secret"

expect "missing --restore-from" 5000 "^chainps launch: --restore-from $base/nope: No such file" \
    --one-line $job --restore-from "$base/nope" -- /bin/true
printf 'not a checkpoint\n' >"$base/text.safetensors"
expect "--restore-from a text file" 5000 \
    "^chainps launch: --restore-from $base/text.safetensors: not a checkpoint the reader accepts" \
    --one-line $job --restore-from "$base/text.safetensors" -- /bin/true
mkdir "$base/emptydir"
expect "--restore-from an empty directory" 5000 \
    "^chainps launch: --restore-from $base/emptydir: not a checkpoint the reader accepts" \
    --one-line $job --restore-from "$base/emptydir" -- /bin/true

expect "missing --secret-file" 5000 \
    "^chainps launch: --secret-file: cannot open the secret file $base/nosecret" \
    --one-line launch --servers 1 --workers 1 --secret-file "$base/nosecret" -- /bin/true
cp "$good_secret" "$base/open.secret"
chmod 644 "$base/open.secret"
expect "--secret-file readable by others" 5000 \
    "^chainps launch: --secret-file: the secret file $base/open.secret is open to other users" \
    --one-line launch --servers 1 --workers 1 --secret-file "$base/open.secret" -- /bin/true

expect "missing program" 5000 "^chainps launch: the program $base/noprog after --: No such file" \
    --one-line $job -- "$base/noprog" --steps 3
printf '#!/bin/sh\nexit 0\n' >"$base/noexec"
chmod 644 "$base/noexec"
expect "non-executable program" 5000 \
    "^chainps launch: the program $base/noexec after -- is not an executable file" \
    --one-line $job -- "$base/noexec"
expect "program not on PATH" 5000 \
    "^chainps launch: the program chainps-no-such-program after --: no executable of that name on PATH" \
    --one-line $job -- chainps-no-such-program

# A scheduler given a checkpoint it cannot read exits at once with the refusal's status (3),
# instead of holding the workers back for ever.
expect "scheduler --restore-from missing" 5000 "ERROR scheduler: --restore-from $base/nope: No such" \
    --started scheduler --servers 1 --workers 1 --port 1 --secret-file "$good_secret" \
    --data "$base/sdata" --restore-from "$base/nope"
[ "$rc" = 3 ] || { echo "FAIL: scheduler exit status $rc, want 3 (refused for good)"; exit 1; }

# The job's scheduler data directory is held by another scheduler: launch's scheduler is refused
# (exit status 3), and launch fails the job at once with that reason instead of restarting it.
mkdir "$base/data"
"$cps" scheduler --servers 1 --workers 1 --port $((20000 + $$ % 20000)) --secret-file "$good_secret" \
    --data "$base/data" >"$base/holder.log" 2>&1 &
sched_pid=$!
i=0
until grep -q "listening on" "$base/holder.log"; do
    i=$((i + 1))
    [ "$i" -lt 100 ] || { cat "$base/holder.log"; echo "FAIL: the holding scheduler did not start"; exit 1; }
    sleep 0.1
done
expect "scheduler data directory held by another process" 5000 \
    "^launch: the scheduler refused the job (exit status 3): .*data directory $base/data/scheduler is in use by process $sched_pid" \
    --started $job --data "$base/data" -- /bin/sleep 30
grep -q "restarting it" "$base/all" && { echo "FAIL: launch restarted a refused scheduler"; exit 1; }
echo "PASS: every bad input failed fast, named, and left nothing behind"
