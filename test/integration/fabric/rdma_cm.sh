#!/usr/bin/env bash
# rdma_cm across the fabric (two-hosts only; docs/protocol.md "rdma_cm"):
# guest a (10.0.0.1, fd00::1) on host 1, guest b (10.0.0.2) on host 2. The
# shims announce their guests' addresses to each other, so b resolves a's
# address to a guest of the peer shim, and the CM messages between the two
# ids travel between the shims. Unmodified rdmacm-utils (rping, ucmatose,
# udaddy, mckey, rdma_server/rdma_client, rstream, riostream, udpong and
# cmtime) and perftest -R, data checked where the program checks it; then
# the failures: an address nobody has, a port nobody listens on, and host
# 1's shim killed under an established rping (the client on host 2 is told
# DISCONNECTED, and a's address no longer resolves).
export VRDMA_TOPOLOGY=two-hosts
source "$(dirname "$0")/../lib.sh"
fabric_start "a:ip=10.0.0.1,fd00::1" "b:ip=10.0.0.2"

CM_LOG="$(host_log 1)"  # guest a's shim, which logs the listens (cm_pair)

cm_programs  # (lib.sh) the programs between a and b
cm_udpong    # (lib.sh) rsockets datagrams, each guest in its network namespace
cm_cmtime    # (lib.sh) 50 connections set up and torn down

note "failures: an address nobody has, a port nobody listens on"
out="$(in_guest b timeout 20 rping -c -a 10.9.9.9 -C 1 2>&1 || true)"
grep -q 'RDMA_CM_EVENT_ADDR_ERROR, error -113' <<<"$out" || fail "unknown address: '$out'"
out="$(in_guest b timeout 20 rping -c -a 10.0.0.1 -p 7999 -C 1 2>&1 || true)"
grep -q 'RDMA_CM_EVENT_REJECTED, error 8' <<<"$out" || fail "no listener across the fabric: '$out'"

note "kill -9 of host 1's shim under an established rping: the client on host 2 is told DISCONNECTED"
timeout 60 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- rping -s -a 10.0.0.1 -p 7179 -C 0 >/dev/null 2>&1 &
victim=$!
wait_line "$CM_LOG" "guest a: rdma_cm: listening on .* port 7179 " 20
timeout 60 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- rping -c -a 10.0.0.1 -p 7179 -C 0 -v >"$RUN_DIR.kill" 2>&1 &
client=$!
wait_line "$RUN_DIR.kill" 'rdma-ping-20' 20
fabric_kill 1 KILL
wait "$victim" 2>/dev/null || true
crc=0
wait "$client" || crc=$?
[ "$crc" -ne 124 ] || fail "the client hung after the server's shim was killed"
grep -q 'DISCONNECT EVENT' "$RUN_DIR.kill" || { tail -n 5 "$RUN_DIR.kill"; fail "the client was not told of the disconnect"; }
grep -v '^ping data' "$RUN_DIR.kill" | tail -n 3 | sed 's/^/  client| /'
out="$(in_guest b timeout 20 rping -c -a 10.0.0.1 -C 1 2>&1 || true)"
grep -q 'RDMA_CM_EVENT_ADDR_ERROR' <<<"$out" || fail "a's address still resolves with its shim gone: '$out'"
rm -f "$RUN_DIR.kill"
echo "rdma_cm (fabric): ok"
