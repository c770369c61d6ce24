# Preamble of a bench driver that runs jobs under `chainps launch` and keeps raw results in a
# temporary file: source it with `NAME BUILD_DIR_ARG PROGRAM...` (programs relative to the build
# directory). Sets `build` (absolute), `res` (a results file) and `log` (its log); exits 2
# naming a program that is not built; removes res and log on exit unless KEEP=1.
bench_name=$1
build=${2:-$here/../build-bench}
build=$(cd "$build" && pwd) || exit 2
shift 2
for b in "$@"; do
    [ -x "$build/$b" ] || { echo "$bench_name: $build/$b not built" >&2; exit 2; }
done
res=$(mktemp "${TMPDIR:-/tmp}/chainps-$bench_name-XXXXXX")
log=$res.log
bench_cleanup() {
    if [ "${KEEP:-0}" = 1 ]; then
        echo "raw results kept in $res (log $log)"
    else
        rm -f "$res" "$res.run" "$log"
    fi
}
trap bench_cleanup EXIT
trap 'exit 130' INT TERM
