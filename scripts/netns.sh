#!/usr/bin/env bash
# Several "hosts" on one machine: network namespaces NAME-0 .. NAME-(N-1),
# each with one interface eth0 (10.77.0.(i+1)/24) plugged into a bridge that
# lives in its own namespace NAME-sw, so nothing is added to the root
# namespace. Needs root (or CAP_NET_ADMIN) and iproute2; nftables for the
# firewall tests.
#
#   scripts/netns.sh up NAME N          remove stale NAME-* namespaces, then create N nodes
#   scripts/netns.sh down NAME          remove them (their processes, /etc/netns/NAME-*)
#   scripts/netns.sh run NAME N -- CMD  up, run CMD, and always down (trap on EXIT)
#   scripts/netns.sh check              exit 0 when namespaces can be created here
#
# Run a command on node i: ip netns exec NAME-i CMD (with `unshare --uts` and
# `hostname NAME-ni` for a host name of its own). A file /etc/netns/NAME-i/hosts
# replaces /etc/hosts there (ip netns exec bind-mounts it): name resolution
# per node. `up` exits 77 with a message on stderr when namespaces cannot be
# created (tests then skip).
set -euo pipefail

SUBNET=10.77.0

die() { echo "netns.sh: $*" >&2; exit 1; }

nodes_of() { # the namespaces of NAME, switch included
    ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-(sw|[0-9]+)\$" || true
}

down() {
    local name=$1 ns pid
    for ns in $(nodes_of "$name"); do
        # Processes we started there (tests kill theirs; this catches leftovers).
        for pid in $(ip netns pids "$ns" 2>/dev/null); do
            kill -9 "$pid" 2>/dev/null || true
        done
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf /etc/netns/"$name"-[0-9]* 2>/dev/null || true
}

check() {
    local probe="rlprobe-$$"
    if ! out=$(ip netns add "$probe" 2>&1); then
        echo "network namespaces cannot be created here: $out" >&2
        return 77
    fi
    ip netns del "$probe"
}

up() {
    local name=$1 n=$2 i sw
    [[ $n =~ ^[0-9]+$ && $n -ge 1 && $n -le 200 ]] || die "N must be 1..200, not $n"
    command -v ip >/dev/null || { echo "network namespaces cannot be created here: no ip (iproute2)" >&2; exit 77; }
    down "$name"
    check || exit 77
    sw="$name-sw"
    ip netns add "$sw"
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    for ((i = 0; i < n; i++)); do
        local ns="$name-$i"
        ip netns add "$ns"
        ip -n "$sw" link add "p$i" type veth peer name eth0 netns "$ns"
        ip -n "$sw" link set "p$i" master br0
        ip -n "$sw" link set "p$i" up
        ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
    done
}

[[ $# -ge 1 ]] || die "usage: $0 up NAME N | down NAME | run NAME N -- CMD... | check"
case $1 in
    up) [[ $# -eq 3 ]] || die "usage: $0 up NAME N"; up "$2" "$3" ;;
    down) [[ $# -eq 2 ]] || die "usage: $0 down NAME"; down "$2" ;;
    check) check ;;
    run)
        [[ $# -ge 5 && $4 == -- ]] || die "usage: $0 run NAME N -- CMD..."
        name=$2 n=$3
        shift 4
        trap 'down "$name"' EXIT
        up "$name" "$n"
        "$@"
        ;;
    *) die "unknown command $1" ;;
esac
