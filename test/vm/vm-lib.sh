# Helpers of the scripts that run inside the VMs of scripts/test-vm.sh and
# scripts/bench-vm.sh (booted by scripts/vm/run-pair.sh). Source it.
# shellcheck shell=bash

# The pingpongs VM 1 serves to guest h of its host (scripts/test-vm.sh
# runs the clients), in this order, each with its data checked (--chk):
# the program and its arguments, polling and in event mode (-e).
# shellcheck disable=SC2034
vm_host_pingpongs=(
    "ibv_rc_pingpong -n 200 -s 4096"
    "ibv_rc_pingpong -n 200 -s 4096 -e"
    "ibv_ud_pingpong -n 200 -s 1024"
    "ibv_ud_pingpong -n 200 -s 1024 -e"
    "ibv_srq_pingpong -n 100 -s 4096 -q 4"
    "ibv_srq_pingpong -n 100 -s 4096 -q 4 -e"
)

# vm_net_up: the virtio NICs with the VM's stock modules (no RDMA ones):
# eth0, the wire between the VMs, as 10.10.0.$VMID/24; eth1, QEMU's user
# network when the VM has one, as 10.0.2.15/24 (the host is 10.0.2.2).
vm_net_up() {
    local kver moddir m rel
    read -r kver </proc/sys/kernel/osrelease
    moddir=$VM_WORK/root/lib/modules/$kver
    for m in failover net_failover virtio_net; do
        rel=$(awk -F: -v m="$m" '{ n = $1; sub(".*/", "", n); sub("[.]ko.*", "", n); gsub("-", "_", n)
                                   if (n == m) { print $1; exit } }' "$moddir/modules.dep")
        [ -n "$rel" ] && insmod "$moddir/$rel" 2>/dev/null
    done
    ip link set eth0 up && ip addr add "10.10.0.$VMID/24" dev eth0 || return 1
    if [ -e /sys/class/net/eth1 ]; then
        ip link set eth1 up && ip addr add 10.0.2.15/24 dev eth1 || return 1
    fi
}

# vm_agent_start BUILD: starts vrdma-vm-agent (run dir /run/vrdma), waits
# for it; sets `agent` to its pid. False, with its log on stderr, if it
# did not get ready within 10 s.
vm_agent_start() {
    "$1/src/shim/vrdma-vm-agent" --run-dir /run/vrdma >/tmp/agent.log 2>&1 &
    agent=$!
    for _ in $(seq 100); do [ -e /run/vrdma/ready ] && return 0; sleep 0.1; done
    cat /tmp/agent.log >&2
    return 1
}
