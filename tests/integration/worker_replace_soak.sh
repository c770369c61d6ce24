#!/bin/bash
# Worker replacement soak (issue 12): RUNS jobs per mode, each `chainps launch --servers 4
# --workers 2 --replicas 3 --restart-workers`, with one worker (random rank) killed -9 at a
# random moment of training (early, mid or late), so launch starts a new worker in its place.
# Each run must end within a bounded time with launch exiting 0 and a `final:` line from both
# ranks; in sync mode the finishing workers' final checksums must also be identical (they pull
# after the last barrier, when every step has been applied). A sync run with a replaced worker
# is not bitwise a fault-free run (the dead worker's shard is skipped until its replacement
# joins, README "failures"), so it is not compared with one.
#
# Every process is launch's child, ended by launch; the script kills only launch's own worker
# children by PID, and launch itself by PID if it overstays. Loopback only; the temporary
# directory is removed on exit.
#
# usage: [RUNS=20] [MODES="sync ssp:2"] [SEED=N] worker_replace_soak.sh CHAINPS LSQ_WORKER
# Also: STEPS (600) and STEP_MS (8) per worker, LSQ_ARGS (more lsq_worker flags, e.g.
# "--dim 65536 --samples 32 --tol 1e9" for a tensor spread over every range),
# CHAINPS_WORKER_DEAD_AFTER_MS (1000 here; the product's default is 5000).
# SEED (default $RANDOM, printed) draws each run's seed, which picks the victim and the moment.
# A failure prints its run's seed: RUN_SEED=<it> RUNS=1 MODES=<mode> re-runs that run.
set -u
cps=$1
lsq=$2
runs=${RUNS:-20}
modes=${MODES:-"sync ssp:2"}
seed=${SEED:-$RANDOM}
run_seed_given=${RUN_SEED:-}
# A dead worker's rank is free again after 1 s (launch restarts it 1 s after that).
export CHAINPS_WORKER_DEAD_AFTER_MS=${CHAINPS_WORKER_DEAD_AFTER_MS:-1000}
steps=${STEPS:-600}
step_ms=${STEP_MS:-8}
read -r -a lsq_args <<<"${LSQ_ARGS:-}"
train_ms=$((steps * step_ms)) # training lasts at least this long
limit=$((120 + train_ms * 3 / 1000)) # launch --timeout; the script gives launch 30 s more to stop
tmp=$(mktemp -d "${TMPDIR:-/tmp}/chainps-replace-XXXXXX")
lp=
cleanup() {
    if [ -n "$lp" ] && kill -0 "$lp" 2>/dev/null; then
        kill "$lp" 2>/dev/null
        wait "$lp" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A run's own random numbers: an LCG from its seed, so that they do not disturb the stream of
# run seeds ($RANDOM, from SEED).
rng=0
rnd() { # rnd N: 0 <= r < N, in $r
    rng=$(((rng * 1103515245 + 12345) & 0x7fffffff))
    r=$(((rng >> 8) % $1))
}

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# launch's child that is worker RANK (by its environment), or nothing.
worker_pid() {
    local p
    for p in $(pgrep -P "$lp"); do
        if tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qx "CHAINPS_RANK=$1"; then
            echo "$p"
            return
        fi
    done
}

# Wait for launch (pid $lp) for at most $1 s; end it by PID (and its children, should it not
# do so itself) if it overstays. Sets rc (124: it had to be stopped).
wait_launch() {
    local deadline=$(($(now_ms) + $1 * 1000)) kids
    while kill -0 "$lp" 2>/dev/null && [ "$(now_ms)" -lt "$deadline" ]; do sleep 0.2; done
    if kill -0 "$lp" 2>/dev/null; then
        kids=$(pgrep -P "$lp")
        kill "$lp"
        for _ in $(seq 75); do kill -0 "$lp" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$lp" $kids 2>/dev/null
        wait "$lp" 2>/dev/null
        rc=124
    else
        wait "$lp"
        rc=$?
    fi
    lp=
}

pass=0
total=0
times=()
fail() {
    local log=$1
    shift
    echo "FAIL: $*"
    echo "---- last 40 lines of $mode run $run's launch log ----"
    tail -40 "$log"
    echo "----"
    echo "re-run this run: RUN_SEED=$run_seed RUNS=1 MODES=$mode $0 $cps $lsq (soak seed $seed;" \
        "STEPS=$steps STEP_MS=$step_ms LSQ_ARGS='${LSQ_ARGS:-}' CHAINPS_WORKER_DEAD_AFTER_MS=$CHAINPS_WORKER_DEAD_AFTER_MS)"
    exit 1
}

echo "worker_replace_soak: seed $seed, $runs runs of: $modes"
RANDOM=$seed
for mode in $modes; do
    for run in $(seq "$runs"); do
        run_seed=${run_seed_given:-$RANDOM}
        rng=$run_seed
        rnd 2
        victim=$r
        rnd 3
        phase=$r # early, mid or late: a third of training each
        rnd $((train_ms / 3))
        at_ms=$((train_ms * phase / 3 + r + 50))
        names=(early mid late)
        # A log of its own, made here: the launched shell opens it only after the fork, and a
        # grep of a log shared with the previous run could find that run's lines first.
        log=$tmp/${mode/:/}-$run.log
        : >"$log"
        t0=$(now_ms)
        "$cps" launch --servers 4 --workers 2 --replicas 3 --mode "$mode" --restart-workers \
            --timeout "$limit" -- "$lsq" --steps "$steps" --step-ms "$step_ms" "${lsq_args[@]}" >"$log" 2>&1 &
        lp=$!
        for _ in $(seq 300); do
            grep -q "connected 2 workers" "$log" && break
            kill -0 "$lp" 2>/dev/null || break
            sleep 0.1
        done
        grep -q "connected 2 workers" "$log" || { wait_launch 5; fail "$log" "the job did not start"; }
        sleep "$(printf '%d.%03d' $((at_ms / 1000)) $((at_ms % 1000)))"
        v=$(worker_pid "$victim")
        [ -n "$v" ] || { wait_launch 5; fail "$log" "worker $victim had already exited at ${at_ms} ms"; }
        kill -9 "$v"
        wait_launch $((limit + 30))
        t=$(($(now_ms) - t0))
        total=$((total + 1))
        what="$mode run $run (seed $run_seed): worker $victim killed ${at_ms} ms into training (${names[$phase]})"
        [ "$rc" = 0 ] || fail "$log" "$what: launch exited $rc after $((t / 1000)) s"
        grep -q "restarted worker $victim" "$log" || fail "$log" "$what: worker $victim was not restarted"
        for r in 0 1; do
            [ "$(grep -c "final: rank $r " "$log")" = 1 ] || fail "$log" "$what: no final line from rank $r"
        done
        sums=$(sed -n 's/.*final: .*checksum \([0-9a-f]*\)$/\1/p' "$log" | sort -u)
        if [ "$mode" = sync ] && [ "$(echo "$sums" | wc -l)" != 1 ]; then
            fail "$log" "$what: the workers' final checksums differ: $(echo $sums)"
        fi
        pass=$((pass + 1))
        times+=("$t")
        from=$(sed -n "s/^\[worker $victim\] resuming at step \([0-9]*\).*/\1/p" "$log" | tail -1)
        echo "ok: $what; the replacement resumed at step ${from:-0}; $(printf '%d.%d' $((t / 1000)) $((t % 1000 / 100))) s, checksums $(echo $sums)"
    done
done
sorted=($(printf '%s\n' "${times[@]}" | sort -n))
med=${sorted[$((${#sorted[@]} / 2))]}
max=${sorted[$((${#sorted[@]} - 1))]}
printf 'PASS: %d of %d runs (%s) finished with both final lines; time per run median %d.%d s, max %d.%d s\n' \
    "$pass" "$total" "$modes" $((med / 1000)) $((med % 1000 / 100)) $((max / 1000)) $((max % 1000 / 100))
