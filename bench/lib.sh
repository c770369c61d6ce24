# The shell library of every bench/ driver: `. "$here/lib.sh"` (bash). Sourcing it defines
# functions and the `pids` array and changes nothing else; a driver then calls what it needs:
#
#   bench_prepare NAME BUILD_DIR_ARG PROGRAM...   a driver that runs jobs under `chainps launch`
#       and keeps raw results in a temporary file: sets `build` (absolute; BUILD_DIR_ARG empty:
#       build-bench beside bench/), `res` (a results file) and `log` (its log); exits 2 naming
#       a PROGRAM (relative to the build directory) that is not built; removes res and log on
#       exit unless KEEP=1 (the EXIT trap runs bench_cleanup).
#   bench_procs   a driver that starts a cluster process by process: call it once `res` (a
#       results file), `work` (a log directory) and CHAINPS (the chainps binary) are set. On exit
#       every PID in `pids` is killed, and res/work are removed unless KEEP=1; it makes the job's
#       secret in $work unless CHAINPS_SECRET_FILE or CHAINPS_INSECURE=1 is given.
#   pids+=("$!"), alive PID, reap PID..., stop_all   processes ended by their PID: stop_all gives
#       every one in `pids` 2 s to exit by itself, then SIGTERM, then SIGKILL, logging whom it
#       signalled to $work/stop.log (counted in `signalled`).
#   free_port     a free TCP port on 127.0.0.1.
#   bench_report NAME "$@"   from here on, stdout also goes to bench/results/NAME.md (NAME
#       empty: the script's name without .sh), headed by the date, the commit, the script's
#       arguments and the knobs set in the environment: the last
#       run's report of each driver is in one known place. BENCH_RESULTS_DIR names another
#       directory; BENCH_RESULTS_DIR=none writes nothing.
#
# lib_median.awk is the awk side (median of an array).
bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

pids=()
signalled=0

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

stop_all() {
    # They should exit by themselves once the worker is done (the scheduler ends the job);
    # whoever is left after 2 s gets SIGTERM, then SIGKILL.
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

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

bench_prepare() {
    bench_name=$1
    build=${2:-$bench_dir/../build-bench}
    build=$(cd "$build" && pwd) || exit 2
    shift 2
    local b
    for b in "$@"; do
        [ -x "$build/$b" ] || { echo "$bench_name: $build/$b not built" >&2; exit 2; }
    done
    res=$(mktemp "${TMPDIR:-/tmp}/chainps-$bench_name-XXXXXX")
    log=$res.log
    trap bench_cleanup EXIT
    trap 'exit 130' INT TERM
}

bench_cleanup() {
    if [ "${KEEP:-0}" = 1 ]; then
        echo "raw results kept in $res (log $log)"
    else
        rm -f "$res" "$res.run" "$log"
    fi
}

bench_procs_cleanup() {
    local p
    for p in "${pids[@]}"; do
        kill -KILL "$p" 2>/dev/null
    done
    reap "${pids[@]}"
    if [ "${KEEP:-0}" = 1 ]; then
        echo "raw results kept in $res, logs in $work"
    else
        rm -rf "$res" "$work"
    fi
}

bench_procs() {
    trap bench_procs_cleanup EXIT
    trap 'exit 130' INT TERM
    # Every process started here (and `chainps status`) inherits the job's secret.
    if [ -z "${CHAINPS_SECRET_FILE:-}" ] && [ "${CHAINPS_INSECURE:-0}" != 1 ]; then
        "$CHAINPS" secret "$work/job.secret" >/dev/null
        export CHAINPS_SECRET_FILE=$work/job.secret
    fi
}

bench_report() {
    local name=${1:-$(basename "$0" .sh)} dir=${BENCH_RESULTS_DIR:-$bench_dir/results} commit
    [ $# -gt 0 ] && shift
    [ "$dir" = none ] && return 0
    mkdir -p "$dir" || return 0
    bench_results_file=$dir/$name.md
    commit=$(git -C "$bench_dir" describe --always --dirty 2>/dev/null || echo unknown)
    exec > >(tee "$bench_results_file")
    printf '# bench/%s.sh, %s, commit %s\n\nArguments: %s. Knobs set: %s.\n\n' "$name" \
        "$(date -u '+%Y-%m-%d %H:%M UTC')" "$commit" "${*:-none}" \
        "$(env | grep -E '^(ROUNDS|RUNS|REPS|ITERS|SIZES|MS|OPS|STEPS|EPOCHS|MODE|KILLS|WORKERS|SETTINGS|PARAMS|CODECS|FRAMES|DELAYS|SIDES)=' | paste -sd' ' - || true)"
}
