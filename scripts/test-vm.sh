#!/usr/bin/env bash
# Usage: scripts/test-vm.sh [--help]
#
# VM guests (docs/protocol.md "VM tenants"): starts a vrdma-shim on this
# host serving guest h and the VM guests vm1 and vm2, boots two QEMU VMs
# (TCG, scripts/vm/) each with an ivshmem-doorbell device whose server is
# the shim (vmN's RUN_DIR/vmN/ivshmem.sock), and runs test/vm/vm-device.sh
# in each. With the VM's stock kernel and no vrdma module, each VM finds
# the device, reads the device page the shim wrote (its guest's name and
# LID) and rings the shim through the device's Doorbell register, which
# the shim counts; its agent (vrdma-vm-agent) serves the device in the VM;
# `vrdma-run -- ibv_devinfo -v` shows vrdma0 with the guest's LID; the rc,
# ud and srq pingpongs run between the two VMs with their data checked,
# and the six perftest programs at 8 B and 64 KiB; then VM 2's QEMU is
# killed (SIGKILL, from here) in the middle of an rc pingpong with VM 1,
# whose pingpong must end with an error; the shim must free VM 2's
# context and its QPs and move VM 1's QP to error. Then the rc
# pingpong between VM 1 and host guest h (its client runs here; VM 1's user
# network carries the connection data): the shim still serves the others.
# Last, once a process in VM 1 waits on vrdma0's async events, the shim is
# killed with SIGKILL: that process must get IBV_EVENT_DEVICE_FATAL, and
# VM 1's agent must exit 1. Then checks, from the shim's log, that it saw
# each QEMU connect and VM 2's go. Each check prints "ok NAME" or "FAIL NAME: why"; exit status 0
# when all pass.
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
"$build/src/shim/vrdma-shim" --run-dir "$run" --guest h --guest vm1:vm --guest vm2:vm:vm-memory=16M >"$log" 2>&1 &
shim=$!
cleanup() { kill "$shim" 2>/dev/null || true; rm -rf "$run" "$log" "$run.host" "$run.kill" "$run.shimkill" "$run.pair"; }
trap cleanup EXIT
for _ in $(seq 100); do [ -e "$run/ready" ] && break; sleep 0.1; done
[ -e "$run/ready" ] || { cat "$log" >&2; echo "test-vm: the shim did not start" >&2; exit 1; }

device() { echo "-chardev socket,path=$run/vm$1/ivshmem.sock,id=vrdma -device ivshmem-doorbell,chardev=vrdma,vectors=2"; }
# VM 1's second NIC: QEMU's user network, its port 18516 forwarded from the
# host, for the connection data of the host guest's pingpong.
hp=$((30000 + $$ % 20000))
user_nic="-netdev user,id=u,hostfwd=tcp:127.0.0.1:$hp-10.0.2.15:18516 -device virtio-net-pci,netdev=u,mac=52:54:00:00:01:01"
echo "test-vm: booting two VMs, each with its VM guest's device; each runs test/vm/vm-device.sh"
status=0
# Guest h of this host, the client of VM 1's second server: tried until VM
# 1 listens (the forwarded port accepts before it does).
(
    for _ in $(seq 200); do
        if out=$("$build/tools/vrdma-run" --run-dir "$run" --guest h -- ibv_rc_pingpong -d vrdma0 -n 200 -s 4096 \
            --chk -p "$hp" 127.0.0.1 2>&1); then
            echo "$out" >"$run.host"
            exit 0
        fi
        sleep 1
    done
    echo "$out" >"$run.host"
) &
client=$!
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
# VM 2 is killed on purpose: run-pair.sh reports it as failed (no vm2.rc);
# VM 1 must end well, with the grace to do so after VM 2 went.
VM_PEER_GRACE=240 VM_QEMU_ARGS1="$(device 1) $user_nic" VM_QEMU_ARGS2=$(device 2) \
    "$root/scripts/vm/run-pair.sh" --timeout 300 --gargs "$build" "$work" "$root/test/vm/vm-device.sh" "$root/test/vm/vm-device.sh" \
    >"$run.pair" 2>&1 || true
kill "$client" "$killer" "$shimkiller" 2>/dev/null || true
wait "$client" "$killer" "$shimkiller" 2>/dev/null || true
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

echo "--- host guest h"
if grep -q '1638400 bytes in' "$run.host" 2>/dev/null; then
    echo "ok ibv_rc_pingpong with VM 1 (client): $(grep 'bytes in' "$run.host")"
else
    echo "FAIL rc_pingpong_host: $(tail -3 "$run.host" 2>/dev/null)"
    status=1
fi
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
wait "$shim" && src=0 || src=$?
if [ "$src" = 137 ]; then echo "ok $(cat "$run.shimkill")"; else
    echo "FAIL shim_kill: $(cat "$run.shimkill" 2>/dev/null || echo 'not killed'); its exit status $src"
    status=1
fi
if [ "$status" = 0 ]; then echo "test-vm: all passed"; else
    sed 's/^/  shim| /' "$log" | tail -n 30
    echo "test-vm: FAILED"
fi
exit "$status"
