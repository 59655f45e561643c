#!/usr/bin/env bash
# rdma_cm across the fabric (two-hosts only; docs/protocol.md "rdma_cm"):
# guest a (10.0.0.1, fd00::1) on host 1, guest b (10.0.0.2) on host 2. The
# shims announce their guests' addresses to each other, so b resolves a's
# address to a guest of the peer shim, and the CM messages between the two
# ids travel between the shims. Unmodified rdmacm-utils (rping, ucmatose,
# udaddy, rdma_server/rdma_client, rstream and riostream) and perftest -R,
# data checked where the program checks it; then the failures: an address
# nobody has, a port nobody listens on, and host 1's shim killed under an
# established rping (the client on host 2 is told DISCONNECTED) and while a
# client connects to it (UNREACHABLE).
export VRDMA_TOPOLOGY=two-hosts
source "$(dirname "$0")/../lib.sh"
fabric_start "a:ip=10.0.0.1,fd00::1" "b:ip=10.0.0.2"

CM_LOG="$(host_log 1)"  # guest a's shim, which logs the listens (cm_pair)

cm_pair rping 7174 rping -s -a 10.0.0.1 -C 20 -S 4096 -- rping -c -a 10.0.0.1 -C 20 -S 4096 -v
[ "$(grep -c '^ping data: rdma-ping-' <<<"$CLIENT_OUT")" -eq 20 ] || fail "rping: not 20 pings"
cm_pair ucmatose 7471 ucmatose -c 4 -C 10 -- ucmatose -s 10.0.0.1 -c 4 -C 10
grep -q 'return status 0' <<<"$CLIENT_OUT" || fail "ucmatose: no 'return status 0'"
cm_pair udaddy 7174 udaddy -- udaddy -s 10.0.0.1
grep -q 'return status 0' <<<"$CLIENT_OUT" || fail "udaddy: no 'return status 0'"
cm_pair rdma_server 7471 rdma_server -s 10.0.0.1 -- rdma_client -s 10.0.0.1
cm_pair rstream 7471 rstream -T b -T v -S 65536 -C 50 -- rstream -s 10.0.0.1 -T b -T v -S 65536 -C 50
cm_pair rstream-nonblocking 7471 rstream -T n -T v -S 4096 -C 50 -- rstream -s 10.0.0.1 -T n -T v -S 4096 -C 50
cm_pair riostream 7471 riostream -T b -T v -S 65536 -C 50 -- riostream -s 10.0.0.1 -T b -T v -S 65536 -C 50
cm_pair ib_write_bw 18515 ib_write_bw -R -d vrdma0 -n 200 -- ib_write_bw -R -d vrdma0 -n 200 10.0.0.1
cm_pair ib_read_bw 18515 ib_read_bw -R -d vrdma0 -n 200 -- ib_read_bw -R -d vrdma0 -n 200 10.0.0.1
cm_pair ib_send_lat 18515 ib_send_lat -R -d vrdma0 -n 200 -- ib_send_lat -R -d vrdma0 -n 200 10.0.0.1
cm_pair ib_send_bw-ud 18515 ib_send_bw -R -c UD -d vrdma0 -n 200 -- ib_send_bw -R -c UD -d vrdma0 -n 200 10.0.0.1

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
