#!/usr/bin/env bash
# ctest ipc.* and frames.forge: the transport of issue 30 in real jobs: same-host ipc:// channels
# (src/transport/local.h) and large messages between hosts as separately sealed frames
# (src/transport/frame.h).
#   outsider  a `chainps launch` job in a private runtime directory of this test's own (0700)
#             while a process running as `nobody` (setpriv) keeps trying to connect to every
#             ipc socket of the job: each attempt must be refused by the kernel (EACCES), and the
#             job must end with the checksum of the same job run over tcp:// only.
#   ring      as outsider, with 1.2 MB tensors (lsq_worker --dim 300000), so that pushes, pulls
#             and forwards go through the processes' shared-memory rings (src/transport/ring.h):
#             the outsider must also fail to open every ring file of the job, and the job must
#             end with the checksum of the same job over tcp:// only.
#             Each process logs its ring counters at exit: more than 0 messages must have gone
#             through the rings and no descriptor may have been refused. The runtime directory
#             is on /dev/shm (transports make rings only on tmpfs; skipped without it).
#   ringkill  the ring job with server 1 killed by SIGKILL (launch --kill-at) while 1.2 MB
#             messages stream through the rings, and restarted: it must still end with the
#             checksum of the all-tcp:// run, with messages through the rings and at most a few
#             descriptors refused (those in flight from the killed server's old generation).
#   mixed     one host, two network namespaces: the scheduler, servers 0 and 1 and worker 0 in
#             one, server 2 and worker 1 in the other, all sharing one runtime directory. Checked
#             while it runs: Unix connections to the job's sockets inside each namespace and TCP
#             connections between the namespaces (ss); at the end, the checksum of the same job
#             run over tcp:// only on loopback.
#   forge     the scheduler, two servers (chains of 2) and a worker each in a network namespace of
#             its own, every packet routed through tests/common/netdelay, which flips one byte in
#             the middle of the TCP stream to the servers' port once 3 MB have gone there: the
#             worker pushes 1.2 MB tensors (lsq_worker --dim 300000) with CHAINPS_FRAME_KB=256
#             (framing is off by default), so the byte lands in a frame of a large authenticated
#             message. Checked: netdelay forged it; a server refused the frame (failed
#             authentication) and dropped that message whole; the job ends with the checksum of
#             the undisturbed run; and at its end (forge_end) the replicas are identical and each
#             applied as many updates as in the undisturbed run (nothing of the forged push
#             applied, its re-send applied once).
#   forgechain   after one reference, two jobs (FORGE_HOPS, default "head middle"): the same with
#             messages whole (unframed, the default: one MAC over the message) through one chain
#             of three (--ranges 1: servers 0, 1, 2 are head, middle and tail), netdelay forging
#             only segments from the worker (head: a push to the head) or from the head (middle:
#             a FWD to the middle replica). Checked for each: netdelay forged it; that server, and
#             only it, refused a message of that type (PUSH_PULL 23, FWD 28) as failing
#             authentication; the job ends with the undisturbed run's trajectory and checksum;
#             and with the worker done, the scheduler holding the servers (--hold), `chainps
#             status --verify` finds the three replicas at one sequence number with one checksum,
#             and each applied as many updates as each server of the undisturbed run: nothing of
#             the forged message was applied (nor applied and left unforwarded), none was
#             acknowledged without being applied, and its re-send (the worker's after its
#             request timeout, the head's after 200 ms) was applied once. This pins what the
#             server's check of a push before anything reads it guarantees (issue 30, "check
#             pending": docs/security.md says why the check stays a pass of its own).
# Both use sync mode with a small learning rate (every update shows in the checksum, as in
# netns_job.sh). Needs root (setpriv to nobody; namespaces for mixed): exits 77 when not root or
# when a namespace cannot be made. Every process is ended by its PID, namespaces deleted (trap).
#
# usage: transport_job.sh CHAINPS LSQ_WORKER outsider|ring|ringkill|mixed|forge|forgechain [NETDELAY]
set -euo pipefail
usage="usage: transport_job.sh CHAINPS LSQ_WORKER outsider|ring|ringkill|mixed|forge|forgechain [NETDELAY]"
cps=$(readlink -f "${1:?$usage}")
bin=$(readlink -f "${2:?$usage}")
scen=${3:?$usage}
delayer=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
steps=${IPC_STEPS:-1500}
say() { echo "$(date +%T.%3N) $scen: $*"; }
skip() {
    say "SKIP: $*"
    exit 77
}
case $scen in outsider | ring | ringkill | mixed | forge | forgechain) ;; *) echo "unknown scenario '$scen'; $usage" >&2; exit 2 ;; esac
[[ $(id -u) == 0 ]] || skip "needs root (to run a process as nobody / to make namespaces)"
py=/usr/bin/python3
[[ -x $py ]] || py=$(command -v python3) || skip "no python3 for the outsider's connect"
command -v setpriv >/dev/null || skip "no setpriv (util-linux)"

t=$(mktemp -d "${TMPDIR:-/tmp}/ipc-$scen.XXXXXX")
chmod 755 "$t" # nobody may reach $t itself: only the runtime directory below keeps it out
declare -a pids=()
# shellcheck source=tests/integration/lib_netns.sh
. "$here/lib_netns.sh" # stop_pids; the namespaces only where a scenario makes them
cleanup() {
    stop_pids "${pids[@]}"
    netns_delete
    [[ -n ${shmdir:-} ]] && rm -rf "$shmdir"
    if [[ ${keep:-0} == 1 ]]; then say "logs kept in $t"; else rm -rf "$t"; fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT
# "T C": the workers' trajectory hash(es) (lsq_worker: every step's pulled values) and final
# checksum(s) in the logs given. Every run here is sync with the same worker processes as its
# reference, so both must match: the trajectory also catches an update lost or doubled on the way
# whose effect the final values no longer show. The reference's T is one hash
# (workload_ref_trajectory), so a run printing "trajectory -" differs from it.
# shellcheck source=tests/integration/workload.sh
. "$here/workload.sh"
checksums() {
    echo "$(workload_trajectories "$@") $(sed -n 's/.*final: .*checksum \([0-9a-f]*\)$/\1/p' "$@" | sort -u)"
}
fail() {
    say "FAIL: $*"
    keep=1
    exit 1
}

job=(--servers 3 --workers 2 --mode sync)
prog=("$bin" --steps "$steps" --lr 0.002 --tol 10)
if [[ $scen == ring* ]]; then
    # 1.2 MB tensors over 8 samples (little to compute), a rate at which no value overflows, so
    # that every update shows in the checksum; the killed run long enough to be killed mid-way.
    rsteps=600
    [[ $scen == ringkill ]] && rsteps=1500
    prog=("$bin" --dim 300000 --samples 8 --steps "${RING_STEPS:-$rsteps}" --lr 1e-6 --tol 10)
fi
if [[ $scen == forge ]]; then
    job=(--servers 2 --replicas 2 --workers 1 --mode sync)
    prog=("$bin" --dim 300000 --steps "${FORGE_STEPS:-20}" --lr 0.002 --tol 10)
fi
if [[ $scen == forgechain ]]; then
    job=(--servers 3 --replicas 3 --ranges 1 --workers 1 --mode sync)
    prog=("$bin" --dim 300000 --steps "${FORGE_STEPS:-20}" --lr 0.002 --tol 10)
fi
# The reference: every channel tcp:// (an empty CHAINPS_RUNTIME_DIR turns ipc off).
ref_t0=$SECONDS
CHAINPS_RUNTIME_DIR='' "$cps" launch "${job[@]}" --timeout 90 --data "$t/ref" -- "${prog[@]}" \
    >"$t/ref.log" 2>&1 || fail "the tcp:// reference run failed: $(tail -5 "$t/ref.log")"
ref_traj=$(workload_ref_trajectory "$t/ref.log") || fail "$ref_traj"
ref=$(checksums "$t/ref.log")
[[ $ref =~ ^$ref_traj\ [0-9a-f]+$ ]] || fail "the reference run gave checksum(s) '$ref'"
grep -q "over ipc" "$t/ref.log" && fail "the reference run used ipc"
say "the tcp:// reference run took $((SECONDS - ref_t0)) s"

rundir=$t/run
if [[ $scen == ring* ]]; then
    # Rings only on tmpfs (src/transport/ring.h, cps__ring_dir_in_memory).
    [[ $(stat -f -c %T /dev/shm 2>/dev/null) == tmpfs ]] || skip "no tmpfs at /dev/shm for the rings"
    shmdir=$(mktemp -d "/dev/shm/ipc-$scen.XXXXXX")
    chmod 755 "$shmdir"
    rundir=$shmdir/run
fi
mkdir -m 700 "$rundir"
# The ring counters every transport logs at exit (transport.c): the sum of field $1.
ring_sum() { sed -n "s/.*ring counters:.* $1=\([0-9]*\).*/\1/p" "$t/job.log" | awk '{s += $1} END {print s + 0}'; }
ring_check() { # $1: most refusals allowed
    local lines sent refused
    lines=$(grep -c "ring counters:" "$t/job.log" || true)
    sent=$(ring_sum ring_sent) refused=$(ring_sum ring_refused)
    say "ring counters: $lines processes, ring_sent=$sent ring_refused=$refused retired=$(ring_sum retired) ring_returned=$(ring_sum ring_returned)"
    ((lines >= 1)) || fail "no process logged its ring counters: were the rings used?"
    ((sent > 0)) || fail "no message went through a ring (ring_sent=0)"
    ((refused <= $1)) || fail "$refused ring descriptors refused, at most $1 allowed"
}

if [[ $scen == ringkill ]]; then
    # The kill lands while the workers stream 1.2 MB tensors; the server restarts and rejoins.
    CHAINPS_RUNTIME_DIR=$rundir "$cps" launch "${job[@]}" --timeout 120 --data "$t/job" \
        --kill-at "${RING_KILL_AT:-3}" --kill-server 1 -- "${prog[@]}" >"$t/job.log" 2>&1 &
    jpid=$!
    pids+=("$jpid")
    rings=0
    while kill -0 "$jpid" 2>/dev/null; do
        n=$(find "$rundir" -maxdepth 1 -name '*.ring' 2>/dev/null | wc -l)
        ((n > rings)) && rings=$n
        sleep 0.2
    done
    wait "$jpid" || fail "the job failed: $(tail -5 "$t/job.log")"
    pids=()
    grep -q "SIGKILL server 1" "$t/job.log" || fail "no server was killed: $(grep -i kill "$t/job.log")"
    ((rings >= 1)) || fail "no ring file in the runtime directory: were the rings used?"
    ring_check "${RING_MAX_REFUSED:-16}"
    got=$(checksums "$t/job.log")
    [[ $got == "$ref" ]] || fail "checksum(s) '$got', tcp:// reference '$ref'"
    say "PASS: server 1 killed mid-run over rings ($rings ring files); checksum $got as over tcp://"
    exit 0
fi

if [[ $scen == outsider || $scen == ring ]]; then
    steady=(--step-ms 2)
    [[ $scen == ring ]] && steady=()
    CHAINPS_RUNTIME_DIR=$rundir "$cps" launch "${job[@]}" --timeout 90 --data "$t/job" -- \
        "${prog[@]}" "${steady[@]}" >"$t/job.log" 2>&1 &
    jpid=$!
    pids+=("$jpid")
    # The outsider: as nobody, connect to every socket of the job, again and again while it
    # runs. It prints "refused N" (every attempt met EACCES) or "CONNECTED path" and stops.
    probe='
import os, socket, sys
paths, refused = sys.argv[1:], 0
for p in paths:
    if p.endswith(".ring"):
        try:
            open(p, "rb").close()
            print("OPENED", p)
            sys.exit(1)
        except PermissionError:
            refused += 1
        continue
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(p)
        print("CONNECTED", p)
        sys.exit(1)
    except PermissionError:
        refused += 1
    except OSError as e:
        print("OTHER", p, e)
        sys.exit(1)
    finally:
        s.close()
try:
    os.listdir(sys.argv[1].rsplit("/", 1)[0])
    print("LISTED the runtime directory")
    sys.exit(1)
except PermissionError:
    pass
print("refused", refused)
'
    attempts=0 rounds=0 seen=0 rings=0
    while kill -0 "$jpid" 2>/dev/null; do
        mapfile -t socks < <(find "$rundir" -maxdepth 1 -type s 2>/dev/null)
        ((${#socks[@]} > seen)) && seen=${#socks[@]}
        mapfile -t ringf < <(find "$rundir" -maxdepth 1 -name '*.ring' 2>/dev/null)
        ((${#ringf[@]} > rings)) && rings=${#ringf[@]}
        socks+=("${ringf[@]}")
        if ((${#socks[@]})); then
            out=$(setpriv --reuid=nobody --regid=nogroup --clear-groups --inh-caps=-all \
                "$py" -c "$probe" "${socks[@]}" 2>&1) || fail "the outsider got in: $out"
            attempts=$((attempts + ${out#refused }))
            rounds=$((rounds + 1))
        fi
        sleep 0.2
    done
    wait "$jpid" || fail "the job failed: $(tail -5 "$t/job.log")"
    pids=()
    # Every node binds one ipc inbox: the scheduler, 3 servers and 2 workers.
    ((seen >= 6)) || fail "saw $seen ipc sockets in the runtime directory, want 6: no ipc?"
    ((rounds >= 3)) || fail "only $rounds outsider rounds while the job ran: make it longer"
    if [[ $scen == ring ]]; then
        ((rings >= 1)) || fail "no ring file in the runtime directory: were the rings used?"
        ring_check 0
    fi
    got=$(checksums "$t/job.log")
    [[ $got == "$ref" ]] || fail "checksum(s) '$got', tcp:// reference '$ref'"
    say "PASS: $attempts connects/opens as nobody refused ($rounds rounds, $seen sockets, $rings ring files); checksum $got as over tcp://"
    exit 0
fi

why=$(netns_can_run) || skip "$why"
tag=cpi$$
netns_hub "$tag" || skip "cannot make a network namespace (ip netns add)"

# The forge scenarios: node namespaces NAME:IP... (the scheduler first) routed through netdelay,
# forging as its flags (after --) say, and the job's secret; frun then starts a process in one of
# them with the job's environment (CHAINPS_FRAME_KB=$frame_kb), logging to $ld/NAME.log.
declare -A fpid=()
ld=$t
forge_start() { # NAME:IP... -- NETDELAY_FLAGS...
    [[ -n $delayer ]] || { echo "$usage" >&2; exit 2; }
    [[ -c /dev/net/tun ]] || skip "no /dev/net/tun (netdelay needs TUN devices)"
    sched_ip=${1#*:}
    while [[ $1 != -- ]]; do
        netns_host "${1%%:*}" "${1#*:}"
        shift
    done
    shift
    NETNS_DELAY_ARGS="$*" netns_delay_start "$(readlink -f "$delayer")" 0 "$ld/netdelay.log" || {
        cat "$ld/netdelay.log"
        skip "netdelay could not make its TUN devices"
    }
    "$cps" secret "$ld/job.secret" >/dev/null
}
frun() { # NS CMD...
    local n=$1
    shift
    ip netns exec "$tag-$n" env CHAINPS_SECRET_FILE="$ld/job.secret" CHAINPS_RUNTIME_DIR= \
        CHAINPS_FRAME_KB="$frame_kb" CHAINPS_SCHEDULER="$sched_ip:9091" \
        CHAINPS_BIND="${netns_addr[$n]}" CHAINPS_ADVERTISE="${netns_addr[$n]}" "$@" \
        >"$ld/$n.log" 2>&1 &
    pids+=($!)
    fpid[$n]=$!
}
# The updates a server applied, from the line it logs as it stops.
applied() { sed -n 's/.*stopping: \([0-9]*\) updates applied.*/\1/p' "$@"; }
# Every server of the undisturbed run applied every update (one range, or chains through all of
# them): one count.
ref_applied=$(applied "$t/ref.log" | sort -u)
[[ $ref_applied =~ ^[0-9]+$ ]] || fail "the reference's servers applied '$ref_applied' updates"
# The job's end in a forge scenario, the worker done: the scheduler (--hold) keeps the servers up,
# and `chainps status --verify` from the worker's namespace (through netdelay) must find every
# replica of every range at one sequence number with one checksum: a server that applied the
# forged message and did not forward it, or applied a re-send twice, stands apart. Then
# `status --end` stops the servers, and each must have applied as many updates as each server of
# the reference: one more is the forged message or a re-send applied besides the good one, one
# fewer a message acknowledged (so never re-sent) without being applied.
fstatus() { # ARGS...
    ip netns exec "$tag-w0" env CHAINPS_SECRET_FILE="$ld/job.secret" CHAINPS_RUNTIME_DIR= \
        CHAINPS_BIND="${netns_addr[w0]}" CHAINPS_ADVERTISE="${netns_addr[w0]}" \
        timeout 60 "$cps" status --scheduler "$sched_ip:9091" "$@"
}
forge_end() { # SERVER_NAMES...
    local out rc=0 s n
    out=$(fstatus --verify 2>&1) || rc=$?
    echo "$out" >"$ld/verify.log"
    say "status --verify: $(grep "^verify: " <<<"$out" || echo "no verdict, exit status $rc")"
    if ((rc != 0)) || ! grep -q "^verify: OK" <<<"$out"; then
        fail "status --verify exited $rc: $(sed -n '/^verify:$/,$p' <<<"$out" | tr '\n' ';')"
    fi
    fstatus --end >"$ld/end.log" 2>&1 || fail "status --end failed: $(cat "$ld/end.log")"
    for s in "$@"; do
        for _ in $(seq 300); do
            [[ -n $(applied "$ld/$s.log") ]] && break
            sleep 0.1
        done
        n=$(applied "$ld/$s.log")
        [[ $n == "$ref_applied" ]] ||
            fail "$s applied ${n:-no count of} updates, each server of the undisturbed run $ref_applied"
    done
    say "servers $* each applied $ref_applied updates, as in the undisturbed run"
}

if [[ $scen == forge ]]; then
    frame_kb=${FORGE_FRAME_KB:-256}
    forge_start sched:10.213.3.1 s0:10.213.3.11 s1:10.213.3.12 w0:10.213.3.21 -- \
        --forge-port 9100 --forge-after "${FORGE_AFTER:-3000000}"
    frun sched "$cps" scheduler --servers 2 --workers 1 --replicas 2 --mode sync --port 9091 \
        --bind 10.213.3.1 --data "$t/sched" --join-timeout 30 --hold
    frun s0 "$cps" server --rank 0 --port 9100 --data "$t/s0" --join-timeout 30
    frun s1 "$cps" server --rank 1 --port 9100 --data "$t/s1" --join-timeout 30
    frun w0 env CHAINPS_ROLE=worker CHAINPS_RANK=0 "${prog[@]}"
    wait "${fpid[w0]}" || fail "the worker exited with status $?: $(tail -5 "$t/w0.log")"
    forge_end s0 s1
    netns_delay_stop
    grep -q "forged 1 byte" "$t/netdelay.log" || fail "netdelay forged nothing: $(cat "$t/netdelay.log")"
    grep -h "failed authentication\|dropped a framed message whole" "$t/s0.log" "$t/s1.log" || true
    grep -q "failed authentication" "$t/s0.log" "$t/s1.log" || fail "no server refused a frame"
    grep -q "dropped a framed message whole" "$t/s0.log" "$t/s1.log" ||
        fail "no server dropped the forged message whole"
    got=$(checksums "$t/w0.log")
    [[ $got == "$ref" ]] || fail "checksum '$got', undisturbed run '$ref'"
    say "PASS: $(grep -h "forged 1 byte" "$t/netdelay.log" | sed 's/^netdelay: //'); refused and dropped whole; replicas identical; checksum $got as undisturbed"
    exit 0
fi

# forgechain: after the one reference, one job per hop, each in namespaces of its own (the
# previous hop's job ended by PID and its namespaces deleted) and its logs in $t/HOP.
forge_hop() { # head|middle
    local hop=$1 from victim type refusal r
    # A step's 1.2 MB goes as three 400 KB pushes (PUSH_PULL, lsq_worker's) and FWDs: 3 MB in,
    # the byte lands in the middle of one of them.
    if [[ $hop == head ]]; then
        from=10.213.4.21 victim=s0 type=23
    else
        from=10.213.4.11 victim=s1 type=28
    fi
    scen=forge_$hop # what say and fail name
    ld=$t/$hop
    mkdir "$ld"
    stop_pids "${pids[@]}"
    pids=()
    fpid=()
    netns_delete
    tag=cpi$$$hop
    netns_hub "$tag" || skip "cannot make a network namespace (ip netns add)"
    frame_kb=0
    forge_start sched:10.213.4.1 s0:10.213.4.11 s1:10.213.4.12 s2:10.213.4.13 w0:10.213.4.21 -- \
        --forge-port 9100 --forge-after "${FORGE_AFTER:-3000000}" --forge-from "$from"
    frun sched "$cps" scheduler "${job[@]}" --port 9091 --bind 10.213.4.1 --data "$ld/sched" \
        --join-timeout 30 --hold
    for r in 0 1 2; do
        frun "s$r" "$cps" server --rank "$r" --port 9100 --data "$ld/s$r" --join-timeout 30
    done
    frun w0 env CHAINPS_ROLE=worker CHAINPS_RANK=0 "${prog[@]}"
    wait "${fpid[w0]}" || fail "the worker exited with status $?: $(tail -5 "$ld/w0.log")"
    forge_end s0 s1 s2
    netns_delay_stop
    grep -q "forged 1 byte" "$ld/netdelay.log" || fail "netdelay forged nothing: $(cat "$ld/netdelay.log")"
    refusal=$(grep -h "failed authentication" "$ld/$victim.log" || true)
    say "$victim: ${refusal:-no refusal}"
    [[ $refusal == *"type $type,"* ]] ||
        fail "$victim refused no message of type $type as failing authentication"
    for r in 0 1 2; do
        [[ s$r == "$victim" ]] && continue
        ! grep -q "failed authentication" "$ld/s$r.log" || fail "s$r refused a message too: $(grep -h "failed authentication" "$ld/s$r.log")"
    done
    got=$(checksums "$ld/w0.log")
    [[ $got == "$ref" ]] || fail "checksum '$got', undisturbed run '$ref'"
    say "PASS: $(grep -h "forged 1 byte" "$ld/netdelay.log" | sed 's/^netdelay: //'); $victim refused the type-$type message; replicas identical; checksum $got as undisturbed"
}

if [[ $scen == forgechain ]]; then
    for hop in ${FORGE_HOPS:-head middle}; do forge_hop "$hop"; done
    exit 0
fi

# ---- mixed: two namespaces, one host ----
netns_node a 10.213.1.1
netns_node b 10.213.1.2
"$cps" secret "$t/job.secret" >/dev/null
run() { # NS LOG CMD...
    local n=$1 log=$2
    shift 2
    ip netns exec "$tag-$n" env CHAINPS_SECRET_FILE="$t/job.secret" CHAINPS_RUNTIME_DIR="$rundir" \
        CHAINPS_SCHEDULER=10.213.1.1:9091 CHAINPS_BIND="${netns_addr[$n]}" \
        CHAINPS_ADVERTISE="${netns_addr[$n]}" "$@" >"$t/$log.log" 2>&1 &
    pids+=($!)
}
run a sched "$cps" scheduler --servers 3 --workers 2 --mode sync --port 9091 --bind 10.213.1.1 \
    --data "$t/sched" --join-timeout 30
run a s0 "$cps" server --rank 0 --port 9100 --data "$t/s0" --join-timeout 30
run a s1 "$cps" server --rank 1 --port 9101 --data "$t/s1" --join-timeout 30
run b s2 "$cps" server --rank 2 --port 9100 --data "$t/s2" --join-timeout 30
wpids=()
run a w0 env CHAINPS_ROLE=worker CHAINPS_RANK=0 "${prog[@]}" --step-ms 2
wpids+=("${pids[-1]}")
run b w1 env CHAINPS_ROLE=worker CHAINPS_RANK=1 "${prog[@]}" --step-ms 2
wpids+=("${pids[-1]}")
for _ in $(seq 300); do
    grep -q "connected 2 workers and 3 servers" "$t/sched.log" && break
    sleep 0.1
done
grep -q "connected 2 workers and 3 servers" "$t/sched.log" || fail "the job did not start in 30 s"
sleep 1
# Unix connections to the job's sockets within a namespace; TCP between the two.
unix_a=$(ip netns exec "$tag-a" ss -xH 2>/dev/null | grep -c "$rundir" || true)
unix_b=$(ip netns exec "$tag-b" ss -xH 2>/dev/null | grep -c "$rundir" || true)
tcp_ab=$(ip netns exec "$tag-a" ss -tnH state established 2>/dev/null | grep -c "10.213.1.2" ||
    true)
say "while running: unix connections to the job's sockets: $unix_a, $unix_b; tcp a<->b: $tcp_ab"
rc=0
for p in "${wpids[@]}"; do wait "$p" || rc=$?; done
((rc == 0)) || fail "a worker exited with status $rc"
((unix_a > 0)) || fail "no ipc connection inside namespace a"
((tcp_ab > 0)) || fail "no tcp connection between the namespaces"
got=$(checksums "$t/w0.log" "$t/w1.log")
n_got=$(cat "$t/w0.log" "$t/w1.log" | grep -c "final: " || true)
[[ $n_got == 2 && $got == "$ref" ]] ||
    fail "final checksum(s) '$got' ($n_got of 2 workers), tcp:// reference '$ref'"
say "PASS: ipc inside the namespaces ($unix_a, $unix_b), tcp between ($tcp_ab); checksum $got as all-tcp"
