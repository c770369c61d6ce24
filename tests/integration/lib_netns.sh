# shellcheck shell=bash
# Network namespaces as hosts on one machine (sourced by tests/integration/netns_job.sh and
# bench/run_netns.sh; bash, root). A bridge lives in a namespace of its own, and each node gets
# a namespace joined to it by a veth pair, with one 10.x address: nothing of the machine's own
# network (interfaces, routes, rules) is touched, and deleting the namespaces removes it all.
#
#   netns_can_run         0 if root with ip and nft (else prints why, returns 1)
#   netns_hub TAG         make the bridge namespace; node namespaces are named TAG-NAME
#   netns_node NAME IP    a node namespace, eth0 at IP/24 on the bridge; netns_addr[NAME]=IP
#   netns_loss NAME PERMILLE   drop that share of the packets arriving at NAME (nftables)
#   netns_tbf NAME RATE   limit NAME's egress (tc tbf), e.g. 20mbit
#   netns_host NAME IP    a node namespace with no link yet (lo only); netns_addr[NAME]=IP:
#                         its eth0 comes from netns_delay_start
#   netns_delay_start NETDELAY US LOG   route every netns_host node through NETDELAY
#                         (tests/common/netdelay.c: a TUN device eth0 at IP/24 in each, every
#                         packet held US microseconds one-way, so a round trip gains 2 x US;
#                         SCHED_FIFO priority NETNS_DELAY_RT, default 20, 0 for none);
#                         its PID in netns_delay_pid, its output in LOG
#                         (NETNS_DELAY_ARGS: more netdelay flags, e.g. --forge-port P --forge-after N)
#   netns_delay_stop      end it by its PID (the eth0 devices go with it)
# Run a command in a node's namespace with `ip netns exec "$netns_tag-NAME" CMD` (ip execs CMD:
# started in the background, $! is CMD's PID).
#   netns_delete          delete every namespace made (call it from the caller's exit trap)
#   stop_pids PID...      end the test's processes by PID: TERM, up to 1 s, then KILL, and reap
# shellcheck disable=SC2034 # netns_addr is for the caller
netns_tag=""
netns_list=()
netns_hosts=()
netns_delay_pid=""
declare -A netns_addr=()

netns_can_run() {
    if [[ $(id -u) != 0 ]]; then
        echo "not root: network namespaces need root"
        return 1
    fi
    local c
    for c in ip nft; do
        command -v "$c" >/dev/null || {
            echo "no $c command (iproute2, nftables: scripts/deps.sh test)"
            return 1
        }
    done
}

netns_hub() {
    netns_tag=$1
    ip netns add "$netns_tag-hub" 2>/dev/null || return 1
    netns_list+=("$netns_tag-hub")
    ip -n "$netns_tag-hub" link add br0 type bridge &&
        ip -n "$netns_tag-hub" link set br0 up
}

netns_node() {
    local ns=$netns_tag-$1 i=${#netns_list[@]}
    ip netns add "$ns" || return 1
    netns_list+=("$ns")
    ip -n "$netns_tag-hub" link add "v$i" type veth peer name eth0 netns "$ns" &&
        ip -n "$netns_tag-hub" link set "v$i" master br0 up &&
        ip -n "$ns" addr add "$2/24" dev eth0 &&
        ip -n "$ns" link set eth0 up &&
        ip -n "$ns" link set lo up || return 1
    netns_addr[$1]=$2
}

netns_host() {
    local ns=$netns_tag-$1
    ip netns add "$ns" || return 1
    netns_list+=("$ns")
    ip -n "$ns" link set lo up || return 1
    netns_hosts+=("$1")
    netns_addr[$1]=$2
}

netns_delay_start() {
    local prog=$1 us=$2 log=$3 n args=()
    [[ -z $netns_delay_pid ]] || return 1
    for n in "${netns_hosts[@]}"; do args+=("$netns_tag-$n=${netns_addr[$n]}"); done
    : >"$log" # emptied here, not by the child: a "ready" of an earlier run must not count
    # shellcheck disable=SC2086 # NETNS_DELAY_ARGS: more netdelay flags, word-split
    "$prog" --delay-us "$us" --rt-prio "${NETNS_DELAY_RT:-20}" ${NETNS_DELAY_ARGS:-} "${args[@]}" \
        >>"$log" 2>&1 &
    netns_delay_pid=$!
    for _ in $(seq 100); do
        grep -q "netdelay: ready" "$log" 2>/dev/null && break
        kill -0 "$netns_delay_pid" 2>/dev/null || break
        sleep 0.05
    done
    grep -q "netdelay: ready" "$log" || {
        netns_delay_stop
        return 1
    }
    for n in "${netns_hosts[@]}"; do
        ip -n "$netns_tag-$n" addr add "${netns_addr[$n]}/24" dev eth0 &&
            ip -n "$netns_tag-$n" link set eth0 up || return 1
    done
}

netns_delay_stop() {
    local p=$netns_delay_pid
    [[ -n $p ]] || return 0
    netns_delay_pid=""
    kill -TERM "$p" 2>/dev/null || true
    for _ in $(seq 50); do
        kill -0 "$p" 2>/dev/null || break
        sleep 0.05
    done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
}

netns_loss() {
    ip netns exec "$netns_tag-$1" nft -f - <<EOF
table inet cpsloss {
  chain in { type filter hook input priority 0; policy accept; numgen random mod 1000 < $2 drop; }
}
EOF
}

netns_tbf() {
    ip netns exec "$netns_tag-$1" tc qdisc add dev eth0 root tbf rate "$2" burst 32kb latency 100ms
}

netns_delete() {
    local n
    netns_delay_stop
    for n in "${netns_list[@]}"; do ip netns del "$n" 2>/dev/null || true; done
    netns_list=()
    netns_hosts=()
}

stop_pids() {
    local p
    for p in "$@"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "$@"; do
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
}
