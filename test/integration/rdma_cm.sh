#!/usr/bin/env bash
# rdma_cm (docs/protocol.md "rdma_cm"): unmodified librdmacm programs from
# Debian's rdmacm-utils and perftest connect by IP address between guest a
# (10.0.0.1, fd00::1) and guest b (10.0.0.2, fd00::2) of one shim, with
# data checked where the program checks it; then the API cases
# (vrdma-rdma-cm-tests: EAGAIN, destroy with unacked events, binding
# another guest's address, ports in use, ADDR_ERROR, REJECTED, backlog,
# migrate) and the failures a user sees: an unknown address, a port in
# use, another guest's address, a peer killed with kill -9, the shim
# killed with kill -9. udpong runs with each guest in a network namespace
# holding its address (rsockets datagrams need the kernel to know it).
source "$(dirname "$0")/lib.sh"
start_shim a:ip=10.0.0.1,fd00::1 b:ip=10.0.0.2,fd00::2

cm_programs  # (lib.sh) the programs between a and b
cm_pair rping-ipv6 7175 rping -s -a fd00::1 -p 7175 -C 5 -- rping -c -a fd00::1 -p 7175 -C 5 -v
grep -q '^ping data: rdma-ping-4' <<<"$CLIENT_OUT" || fail "rping over IPv6: no 5th ping"

note "rping within one guest, through loopback"
timeout 60 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- rping -s -a 127.0.0.1 -p 7176 -C 3 >"$RUN_DIR.lo" 2>&1 &
lo=$!
wait_line "$SHIM_LOG" "guest a: rdma_cm: listening on 127.0.0.1 port 7176 " 20
in_guest a timeout 60 rping -c -a 127.0.0.1 -p 7176 -C 3 -v | grep -c '^ping data' | grep -qx 3 || fail "loopback rping"
wait "$lo" || { sed "s/^/  server| /" "$RUN_DIR.lo"; fail "loopback rping server failed"; }

cm_udpong  # (lib.sh) rsockets datagrams, each guest in its network namespace

cm_cmtime  # (lib.sh) 50 connections set up and torn down

note "the API cases"
timeout 120 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- "$VRDMA_BUILD_DIR/test/integration/vrdma-rdma-cm-tests" ||
    fail "vrdma-rdma-cm-tests failed"

note "failures: an unknown address, a port in use, another guest's address"
out="$(in_guest b timeout 20 rping -c -a 10.9.9.9 -C 1 2>&1 || true)"
grep -q 'RDMA_CM_EVENT_ADDR_ERROR, error -113' <<<"$out" || fail "unknown address: '$out'"
out="$(in_guest b timeout 20 rping -c -a 10.0.0.1 -p 7999 -C 1 2>&1 || true)"
grep -q 'RDMA_CM_EVENT_REJECTED, error 8' <<<"$out" || fail "no listener: '$out'"
out="$(in_guest a timeout 20 rping -s -a 10.0.0.2 -C 1 2>&1 || true)"
grep -q 'rdma_bind_addr: Cannot assign requested address' <<<"$out" || fail "binding b's address from a: '$out'"
timeout 60 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- rping -s -a 10.0.0.1 -p 7178 -C 1 >/dev/null 2>&1 &
holder=$!
wait_line "$SHIM_LOG" "guest a: rdma_cm: listening on .* port 7178 " 20
out="$(in_guest a timeout 20 rping -s -a 10.0.0.1 -p 7178 -C 1 2>&1 || true)"
grep -q 'rdma_bind_addr: Address already in use' <<<"$out" || fail "port in use: '$out'"
kill "$holder" 2>/dev/null || true
wait "$holder" || true

note "kill -9 of the server under traffic: the client is told DISCONNECTED"
timeout 60 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- rping -s -a 10.0.0.1 -p 7179 -C 0 >/dev/null 2>&1 &
victim=$!
wait_line "$SHIM_LOG" "guest a: rdma_cm: listening on .* port 7179 " 20
timeout 60 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- rping -c -a 10.0.0.1 -p 7179 -C 0 -v >"$RUN_DIR.kill" 2>&1 &
client=$!
wait_line "$RUN_DIR.kill" 'rdma-ping-20' 20
pkill -9 -f "rping -s -a 10.0.0.1 -p 7179" || fail "no server to kill"
wait "$victim" || true
crc=0
wait "$client" || crc=$?
[ "$crc" -ne 124 ] || fail "the client hung after its server was killed"
grep -q 'DISCONNECT EVENT' "$RUN_DIR.kill" ||
    { tail -n 5 "$RUN_DIR.kill"; fail "the client was not told of the disconnect"; }
tail -n 2 "$RUN_DIR.kill" | sed 's/^/  client| /'
grep -v "^ping data" "$RUN_DIR.kill" | sed "s/^/  client| /"
rm -f "$RUN_DIR.kill" "$RUN_DIR.lo"

note "kill -9 of the shim: a listening server is told RDMA_CM_EVENT_DEVICE_REMOVAL"
timeout 60 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- rping -s -a 10.0.0.1 -p 7180 -C 1 >"$RUN_DIR.removal" 2>&1 &
orphan=$!
wait_line "$SHIM_LOG" "guest a: rdma_cm: listening on .* port 7180 " 20
kill -9 "$SHIM_PID"
wait "$SHIM_PID" || true
crc=0
wait "$orphan" || crc=$?
[ "$crc" -ne 124 ] || fail "rping -s hung after its shim was killed"
grep -q 'cma detected device removal' "$RUN_DIR.removal" ||
    { cat "$RUN_DIR.removal"; fail "no DEVICE_REMOVAL after the shim was killed"; }
sed 's/^/  server| /' "$RUN_DIR.removal"
rm -f "$RUN_DIR.removal"
# A new shim on the run directory, for stop_shim's clean stop.
"$SHIM" --run-dir "$RUN_DIR" --guest a >>"$SHIM_LOG" 2>&1 &
SHIM_PID=$!
for _ in $(seq 1 100); do
    [ "$(head -n1 "$RUN_DIR/ready" 2>/dev/null)" = "$SHIM_PID" ] && break
    sleep 0.1
done
echo "rdma_cm: ok"
