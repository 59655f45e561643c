#!/usr/bin/env bash
# Usage (inside a VM booted by scripts/vm/run-pair.sh, as root; it refuses
# to run elsewhere, i.e. where / is not the VM's 9p "hostroot", unless
# RXE_FORCE=1):
#   source scripts/vm/rxe-up.sh       # sets and exports the RXE_* variables
#   eval "$(scripts/vm/rxe-up.sh)"    # the same, from a child process
#
# Brings Soft-RoCE up: insmods crc32_generic crc32-pclmul udp_tunnel
# ip6_udp_tunnel ib_core ib_uverbs rdma_rxe failover net_failover virtio_net
# (those not loaded yet) from the guest kernel's tree that prepare.sh
# extracted, WORK/root/lib/modules/$(uname -r): WORK is $VM_WORK (set by the
# VM's /init; else the parent of $VM_SHARE), or give the tree's root as
# VM_KROOT. Then `ip link set eth0 up`, adds 10.10.0.$VMID/24, runs
# `rdma link add rxe0 type rxe netdev eth0`, waits for PORT_ACTIVE and for the
# IPv4-mapped GID, and finds that GID's index in
# /sys/class/infiniband/rxe0/ports/1/gids/ (index 1 on 6.1, but never assumed).
# Idempotent: a second call only re-reads the state.
#
# In:  VMID (required), VM_WORK / VM_SHARE / VM_KROOT (see above),
#      RXE_NETDEV (eth0), RXE_IP (10.10.0.$VMID), RXE_TIMEOUT (60 s per wait).
# Out: RXE_DEV=rxe0 RXE_NETDEV RXE_IP RXE_GID RXE_GID_INDEX, exported when
#      sourced and printed as KEY=VALUE lines on stdout either way; a summary
#      line (with the guest uptime) goes to stderr. Returns/exits non-zero on
#      failure.

rxe_up() {
    if [ "${RXE_FORCE:-0}" != 1 ] && ! grep -q '^hostroot / 9p ' /proc/mounts; then
        echo "rxe-up: not inside a scripts/vm VM (/ is not the 9p hostroot); RXE_FORCE=1 overrides" >&2
        return 1
    fi
    # Under TCG every fork+exec costs ~0.1 s: use builtins where we can.
    local vmid=${VMID:?VMID not set (run inside a VM from scripts/vm/run-pair.sh)}
    local work=${VM_WORK:-}
    if [ -z "$work" ] && [ -n "${VM_SHARE:-}" ]; then work=${VM_SHARE%/*}; fi
    local kver kroot moddir
    read -r kver </proc/sys/kernel/osrelease
    kroot=${VM_KROOT:-$work/root}
    moddir=$kroot/lib/modules/$kver
    local netdev=${RXE_NETDEV:-eth0} ip=${RXE_IP:-10.10.0.$vmid} limit=${RXE_TIMEOUT:-60}
    local dev=rxe0 m rel
    local mods=(crc32_generic crc32-pclmul udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe
        failover net_failover virtio_net)

    if [ ! -f "$moddir/modules.dep" ]; then
        echo "rxe-up: no module tree at $moddir (set VM_WORK or VM_KROOT)" >&2
        return 1
    fi
    # name -> path in the tree, one awk over modules.dep for all of them
    local -A path=()
    while read -r m rel; do path[$m]=$rel; done < <(awk -F: -v want="${mods[*]}" '
        BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) need[w[i]] = 1 }
        { f = $1; sub(/.*\//, "", f); sub(/\.ko(\.[a-z]+)?$/, "", f); if (f in need) print f, $1 }' "$moddir/modules.dep")
    for m in "${mods[@]}"; do
        [ -d "/sys/module/${m//-/_}" ] && continue
        rel=${path[$m]:-}
        if [ -z "$rel" ]; then
            echo "rxe-up: module $m not in $moddir/modules.dep (built in?)" >&2
            continue
        fi
        if ! insmod "$moddir/$rel"; then
            case "$m" in
                crc32-pclmul) echo "rxe-up: $m did not load (no PCLMUL?), using crc32_generic" >&2 ;;
                *) echo "rxe-up: insmod $moddir/$rel failed" >&2; return 1 ;;
            esac
        fi
    done

    # _rxe_wait_for SECONDS COMMAND...: poll every 0.1 s until COMMAND succeeds
    _rxe_wait_for() {
        local n=$(($1 * 10))
        shift
        while ! "$@" 2>/dev/null; do
            n=$((n - 1))
            [ "$n" -gt 0 ] || return 1
            sleep 0.1
        done
    }
    _rxe_wait_for "$limit" test -d "/sys/class/net/$netdev" ||
        { echo "rxe-up: no $netdev after ${limit}s" >&2; return 1; }
    # Jumbo frames: rxe's active MTU follows the netdev's, and 9000 gives
    # 4096, the MTU a vrdma guest's port has (UD datagrams up to 4096 bytes
    # through the device, as without it).
    ip link set "$netdev" mtu 9000 || echo "rxe-up: $netdev keeps its MTU (rxe's will be smaller)" >&2
    ip link set "$netdev" up || return 1
    ip addr replace "$ip/24" dev "$netdev" || return 1
    if [ ! -d "/sys/class/infiniband/$dev" ]; then
        rdma link add "$dev" type rxe netdev "$netdev" || return 1
    fi
    _rxe_port_active() {
        local st
        read -r st <"/sys/class/infiniband/$dev/ports/1/state" && [[ "$st" == *ACTIVE* ]]
    }
    _rxe_wait_for "$limit" _rxe_port_active ||
        { echo "rxe-up: $dev port 1 not ACTIVE after ${limit}s: $(cat "/sys/class/infiniband/$dev/ports/1/state")" >&2; return 1; }

    # The IPv4-mapped GID of $ip, e.g. 0000:0000:0000:0000:0000:ffff:0a0a:0001
    local a b c d want idx=
    IFS=. read -r a b c d <<<"$ip"
    want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d")
    _rxe_find_gid() {
        local g i gid type
        for g in "/sys/class/infiniband/$dev/ports/1/gids/"*; do
            gid=
            read -r gid <"$g" 2>/dev/null || true
            [ "$gid" = "$want" ] || continue
            i=${g##*/}
            type=
            read -r type <"/sys/class/infiniband/$dev/ports/1/gid_attrs/types/$i" 2>/dev/null || true
            [ -z "$type" ] || [ "$type" = "RoCE v2" ] || continue
            idx=$i
            return 0
        done
        return 1
    }
    _rxe_wait_for "$limit" _rxe_find_gid ||
        { echo "rxe-up: no GID $want on $dev after ${limit}s" >&2; return 1; }

    local up
    read -r up </proc/uptime
    export RXE_DEV=$dev RXE_NETDEV=$netdev RXE_IP=$ip RXE_GID=$want RXE_GID_INDEX=$idx
    echo "RXE_DEV=$RXE_DEV"
    echo "RXE_NETDEV=$RXE_NETDEV"
    echo "RXE_IP=$RXE_IP"
    echo "RXE_GID=$RXE_GID"
    echo "RXE_GID_INDEX=$RXE_GID_INDEX"
    echo "rxe-up: vm$vmid $dev ACTIVE on $netdev $ip/24, IPv4 GID index $idx, uptime ${up%% *} s" >&2
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -euo pipefail
    case "${1:-}" in -h | --help) sed -n '2,/^$/s/^# \{0,1\}//p' "$0"; exit 0 ;; esac
    rxe_up
else
    rxe_up
fi
