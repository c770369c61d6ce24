#!/usr/bin/env bash
# ctest auth.coll_forge (issue 29, "a forged or unauthenticated collective message is refused like
# any other"): an authenticated all-reduce between two workers over tcp://, each in a network
# namespace of its own, every packet routed through tests/common/netdelay, which flips one byte
# in the middle of worker 0's TCP stream to worker 1 (--forge-from worker 0, --forge-port the
# workers' port). The stream is worker 0's ring messages only, in a fixed order: per all-reduce
# its reduce-scatter chunk (its segment of the input) then its all-gather chunk (the segment it
# reduced), each one message of about 200 KB (--len 100003: segments of 50001 and 50002 values,
# 12 pieces of 16 KiB), so the byte is aimed at the middle of the all-gather chunk of all-reduce
# FORGE_ITER: netdelay forges the first segment that starts past that offset. The two chunks
# differ by one value, so the size the refusal names says which was hit.
# An all-gather chunk that is the ring's next one reaches the worker unchecked
# (cps__tp_defer_check) and is checked while its values are copied into the ring's working buffer
# (src/worker/collective.c cps__ar_on_pending, replication/collective.c cps__coll_place): the ring
# is stepped only if the tag verifies.
# Nothing re-sends a refused chunk: worker 1 asks the members for that all-reduce's result
# (cps__coll_lost), which worker 0, having completed it, sends (before that change both workers
# failed CPS_ETIMEDOUT 30 s later).
# Then an outsider on the same network (a namespace of its own, tests/integration/coll_forger.c)
# sends worker 1 all-gather chunks that name the running all-reduce (claimed senders 1 to 4,
# the next sequence numbers, 1e30 in every value), first sealed with another job's secret, then
# with no MAC: refused and logged ("wrong MAC", "no MAC").
# Checked: netdelay forged a byte; worker 1 (and only it) logged the refusal of a COLL message
# (type 47) of the all-gather chunk's size, and asked for that all-reduce's result; it logged the
# outsider's messages refused with both verdicts; the job finishes, and both workers hold, after
# every all-reduce, the bits of an undisturbed run (launch on 127.0.0.1, tcp://, authenticated).
# Root and namespaces, else 77. Every process is ended by its PID, namespaces deleted (trap).
#
# usage: coll_forge.sh CHAINPS ALLREDUCE_APP NETDELAY COLL_FORGER
set -euo pipefail
cps=$(readlink -f "${1:?usage: coll_forge.sh CHAINPS ALLREDUCE_APP NETDELAY}")
app=$(readlink -f "${2:?ALLREDUCE_APP}")
delayer=$(readlink -f "${3:?NETDELAY}")
forger=$(readlink -f "${4:?COLL_FORGER}")
here=$(cd "$(dirname "$0")" && pwd)
iters=${FORGE_ITERS:-60}
at=${FORGE_ITER:-4} # the all-reduce (0-based) whose all-gather chunk gets the byte
len=100003
say() { echo "$(date +%T.%3N) coll_forge: $*"; }
skip() {
    say "SKIP: $*"
    exit 77
}
[[ $(id -u) == 0 ]] || skip "needs root (network namespaces)"
[[ -c /dev/net/tun ]] || skip "no /dev/net/tun (netdelay needs TUN devices)"

t=$(mktemp -d "${TMPDIR:-/tmp}/coll-forge.XXXXXX")
declare -a pids=()
# shellcheck source=tests/integration/lib_netns.sh
. "$here/lib_netns.sh"
cleanup() {
    stop_pids "${pids[@]}"
    netns_delete
    if [[ ${keep:-0} == 1 ]]; then say "logs kept in $t"; else rm -rf "$t"; fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT
fail() {
    say "FAIL: $*"
    keep=1
    exit 1
}
# "<iteration> <hash>" of every all-reduce of rank $2 in out dir $1
hashes() { awk '{print $1, $2}' "$1/rank$2.txt"; }
prog=("$app" --len "$len" --iters "$iters" --mean --step-ms 50)

# The undisturbed run: the same job on 127.0.0.1, tcp:// (no runtime directory), authenticated.
mkdir -p "$t/ref"
CHAINPS_RUNTIME_DIR='' timeout 120 "$cps" launch --servers 1 --workers 2 --timeout 100 -- \
    "${prog[@]}" --out "$t/ref" >"$t/ref.log" 2>&1 || fail "the reference run failed: $(tail -5 "$t/ref.log")"
for r in 0 1; do
    [[ $(hashes "$t/ref" $r | wc -l) == "$iters" ]] || fail "reference: rank $r did not complete $iters"
done

why=$(netns_can_run) || skip "$why"
tag=cpc$$
netns_hub "$tag" || skip "cannot make a network namespace (ip netns add)"
sched_ip=10.213.6.1
for n in sched:$sched_ip s0:10.213.6.11 w0:10.213.6.21 w1:10.213.6.22 x:10.213.6.31; do
    netns_host "${n%%:*}" "${n#*:}"
done
# Worker 0's stream to worker 1: nanomsg's 8-byte handshake, then per message an 8-byte length,
# the 64-byte header, the payload and the 40-byte trailer. Per all-reduce: the reduce-scatter
# chunk (segment 0: 50001 values) and the all-gather chunk (segment 1: 50002 values).
rs=$((8 + 64 + 50001 * 4 + 40)) ag=$((8 + 64 + 50002 * 4 + 40))
after=$((8 + at * (rs + ag) + rs + ag / 2))
NETNS_DELAY_ARGS="--forge-port 9200 --forge-from ${netns_addr[w0]} --forge-after $after" \
    netns_delay_start "$delayer" 0 "$t/netdelay.log" || {
    cat "$t/netdelay.log"
    skip "netdelay could not make its TUN devices"
}
"$cps" secret "$t/job.secret" >/dev/null
frun() { # NS CMD...
    local n=$1
    shift
    ip netns exec "$tag-$n" env CHAINPS_SECRET_FILE="$t/job.secret" CHAINPS_RUNTIME_DIR= \
        CHAINPS_SCHEDULER="$sched_ip:9091" CHAINPS_BIND="${netns_addr[$n]}" \
        CHAINPS_ADVERTISE="${netns_addr[$n]}" "$@" >"$t/$n.log" 2>&1 &
    pids+=($!)
}
frun sched "$cps" scheduler --servers 1 --workers 2 --port 9091 --bind "$sched_ip" \
    --data "$t/sched" --join-timeout 30
frun s0 "$cps" server --rank 0 --port 9100 --data "$t/s0" --join-timeout 30
mkdir -p "$t/job"
wpids=()
for r in 0 1; do
    frun "w$r" env CHAINPS_ROLE=worker CHAINPS_RANK=$r CHAINPS_PORT=9200 "${prog[@]}" --out "$t/job"
    wpids+=("${pids[-1]}")
done
# The outsider, once the forged byte was refused (its refusal logged more than a second before,
# so that each batch gets a log line of its own: the transport logs at most one a second).
"$cps" secret "$t/other.secret" >/dev/null
for _ in $(seq 300); do
    grep -q "failed authentication" "$t/w1.log" && break
    sleep 0.05
done
grep -q "failed authentication" "$t/w1.log" || fail "worker 1 refused nothing in 15 s: $(tail -3 "$t/w1.log")"
for key in "$t/other.secret" none; do
    sleep 1.2
    done_n=$(wc -l <"$t/job/rank1.txt")
    ip netns exec "$tag-x" "$forger" "tcp://${netns_addr[w1]}:9200" "$key" "$len" 50002 4 1 \
        $((done_n + 1)) $((done_n + 3)) 1 >>"$t/forger.log" 2>&1 || fail "coll_forger: $(cat "$t/forger.log")"
done
# Bounded: a ring that never recovers fails at the all-reduce's timeout (30 s) well before.
deadline=$((SECONDS + 120))
for p in "${wpids[@]}"; do
    while kill -0 "$p" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
done
rc=0
for i in 0 1; do
    p=${wpids[$i]}
    kill -0 "$p" 2>/dev/null && fail "worker $i still running after 120 s: $(tail -3 "$t/w$i.log")"
    wait "$p" || rc=$?
    ((rc == 0)) || fail "worker $i exited with status $rc: $(tail -5 "$t/w$i.log")"
done
netns_delay_stop
forged=$(grep -h "forged 1 byte" "$t/netdelay.log" | sed 's/^netdelay: //') ||
    fail "netdelay forged nothing: $(cat "$t/netdelay.log")"
refusal=$(grep -h "failed authentication" "$t/w1.log" || true)
say "w1: ${refusal:-no refusal}"
first=$(head -1 <<<"$refusal")
[[ $first == *"type 47,"* ]] || fail "worker 1 refused no COLL message (type 47)"
[[ $first == *" $((ag - 8)) bytes, wrong MAC"* ]] ||
    fail "the refused message is not the all-gather chunk ($((ag - 8)) bytes)"
grep -q "a ring chunk of all-reduce $((at + 1)) (index 1) was refused" "$t/w1.log" ||
    fail "worker 1 did not ask for the result of all-reduce $((at + 1)): $(grep -h allreduce "$t/w1.log")"
cat "$t/forger.log"
[[ $(tail -n +2 <<<"$refusal") == *"wrong MAC"*"type 47,"* ]] ||
    fail "the outsider's messages under another job's secret were not refused as wrong MAC"
[[ $refusal == *"no MAC"*"type 47,"* ]] || fail "the outsider's unsealed messages were not refused as no MAC"
asks=$(grep -c "a ring chunk of all-reduce .* was refused" "$t/w1.log" || true)
! grep -q "failed authentication" "$t/w0.log" "$t/s0.log" "$t/sched.log" ||
    fail "another node refused a message too: $(grep -h "failed authentication" "$t"/{w0,s0,sched}.log)"
for r in 0 1; do
    [[ $(hashes "$t/job" $r | wc -l) == "$iters" ]] || fail "rank $r did not complete $iters all-reduces"
    cmp -s <(hashes "$t/ref" $r) <(hashes "$t/job" $r) ||
        fail "rank $r's bits differ from the undisturbed run's: $(diff <(hashes "$t/ref" $r) <(hashes "$t/job" $r) | head -4)"
done
say "PASS: $forged; worker 1 refused the all-gather chunk ($((ag - 8)) bytes, COLL) and took all-reduce $((at + 1))'s result from worker 0; the outsider's COLL messages refused (wrong MAC, no MAC; $asks refusals on the check-while-copying path in all); both workers hold the undisturbed run's bits after all $iters all-reduces"
