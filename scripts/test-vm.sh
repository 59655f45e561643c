#!/usr/bin/env bash
# Usage: scripts/test-vm.sh [--help]
#
# VM guests (docs/protocol.md "VM tenants"): starts two vrdma-shims joined
# by the TCP fabric, each in a network namespace of its own (two hosts):
# host A's serves guest h and the VM guests vm1 and vm2, host B's guest f.
# Boots two QEMU VMs (TCG, scripts/vm/) each with an ivshmem-doorbell
# device whose server is host A's shim (vmN's RUN_DIR/vmN/ivshmem.sock),
# and runs test/vm/vm-device.sh in each. With the VM's stock kernel and no
# vrdma module, each VM finds the device, reads the device page the shim
# wrote (its guest's name and LID) and rings the shim through the device's
# Doorbell register, which the shim counts; its agent (vrdma-vm-agent)
# serves the device in the VM; `vrdma-run -- ibv_devinfo -v` shows vrdma0
# with the guest's LID; the rc, ud and srq pingpongs, polling and in event
# mode (-e), run between the two VMs with their data checked, and the six
# perftest programs at 8 B and 64 KiB; then VM 2's QEMU is killed (SIGKILL, from here) in the middle of
# an rc pingpong with VM 1, whose pingpong must end with an error; the shim
# must free VM 2's context and its QPs and move VM 1's QP to error. Then
# the same six pingpongs between VM 1 and host guest h (its clients run
# here; VM 1's user network carries the connection data): the shim still
# serves the others; then the rc pingpong between VM 1 and guest f of host
# B, across the fabric. Then the verbs suite runs in VM 1.
# Last, once a process in VM 1 waits on vrdma0's async events, host A's
# shim is killed with SIGKILL: that process must get
# IBV_EVENT_DEVICE_FATAL, and VM 1's agent must exit 1. Then checks, from
# the shims' logs, that host A's saw each QEMU connect and VM 2's go, and
# that host B's had the fabric up and stops cleanly. Each check prints
# "ok NAME" or "FAIL NAME: why"; exit status 0 when all pass. Needs root
# (network namespaces).
#
# A command beside ./scripts/test.sh (README), as scripts/test-hca.sh is:
# the VMs need a kernel package download and emulated CPU.
#
# Env: VRDMA_BUILD_DIR  the build to test (default: build/; built if missing)
#      VRDMA_VM_WORK    where the kernel, initramfs and results go
#                       (default: /var/tmp/vrdma-vm; kept for the next run)
set -euo pipefail

# shellcheck source=lib/vm_test.sh
source "$(dirname "$0")/lib/vm_test.sh"
vm_test_start test-vm "$0" "$@"
mkdir -p "$work/share"
rm -f "$work"/share/vm*.results

run=$(mktemp -d /tmp/vrdma-test-vm.XXXXXX)
log=$run.log
# Two hosts of a fabric, each a network namespace with its shim, joined by
# a veth pair: host A serves guest h and the VM guests, host B guest f.
# QEMU and the guests' processes stay in this namespace: they reach their
# shim through its run directory, which namespaces do not separate.
ns_a=vrdma-vm-$$-a ns_b=vrdma-vm-$$-b
far=$run.far
far_log=$run.far.log
shim="" far_shim=""
cleanup() {
    kill "$shim" "$far_shim" 2>/dev/null || true
    wait "$shim" "$far_shim" 2>/dev/null || true
    # A shim killed leaves its /dev/infiniband links (pointing to /dev/null).
    local link
    for link in "$run"/*/sys/class/infiniband_verbs/uverbs_vrdma_*; do
        [ -e "$link" ] || continue
        link=/dev/infiniband/$(basename "$link")
        [ "$(readlink "$link" 2>/dev/null)" = /dev/null ] && rm -f "$link"
    done
    ip netns del "$ns_a" 2>/dev/null || true
    ip netns del "$ns_b" 2>/dev/null || true
    rm -rf "$run" "$far" "$log" "$far_log" "$run.host" "$run.far-client" "$run.kill" "$run.shimkill" "$run.pair" \
        "$run.key" "$run.hang"
}
trap cleanup EXIT
ip netns add "$ns_a" && ip netns add "$ns_b"
ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up
ip link add "vrvm$$a" netns "$ns_a" type veth peer name "vrvm$$b" netns "$ns_b"
ip -n "$ns_a" addr add 10.254.0.1/30 dev "vrvm$$a" && ip -n "$ns_a" link set "vrvm$$a" up
ip -n "$ns_b" addr add 10.254.0.2/30 dev "vrvm$$b" && ip -n "$ns_b" link set "vrvm$$b" up
(umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$run.key" && echo >>"$run.key")
mkdir -p "$far"
ip netns exec "$ns_a" "$build/src/shim/vrdma-shim" --run-dir "$run" --guest h --guest vm1:vm \
    --guest vm2:vm:vm-memory=16M --fabric-listen 10.254.0.1:7400 --fabric-peer 10.254.0.2:7400 \
    --fabric-key "$run.key" >"$log" 2>&1 &
shim=$!
ip netns exec "$ns_b" "$build/src/shim/vrdma-shim" --run-dir "$far" --guest f --lid-base 10 \
    --fabric-listen 10.254.0.2:7400 --fabric-peer 10.254.0.1:7400 --fabric-key "$run.key" >"$far_log" 2>&1 &
far_shim=$!
for _ in $(seq 100); do [ -e "$run/ready" ] && [ -e "$far/ready" ] && break; sleep 0.1; done
if [ ! -e "$run/ready" ] || [ ! -e "$far/ready" ]; then
    cat "$log" "$far_log" >&2
    echo "test-vm: the shims did not start" >&2
    exit 1
fi

device() { echo "-chardev socket,path=$run/vm$1/ivshmem.sock,id=vrdma -device ivshmem-doorbell,chardev=vrdma,vectors=2"; }
# VM 1's second NIC: QEMU's user network, its ports 18516 and 18518
# forwarded from the host, for the connection data of the pingpongs with
# guest h (same host) and guest f (across the fabric).
hp=$((30000 + $$ % 20000))
fp=$((hp + 1))
user_nic="-netdev user,id=u,hostfwd=tcp:127.0.0.1:$hp-10.0.2.15:18516,hostfwd=tcp:127.0.0.1:$fp-10.0.2.15:18518"
user_nic+=" -device virtio-net-pci,netdev=u,mac=52:54:00:00:01:01"
echo "test-vm: booting two VMs, each with its VM guest's device; each runs test/vm/vm-device.sh"
status=0
# pingpong_client RUN_DIR GUEST PORT OUT PROGRAM ARGS...: GUEST's client of
# VM 1's server behind the forwarded PORT, with --chk; "ok PROGRAM ARGS:
# its bytes line" or "FAIL ..." appended to OUT. Tried until VM 1 listens
# (the forwarded port accepts before it does).
pingpong_client() {
    local dir=$1 guest=$2 port=$3 res=$4 out=""
    shift 4
    for _ in $(seq 300); do
        if out=$("$build/tools/vrdma-run" --run-dir "$dir" --guest "$guest" -- "$@" -d vrdma0 --chk -p "$port" \
            127.0.0.1 2>&1) && grep -q ' bytes in ' <<<"$out"; then
            echo "ok $* with VM 1 (client): $(grep ' bytes in ' <<<"$out")" >>"$res"
            return 0
        fi
        sleep 1
    done
    echo "FAIL $*: $(tail -2 <<<"$out" | tr '\n' ' ')" >>"$res"
}
# shellcheck source=../test/vm/vm-lib.sh
source "$root/test/vm/vm-lib.sh"  # vm_host_pingpongs
: >"$run.host"
(
    for p in "${vm_host_pingpongs[@]}"; do
        # shellcheck disable=SC2086
        pingpong_client "$run" h "$hp" "$run.host" $p
    done
) &
client=$!
: >"$run.far-client"
pingpong_client "$far" f "$fp" "$run.far-client" ibv_rc_pingpong -n 200 -s 4096 &
far_client=$!
# The killer of VM 2's QEMU: once VM 2 says its transfer to VM 1 runs,
# SIGKILL to the QEMU the shim named when it connected.
rm -f "$work/share/vm2.transfer"
(
    for _ in $(seq 600); do [ -e "$work/share/vm2.transfer" ] && break; sleep 0.5; done
    [ -e "$work/share/vm2.transfer" ] || { echo "VM 2 never said its transfer runs" >"$run.kill"; exit 0; }
    sleep 2
    pid=$(sed -n 's/.*guest vm2: QEMU pid \([0-9]*\) connected.*/\1/p' "$log" | tail -1)
    if [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; then
        echo "killed VM 2's QEMU (pid $pid) with SIGKILL" >"$run.kill"
    else
        echo "no QEMU pid of vm2 to kill in the shim's log" >"$run.kill"
    fi
) &
killer=$!
# The killer of the shim: once VM 1 says a process there waits on vrdma0's
# async events.
rm -f "$work/share/vm1.waiting"
(
    for _ in $(seq 1200); do [ -e "$work/share/vm1.waiting" ] && break; sleep 0.5; done
    [ -e "$work/share/vm1.waiting" ] || { echo "VM 1 never said its waiter runs" >"$run.shimkill"; exit 0; }
    kill -KILL "$shim" && echo "killed the shim (pid $shim) with SIGKILL" >"$run.shimkill"
) &
shimkiller=$!
# What the shim saw while a program in a VM hung: test/vm/vm-device.sh's
# hang_dump asks through vmN.hang.ready, and waits for vmN.hang.done.
rm -f "$work"/share/vm*.hang*
(
    while :; do
        for n in 1 2; do
            f=$work/share/vm$n.hang
            [ -e "$f.ready" ] && [ ! -e "$f.done" ] || continue
            {
                echo "=== the shim when VM $n's program hung"
                "$build/tools/vrdmactl" --run-dir "$run" counters || true
                "$build/tools/vrdmactl" --run-dir "$run" load || true
                timeout 30 gdb -p "$shim" -batch -ex "thread apply all bt" | grep -E '^(Thread|#)' || true
            } >>"$run.hang" 2>&1
            touch "$f.done"
        done
        sleep 0.5
    done
) &
hangwatch=$!
# VM 2 is killed on purpose: run-pair.sh reports it as failed (no vm2.rc);
# VM 1 must end well, with the grace to do so after VM 2 went.
VM_PEER_GRACE=240 VM_QEMU_ARGS1="$(device 1) $user_nic" VM_QEMU_ARGS2=$(device 2) \
    "$root/scripts/vm/run-pair.sh" --timeout 300 --gargs "$build" "$work" "$root/test/vm/vm-device.sh" "$root/test/vm/vm-device.sh" \
    >"$run.pair" 2>&1 || true
kill "$client" "$far_client" "$killer" "$shimkiller" "$hangwatch" 2>/dev/null || true
wait "$client" "$far_client" "$killer" "$shimkiller" "$hangwatch" 2>/dev/null || true
for n in 1 2; do
    echo "--- VM $n"
    cat "$work/share/vm$n.results" 2>/dev/null || echo "(no results: see $work/share/vm$n.log)"
    grep -q '^FAIL' "$work/share/vm$n.results" 2>/dev/null && status=1
done
if [ "$(cat "$work/share/vm1.rc" 2>/dev/null)" != 0 ]; then
    echo "FAIL vm1: its script did not end with 0"
    status=1
fi
if grep -q '^ok transfer to VM 1 running' "$work/share/vm2.results" 2>/dev/null && [ ! -e "$work/share/vm2.rc" ]; then
    echo "ok VM 2: $(cat "$run.kill" 2>/dev/null) in the middle of its transfer"
else
    echo "FAIL vm2_kill: $(cat "$run.kill" 2>/dev/null || echo 'no kill'); vm2.rc: $(cat "$work/share/vm2.rc" 2>/dev/null || echo none)"
    status=1
fi
[ "$status" = 0 ] || sed 's/^/  run-pair| /' "$run.pair"
# A program that hung and passed on its second run still shows here.
for f in "$work/share/vm1.hang" "$work/share/vm2.hang" "$run.hang"; do
    if [ -s "$f" ]; then
        echo "--- what hung: $(basename "$f")"
        sed 's/^/  /' "$f"
    fi
done

for side in "host guest h:$run.host:${#vm_host_pingpongs[@]}" "guest f, across the fabric:$run.far-client:1"; do
    IFS=: read -r who out want <<<"$side"
    echo "--- $who"
    cat "$out"
    if grep -q '^FAIL' "$out" || [ "$(grep -c '^ok' "$out")" != "$want" ]; then
        echo "FAIL pingpongs with $who: $(grep -c '^ok' "$out") of $want passed"
        status=1
    fi
done
echo "--- the shim"
check() {
    if grep -q "$2" "$log"; then echo "ok $1"; else echo "FAIL $1: no '$2' in the shim's log"; status=1; fi
}
check "vm1 connected" 'guest vm1: QEMU pid [0-9]* connected: the VM.s device has 64 MiB of memory, 2 vectors'
check "vm2 connected" 'guest vm2: QEMU pid [0-9]* connected: the VM.s device has 16 MiB of memory, 2 vectors'
check "vm2 gone" 'guest vm2: QEMU pid [0-9]* gone (its socket closed)'
check "vm2's context freed with its QP" 'guest vm2: context [0-9]* detached ([1-9][0-9]* QPs, [0-9]* MRs freed)'
check "vm1's QP to error" 'guest vm1: QP [0-9]* to error: its peer QP [0-9]* vanished'
grep -q '^killed' "$run.shimkill" 2>/dev/null || kill -TERM "$shim" 2>/dev/null
{ wait "$shim"; } 2>/dev/null && src=0 || src=$?  # no "Killed" line from bash
if [ "$src" = 137 ]; then echo "ok $(cat "$run.shimkill")"; else
    echo "FAIL shim_kill: $(cat "$run.shimkill" 2>/dev/null || echo 'not killed'); its exit status $src"
    status=1
fi
echo "--- the shim of host B (guest f)"
if grep -q 'fabric: peer .* up' "$far_log"; then echo "ok fabric: $(grep -m1 'fabric: peer .* up' "$far_log")"; else
    echo "FAIL fabric: no 'fabric: peer ... up' in host B's log"
    status=1
fi
kill -TERM "$far_shim"
if wait "$far_shim"; then echo "ok host B's shim stopped cleanly"; else
    echo "FAIL far_shim_exit: see its log below"
    sed 's/^/  shim B| /' "$far_log" | tail -n 20
    status=1
fi
if [ "$status" = 0 ]; then echo "test-vm: all passed"; else
    sed 's/^/  shim| /' "$log" | tail -n 30
    echo "test-vm: FAILED"
fi
exit "$status"
