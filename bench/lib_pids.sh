# Processes started one by one, ended by their PID (bench/lib_procs.sh, bench/run_pslite.sh):
# append every PID started to `pids`; stop_all gives them 2 s to exit by themselves, then SIGTERM,
# then SIGKILL, logging whom it signalled to $work/stop.log (`work`: an existing directory).
pids=()

alive() {
    local st
    st=$(ps -o stat= -p "$1" 2>/dev/null)
    [ -n "$st" ] && [ "${st#Z}" = "$st" ]
}
reap() {
    local p
    for p in "$@"; do
        { wait "$p"; } 2>/dev/null
    done
}
signalled=0
stop_all() {
    # Every process this script started, by PID. They should exit by themselves once the worker
    # is done (the scheduler ends the job); whoever is left after 2 s gets SIGTERM, then SIGKILL.
    local p left sig
    for sig in none TERM KILL; do
        for _ in $(seq 20); do
            left=0
            for p in "${pids[@]}"; do
                alive "$p" && left=1
            done
            [ "$left" = 0 ] && break
            sleep 0.1
        done
        [ "$left" = 0 ] && break
        [ "$sig" = none ] && continue
        for p in "${pids[@]}"; do
            if alive "$p"; then
                echo "left after the job: pid $p ($(ps -o args= -p "$p" | cut -c1-40)...): SIG$sig" \
                    >>"$work/stop.log"
                kill "-$sig" "$p" 2>/dev/null
                signalled=$((signalled + 1))
            fi
        done
    done
    reap "${pids[@]}"
    pids=()
}
