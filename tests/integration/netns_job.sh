#!/usr/bin/env bash
# ctest netns.*: a job across "hosts" on one machine. Each node (the scheduler, 3 servers, 2
# workers) runs in a network namespace of its own, with its own address (10.213.0.x) on a veth
# pair to a bridge; the bridge lives in one more namespace, so nothing of the machine's own
# network is touched (no interface, route or rule outside the namespaces made here). Faults:
#   loss     1% of the packets arriving at every node dropped (nftables numgen), whole job
#   tbf      every node's outgoing traffic limited to 20 Mbit/s (tc tbf), whole job
#   partition  server rank 1 cut off both ways for 2 s mid-run
#   oneway   only traffic TO server rank 1's inbox dropped (its TCP port), for 5 s mid-run: its
#            heartbeats still arrive, so only data-path evidence (recovery/suspect.h) finds it
#   delay    every packet between two nodes held NETNS_DELAY_US (2000) one-way by
#            tests/common/netdelay (the nodes' only link: a TUN device each), whole job
# Checked: both workers end with status 0 and the final checksum of the same job run on
# loopback with `chainps launch` (sync mode: bitwise); the deaths the scheduler declared are
# what the fault explains: none for loss, tbf and delay; for partition at most server rank 1; for
# oneway exactly server rank 1, found through the data path (its probe unanswered), within
# NETNS_ONEWAY_MAX_MS (3000) of the cut; for delay, that the job took at least a round trip
# (2 x NETNS_DELAY_US) per step, and that netdelay dropped nothing for want of room.
#
# WORKLOAD=lsq (default) or fmnist (tests/integration/workload.sh): PROGRAM is lsq_worker or
# examples/fmnist (the MLP, 6 tensors; 800 steps, unpaced, and the cut waits for its first loss
# line: data loading takes a second or two after the scheduler admitted everyone).
#
# usage: [WORKLOAD=fmnist] netns_job.sh CHAINPS PROGRAM SCENARIO [NETDELAY]   (NETDELAY: for delay)
# env: NETNS_STEPS (lsq_worker steps, default 2500 paced 1 ms each, 600 under loss and 800 with
# delay: a few seconds)
# Needs root, iproute2 and nftables (scripts/deps.sh test); exits 77 (skipped) where a network
# namespace cannot be made. Every process is ended by its PID and every namespace deleted on
# exit (trap).
set -euo pipefail

cps=$(readlink -f "${1:?usage: netns_job.sh CHAINPS LSQ_WORKER SCENARIO}")
bin=$(readlink -f "${2:?PROGRAM}")
scen=${3:?SCENARIO: loss, tbf, partition, oneway or delay}
delayer=${4:-}
delay_us=${NETNS_DELAY_US:-2000}
# Under loss every lost packet costs a TCP retransmission (200 ms at least) in a sync step, and
# with delay every step waits for round trips: fewer steps keep those jobs as short as the others.
case $scen in
loss) steps=${NETNS_STEPS:-600} ;;
delay) steps=${NETNS_STEPS:-800} ;;
*) steps=${NETNS_STEPS:-2500} ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/integration/workload.sh
. "$here/workload.sh"
workload_need_data
[[ $WORKLOAD == lsq ]] || steps=${NETNS_STEPS:-800}
oneway_max=${NETNS_ONEWAY_MAX_MS:-3000}
say() { echo "$(date +%T.%3N) netns.$scen: $*"; }
skip() {
    say "SKIP: $*"
    exit 77
}
case $scen in loss | tbf | partition | oneway | delay) ;; *)
    echo "unknown scenario '$scen'" >&2
    exit 2
    ;;
esac

# shellcheck source=tests/integration/lib_netns.sh
. "$here/lib_netns.sh"
why=$(netns_can_run) || skip "$why"
[[ $scen != tbf ]] || command -v tc >/dev/null || skip "no tc command (iproute2)"
if [[ $scen == delay ]]; then
    [[ -n $delayer ]] || {
        echo "usage: netns_job.sh CHAINPS LSQ_WORKER delay NETDELAY" >&2
        exit 2
    }
    delayer=$(readlink -f "$delayer")
    [[ -c /dev/net/tun ]] || skip "no /dev/net/tun (netdelay needs TUN devices)"
fi

t=$(mktemp -d "${TMPDIR:-/tmp}/netns-$scen.XXXXXX")
declare -a pids=()
cleanup() {
    stop_pids "${pids[@]}"
    netns_delete
    if [[ ${keep:-0} == 1 ]]; then
        say "logs kept in $t"
    else
        rm -rf "$t"
    fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# ---- the reference: the same job on loopback ----
job=(--servers 3 --workers 2 --mode sync)
# A small learning rate: the job ends far from converged, so every step's update shows in the
# checksum (at lsq_worker's default rate the parameters reach the same fixed point whatever
# happened on the way, and a lost or doubled update could go unseen).
prog=("$bin" --steps "$steps" --lr 0.002 --tol 10)
pace=(--step-ms 1)
if [[ $WORKLOAD == fmnist ]]; then
    # shellcheck disable=SC2207
    prog=("$bin" $(workload_fmnist_args "$steps" "$t/fm" 10))
    pace=()
fi
# lsq_worker's trajectory hash (every step's pulled weights) as well: sync mode and the same two
# worker processes throughout, so any update lost, doubled or served stale on the way shows even
# if the final weights met again (fmnist prints none: "").
"$cps" launch "${job[@]}" --timeout 60 --data "$t/ref" -- "${prog[@]}" >"$t/ref.out" 2>&1
ref=$(sed -n 's/.*final: .*checksum \([0-9a-f]*\)$/\1/p' "$t/ref.out" | sort -u)
[[ -n $ref && $ref != *$'\n'* ]] || {
    say "FAIL: the loopback reference run gave checksum(s) '$ref'"
    exit 1
}
ref_traj=
[[ $WORKLOAD == fmnist ]] || ref_traj=$(workload_ref_trajectory "$t/ref.out") || {
    say "FAIL: loopback reference: $ref_traj"
    exit 1
}

# ---- the network: a bridge in a namespace of its own, one namespace per node ----
tag=cps$$ # namespace names are global: this run's own prefix
netns_hub "$tag" || skip "cannot make a network namespace (ip netns add)"
# With delay each node's only link is netdelay's TUN device; otherwise a veth to the bridge.
mk=netns_node
[[ $scen != delay ]] || mk=netns_host
$mk sched 10.213.0.1
for r in 0 1 2; do $mk "s$r" "10.213.0.1$((r + 1))"; done
for r in 0 1; do $mk "w$r" "10.213.0.2$((r + 1))"; done
nodes=(sched s0 s1 s2 w0 w1)
SPORT=9100 # every server's inbox port (each has its own address)

case $scen in
loss) for n in "${nodes[@]}"; do netns_loss "$n" 10; done ;; # 1%
tbf) for n in "${nodes[@]}"; do netns_tbf "$n" 20mbit; done ;;
delay)
    netns_delay_start "$delayer" "$delay_us" "$t/netdelay.log" || {
        cat "$t/netdelay.log"
        skip "netdelay could not make its TUN devices"
    }
    ;;
esac

# ---- the job ----
"$cps" secret "$t/job.secret" >/dev/null
common=(CHAINPS_SECRET_FILE="$t/job.secret" CHAINPS_SCHEDULER=10.213.0.1:9091)
run() { # NAME LOG CMD...: run CMD in NAME's namespace, its PID kept
    local n=$1 log=$2
    shift 2
    ip netns exec "$tag-$n" env "${common[@]}" CHAINPS_BIND="${netns_addr[$n]}" \
        CHAINPS_ADVERTISE="${netns_addr[$n]}" "$@" >"$t/$log.log" 2>&1 &
    pids+=($!)
}
run sched sched "$cps" scheduler --servers 3 --workers 2 --mode sync --port 9091 \
    --bind 10.213.0.1 --data "$t/sched" --join-timeout 30
for r in 0 1 2; do
    run "s$r" "s$r" "$cps" server --rank "$r" --port "$SPORT" --data "$t/s$r" --join-timeout 30
done
start_ms=$(date +%s%3N)
wpids=()
for r in 0 1; do
    run "w$r" "w$r" env CHAINPS_ROLE=worker CHAINPS_RANK="$r" "${prog[@]}" "${pace[@]}"
    wpids+=("${pids[-1]}")
done
say "job started: scheduler, 3 servers, 2 workers in namespaces $tag-*; reference checksum $ref"

fault() { # NFT-RULES...: a table cpsfault in server rank 1's namespace
    ip netns exec "$tag-s1" nft -f - <<EOF
table inet cpsfault {
  chain in { type filter hook input priority 0; policy accept; $1 }
  chain out { type filter hook output priority 0; policy accept; $2 }
}
EOF
}
case $scen in
partition | oneway)
    # Cut once training is under way (every node admitted; fmnist: its first loss line), then
    # a second of steps. A cut after a worker finished would check nothing: a failure.
    started_re="connected 2 workers and 3 servers" started_log=$t/sched.log
    [[ $WORKLOAD == lsq ]] || started_re=$(workload_training_re) started_log=$t/w0.log
    for _ in $(seq 300); do
        grep -q "$started_re" "$started_log" && break
        sleep 0.1
    done
    grep -q "$started_re" "$started_log" || {
        say "FAIL: the job did not start training within 30 s"
        keep=1
        exit 1
    }
    sleep 1
    for p in "${wpids[@]}"; do
        kill -0 "$p" 2>/dev/null || {
            say "FAIL: a worker ended before the cut: make the job longer (NETNS_STEPS)"
            keep=1
            exit 1
        }
    done
    cut=$(date +%T.%3N)
    if [[ $scen == partition ]]; then
        fault 'iifname "eth0" drop;' 'oifname "eth0" drop;'
        sleep 2
    else
        fault "tcp dport $SPORT drop;" ''
        sleep 5
    fi
    ip netns exec "$tag-s1" nft delete table inet cpsfault
    say "server rank 1 cut off at $cut ($scen), reconnected at $(date +%T.%3N)"
    ;;
esac

rc=0
for p in "${wpids[@]}"; do
    wait "$p" || rc=$?
done
took_ms=$(($(date +%s%3N) - start_ms))
say "workers done in $took_ms ms (status $rc)"
fails=0
bad() {
    say "FAIL: $*"
    fails=$((fails + 1))
}
((rc == 0)) || bad "a worker exited with status $rc"
got=$(cat "$t/w0.log" "$t/w1.log" | sed -n 's/.*final: .*checksum \([0-9a-f]*\)$/\1/p' | sort -u)
n_got=$(cat "$t/w0.log" "$t/w1.log" | grep -c "final: " || true)
[[ $n_got == 2 && $got == "$ref" ]] ||
    bad "final checksum(s) '$got' ($n_got of 2 workers), loopback reference '$ref'"
got_traj=$(cat "$t/w0.log" "$t/w1.log" | workload_trajectories)
[[ $got_traj == "$ref_traj" ]] || bad "trajectory hash(es) '$got_traj', loopback reference '$ref_traj'"
# The scheduler ends the job and the servers leave; give them a moment, then the trap ends them.
for _ in $(seq 50); do
    kill -0 "${pids[0]}" 2>/dev/null || break
    sleep 0.1
done

deaths=$(grep -c "declared dead" "$t/sched.log" || true)
dead_ranks=$(sed -n 's/.*server [0-9]* (rank \([0-9]*\)).*declared dead.*/\1/p' "$t/sched.log" |
    sort -u | tr '\n' ' ')
say "declared deaths: $deaths (server ranks: ${dead_ranks:-none})"
case $scen in
loss | tbf)
    ((deaths == 0)) || bad "$deaths death(s) declared under $scen alone"
    ;;
delay)
    ((deaths == 0)) || bad "$deaths death(s) declared under delay alone"
    # Every sync step waits at least for one request and its reply: 2 one-way delays. A job
    # faster than that did not go through the delay.
    min_ms=$((steps * 2 * delay_us / 1000))
    ((took_ms >= min_ms)) || bad "the job took $took_ms ms, less than $min_ms: not delayed"
    netns_delay_stop
    say "$(tail -n 1 "$t/netdelay.log")"
    grep -q "forwarded.*dropped: 0 queue full" "$t/netdelay.log" ||
        bad "netdelay dropped packets for want of room: $(tail -n 1 "$t/netdelay.log")"
    ;;
partition)
    ((deaths <= 1)) || bad "$deaths deaths declared; the partition explains at most 1"
    [[ -z $dead_ranks || $dead_ranks == "1 " ]] || bad "servers of ranks $dead_ranks declared dead"
    ;;
oneway)
    if ((deaths != 1)) || [[ $dead_ranks != "1 " ]]; then
        bad "expected exactly server rank 1 declared dead, got $deaths (ranks $dead_ranks)"
    fi
    line=$(grep -m1 "left our probe unanswered" "$t/sched.log" || true)
    if [[ -z $line ]]; then
        bad "the one-way partition was not found through the data path"
    else
        at=${line%% *}
        # Both clocks are this machine's: HH:MM:SS.mmm of today (a run across midnight would
        # read as a failure, not a pass).
        ms() { local h m s; IFS=: read -r h m s <<<"$1"; echo $(((10#$h * 3600 + 10#$m * 60) * 1000 + 10#${s/./})); }
        took=$(($(ms "$at") - $(ms "$cut")))
        say "one-way partition at $cut; server rank 1 declared dead at $at: $took ms"
        ((took >= 0 && took <= oneway_max)) || bad "failover took $took ms (limit $oneway_max)"
    fi
    ;;
esac
if ((fails > 0)); then
    keep=1
    for f in sched s0 s1 s2 w0 w1; do
        echo "---- $f.log (last 12 lines)"
        tail -n 12 "$t/$f.log"
    done
    exit 1
fi
say "PASS: $WORKLOAD: checksum $got${ref_traj:+ and trajectory $got_traj} identical to loopback; deaths as the fault explains"
