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
# Run a command in a node's namespace with `ip netns exec "$netns_tag-NAME" CMD` (ip execs CMD:
# started in the background, $! is CMD's PID).
#   netns_delete          delete every namespace made (call it from the caller's exit trap)
# shellcheck disable=SC2034 # netns_addr is for the caller
netns_tag=""
netns_list=()
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
    for n in "${netns_list[@]}"; do ip netns del "$n" 2>/dev/null || true; done
    netns_list=()
}
