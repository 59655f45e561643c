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
expect 'active_mtu:[[:space:]]+4096'

# The second guest has its own LID.
in_guest b ibv_devinfo | grep -E >/dev/null 'port_lid:[[:space:]]+2$' || fail "guest b does not have LID 2"
echo "devinfo: ok"
