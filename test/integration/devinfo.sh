#!/usr/bin/env bash
# ibv_devinfo -v in a guest shows vrdma0 as the only device, port 1 ACTIVE on
# the InfiniBand link layer with a LID and a GID, and the limits the shim
# enforces.
source "$(dirname "$0")/lib.sh"
start_shim a b

list="$(in_guest a ibv_devices)"
echo "$list"
grep -q 'vrdma0' <<<"$list" || fail "ibv_devices does not list vrdma0"
[ "$(echo "$list" | grep -c 'vrdma')" -eq 1 ] || fail "more than one device listed"

out="$(in_guest a ibv_devinfo -v)"
echo "$out"
expect() { grep -Eq "$1" <<<"$out" || fail "ibv_devinfo -v: no line matching '$1'"; }
expect '^hca_id:[[:space:]]+vrdma0'
expect 'transport:[[:space:]]+InfiniBand'
expect 'state:[[:space:]]+PORT_ACTIVE \(4\)'
expect 'link_layer:[[:space:]]+InfiniBand'
expect 'port_lid:[[:space:]]+1$'
expect 'GID\[  0\]:[[:space:]]+fe80:0000:0000:0000:'
expect 'max_qp:[[:space:]]+16384'
expect 'max_qp_wr:[[:space:]]+16384'
expect 'max_sge:[[:space:]]+32'
expect 'max_cq:[[:space:]]+16384'
expect 'max_srq:[[:space:]]+8192'
expect 'atomic_cap:[[:space:]]+ATOMIC_HCA'
# Memory windows, types 1 and 2B (verbs_mw_test.cpp).
expect 'max_mw:[[:space:]]+262144'
expect '^[[:space:]]+MEM_WINDOW$'
expect '^[[:space:]]+MEM_WINDOW_TYPE_2B$'
expect 'active_mtu:[[:space:]]+4096'
# Identity (docs/protocol.md, "Device identity"): no IEEE OUI, vrdma's part id.
expect 'vendor_id:[[:space:]]+0xffffff$'
expect 'vendor_part_id:[[:space:]]+30322$'
expect 'hw_ver:[[:space:]]+0xA$'
expect 'fw_ver:[[:space:]]+0\.1\.0$'

# The second guest has its own LID.
in_guest b ibv_devinfo | grep -E >/dev/null 'port_lid:[[:space:]]+2$' || fail "guest b does not have LID 2"

# Attached to both guests: vrdma0 is guest a's device, vrdma1 guest b's, each
# with its own GUID and LID.
both() { "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a --guest b -- "$@"; }
list2="$(both ibv_devices)"
echo "$list2"
guid_a="$(awk '$1 == "vrdma0" {print $2}' <<<"$list")"
guid_a2="$(awk '$1 == "vrdma0" {print $2}' <<<"$list2")"
guid_b="$(in_guest b ibv_devices | awk '$1 == "vrdma0" {print $2}')"
guid_b2="$(awk '$1 == "vrdma1" {print $2}' <<<"$list2")"
[ "$(echo "$list2" | grep -c 'vrdma')" -eq 2 ] || fail "--guest a --guest b does not list two devices"
[ -n "$guid_a" ] && [ "$guid_a" = "$guid_a2" ] || fail "vrdma0 under a,b is not guest a's device ($guid_a2 vs $guid_a)"
[ -n "$guid_b" ] && [ "$guid_b" = "$guid_b2" ] || fail "vrdma1 under a,b is not guest b's device ($guid_b2 vs $guid_b)"
[ "$guid_a" != "$guid_b" ] || fail "guests a and b have the same GUID"
both ibv_devinfo -d vrdma1 | grep -E >/dev/null 'port_lid:[[:space:]]+2$' || fail "vrdma1 does not have guest b's LID 2"
both ibv_devinfo -d vrdma0 | grep -E >/dev/null 'port_lid:[[:space:]]+1$' || fail "vrdma0 does not have guest a's LID 1"
"$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b,a -- ibv_devinfo -d vrdma0 | grep -E >/dev/null 'port_lid:[[:space:]]+2$' ||
    fail "--guest b,a: vrdma0 is not guest b's device"
# The merged tree is private to the run and gone once the program exited.
tree="$(both sh -c 'echo "$SYSFS_PATH"')"
for _ in $(seq 1 50); do [ -e "$tree" ] || break; sleep 0.1; done
[ ! -e "$tree" ] || fail "the merged device tree $tree outlived the program"
echo "devinfo: ok"
