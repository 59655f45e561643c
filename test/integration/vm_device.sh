#!/usr/bin/env bash
# A VM guest's device, without a VM (docs/protocol.md "VM tenants"): the
# shim is the ivshmem server of RUN_DIR/NAME/ivshmem.sock, and
# vrdma-ivshmem-client plays QEMU's part of the protocol.
#  (a) The handshake: protocol version 0, the VM's ID, the memory (sealed
#      against resizing), the shim's and the VM's vectors; the device page
#      names the guest and its LID; a ring from the "VM" is counted by the
#      shim in the page.
#      Then, as the VM's agent would through the mailbox: regions and four
#      attached contexts whose command rings the shim serves (QueryPort
#      answers the guest's LID), what the mailbox refuses, and every owner
#      closed, which frees all the memory again.
#  (b) One QEMU at a time: a second one is refused while the first holds
#      the device.
#  (c) The first one's going frees the device: the shim logs it, and the
#      next QEMU gets new memory (its count starts at 0 again).
#  (d) Bad sizes are refused at the command line.
#  (e) A hostile VM: thousands of random mailbox requests, random bytes over
#      its contexts' control blocks and command slots, replays and
#      half-written requests, each rung; the shim answers every request,
#      still serves a well-formed owner afterwards, and stops cleanly (under
#      ASan in the ASan run of the suite).
source "$(dirname "$0")/lib.sh"
CLIENT="$VRDMA_BUILD_DIR/test/integration/vrdma-ivshmem-client"

start_shim a vm1:vm:vm-memory=8M
sock="$RUN_DIR/vm1/ivshmem.sock"
[ -S "$sock" ] || fail "no $sock"
[ ! -e "$RUN_DIR/a/ivshmem.sock" ] || fail "guest a, not a VM guest, has an ivshmem.sock"

note "(a) the handshake and a ring"
out=$("$CLIENT" "$sock" --rings 3 --contexts 4) || fail "the client failed: $out"
echo "$out" | sed 's/^/  /'
grep -q '^protocol: version 0, vm id 1, memory fd, 2 shim vectors, 2 own vectors$' <<<"$out" || fail "protocol"
grep -q '^device: guest vm1 lid 2 memory 8 MiB state 0 kicks 0$' <<<"$out" || fail "device page"
grep -q '^rings: 3, the shim counted 3$' <<<"$out" || fail "rings"
grep -q '^contexts: 4 attached, each QueryPort answered lid 2 ACTIVE$' <<<"$out" || fail "contexts"
grep -q '^refused: another owner.s region EINVAL, an attached arena EBUSY, a second attach EBUSY, more than the memory ENOMEM, not pages EINVAL, owner 0 EINVAL, op 77 EINVAL$' <<<"$out" ||
    fail "refusals"
grep -q '^closed: every owner.s context and regions freed, the memory whole again$' <<<"$out" || fail "close"
[ "$(grep -c 'guest vm1: QEMU pid [0-9]*: context [0-9]* attached' "$SHIM_LOG")" = 4 ] || fail "attach not logged"

note "(b) a second QEMU while one holds the device"
"$CLIENT" "$sock" --hold 3 > "$RUN_DIR.first" &
first=$!
for _ in $(seq 100); do grep -q '^rings' "$RUN_DIR.first" 2>/dev/null && break; sleep 0.05; done
rc=0
out=$("$CLIENT" "$sock") || rc=$?
[ "$rc" = 3 ] && [ "$out" = refused ] || fail "a second QEMU was not refused (exit $rc: $out)"
grep -q 'a second QEMU (pid [0-9]*) connected to its ivshmem.sock while QEMU pid [0-9]* serves the VM: refused' \
    "$SHIM_LOG" || fail "the refusal is not logged"
echo "  refused, and logged"
wait "$first" || fail "the first client failed"

note "(c) the device is free again, with new memory"
for _ in $(seq 100); do grep -q 'guest vm1: QEMU pid [0-9]* gone (its socket closed)' "$SHIM_LOG" && break; sleep 0.05; done
grep -q 'guest vm1: QEMU pid [0-9]* gone (its socket closed): the VM.s device is free' "$SHIM_LOG" ||
    fail "the first QEMU's going is not logged"
out=$("$CLIENT" "$sock") || fail "a new QEMU was not served: $out"
grep -q 'kicks 0$' <<<"$out" || fail "the new QEMU got the old memory: $out"
echo "  served again, new memory"

note "(d) bad sizes"
for bad in 5M 2M 128G x; do
    rc=0
    msg=$("$SHIM" --run-dir "$RUN_DIR.bad" --guest "v:vm-memory=$bad" 2>&1) || rc=$?
    [ "$rc" = 2 ] && grep -q 'vm-memory= wants a power of two from 4M to 64G' <<<"$msg" ||
        fail "vm-memory=$bad: exit $rc: $msg"
done
echo "  5M 2M 128G x: refused (exit 2)"
note "(e) a hostile VM"
out=$("$CLIENT" "$sock" --rings 1 --hostile 3000) || fail "the hostile client failed: $out"
grep '^hostile' <<<"$out" | sed 's/^/  /'
grep -q '^hostile: 3000 rounds .* the shim still serves$' <<<"$out" || fail "hostile: $out"
rm -f "$RUN_DIR.first"
echo "vm_device: ok"
