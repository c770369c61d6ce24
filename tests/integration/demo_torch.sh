#!/bin/bash
# `scripts/demo.sh torch` (issue 27): the PyTorch example through a local cluster with the head
# of a chain killed 6 s in, as the README tells a new user to run it. It must exit 0 with both
# workers' `final:` line, the same checksum on each (sync mode), and the launch summary.
#
# usage: demo_torch.sh SOURCE_DIR BUILD_DIR        (the suite: the build the tests run in)
#        demo_torch.sh SOURCE_DIR --fresh          (long: a fresh `git clone` of SOURCE_DIR's
#                                                   HEAD, built by the demo script itself)
# The job trains 2000 steps of LeNet-5 (15-40 s), enough to outlast the kill, the restart and
# the restarted server's catch-up, which launch reports.
# launch ends every process it starts; this script ends launch by its PID if it overstays.
set -u
src=$1
build=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/chainps-demo-XXXXXX")
pid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
if [ "$build" = --fresh ]; then
    git clone -q "$src" "$tmp/clone" || { echo "FAIL: git clone $src"; exit 1; }
    dir=$tmp/clone
    export BUILD=build/release
else
    dir=$src
    export BUILD=$build
fi
log=$tmp/demo.log
(cd "$dir" && exec scripts/demo.sh torch --steps 2000 --log-every 200) >"$log" 2>&1 &
pid=$!
for _ in $(seq 9000); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    tail -30 "$log"
    echo "FAIL: scripts/demo.sh torch did not end within 15 minutes"
    exit 1
fi
wait "$pid"
rc=$?
pid=
fail() {
    tail -40 "$log"
    echo "FAIL: $*"
    exit 1
}
[ "$rc" = 0 ] || fail "scripts/demo.sh torch exited $rc"
n=$(grep -c '^\[worker [01]\] final: test accuracy' "$log")
[ "$n" = 2 ] || fail "$n final lines, not 2"
sums=$(sed -n 's/^\[worker [01]\] final: .*checksum \([0-9a-f]*\)$/\1/p' "$log" | sort -u | wc -l)
[ "$sums" = 1 ] || fail "the workers' final checksums differ"
grep -q "SIGKILL server 0" "$log" || fail "no server was killed (the job ended before 6 s?)"
grep -q "restarted server 0" "$log" || fail "the killed server was not restarted"
grep -q "server 0 caught up: every range is back to its replicas" "$log" ||
    fail "launch did not see the restarted server catch up (the plot's mark)"
grep -q "launch: job finished" "$log" || fail "launch did not report the job finished"
grep '^\[worker 0\] final:' "$log"
echo "PASS: scripts/demo.sh torch ended with both final lines and one checksum"
