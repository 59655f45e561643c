#!/usr/bin/env bash
# Usage: scripts/test-hca.sh [--help]
#
# The HCA transport on a real verbs device: boots two QEMU VMs (TCG) with
# Soft-RoCE (rdma_rxe) on one virtual wire (scripts/vm/), each running a
# vrdma-shim with --hca rxe0 and one guest, the two shims joined into one
# fabric; then runs across the two guests ibv_rc_pingpong, ibv_srq_pingpong
# and ibv_ud_pingpong with their data checked and perftest (write, read,
# send, atomic bandwidth; write, send and read latency; ib_send_bw -c UD),
# checks that the device carried the traffic and that the shims' CPU copied
# no payload (vrdmactl transports), runs the verbs suite through each VM's
# device, and prints perftest run directly on rxe0 in the same VMs beside
# the figures through vrdma.
# Then the failure cases (test/hca/vm-failures.sh): a shim killed under
# traffic (its peer's client gets IBV_WC_RETRY_EXC_ERR), a guest killed
# (its device QPs and MRs freed, its peer gets an error), the link taken
# down (the client gets an error, the guest IBV_EVENT_PORT_ERR, the shim
# still serves its local guests).
# Each check prints "ok NAME" or "FAIL NAME: why". Exit status 0 when all
# pass, 1 otherwise.
#
# A second command beside ./scripts/test.sh (README): the VMs need a
# kernel package download and a few minutes of emulated CPU.
#
# Env: VRDMA_BUILD_DIR  the build to test (default: build/; built if missing)
#      VRDMA_VM_WORK    where the kernel, initramfs and results go
#                       (default: /var/tmp/vrdma-vm; kept for the next run)
set -euo pipefail

# shellcheck source=lib/vm_test.sh
source "$(dirname "$0")/lib/vm_test.sh"
vm_test_start test-hca "$0" "$@"

mkdir -p "$work/share"
head -c 32 /dev/urandom | base64 >"$work/share/fabric.key"
chmod 600 "$work/share/fabric.key"
rm -f "$work"/share/vm*.results "$work/share/failures.ready"

echo "test-hca: booting two VMs with rxe0; each runs test/hca/vm-guest.sh (a few minutes under TCG)"
status=0
"$root/scripts/vm/run-pair.sh" --timeout 900 --gargs "$build" "$work" \
    "$root/test/hca/vm-guest.sh" "$root/test/hca/vm-guest.sh" || status=1
for n in 1 2; do
    echo "--- VM $n"
    cat "$work/share/vm$n.results" 2>/dev/null || echo "(no results: see $work/share/vm$n.log)"
done
if [ "$status" = 0 ]; then echo "test-hca: all passed"; else echo "test-hca: FAILED"; fi
exit "$status"
