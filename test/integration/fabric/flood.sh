#!/usr/bin/env bash
# A flood of pending handshakes from a third host (two-hosts fabric only;
# issue 24). Hosts 1 and 2 are up; host 3 (a link to host 1 only, no shim)
# holds 64 connections to host 1's fabric port open without a byte, opening
# a new one whenever host 1 closes one (test/integration/fabric_relay.py
# flood). Host 1 admits 4 pending handshakes from one address, each for 2 s
# at most, and always keeps room for its configured peers:
#   - the link between hosts 1 and 2 stays up through the flood (it is not
#     cut, and no connection of the flood replaces it);
#   - host 2's shim is killed and started again during the flood: both
#     sides show each other up again within 5 s of the restart (2 s by
#     design, with slack for CI), and a stream a -> b passes;
#   - host 1 counts the refused connections (flood_refused) and the
#     handshakes that ran out of time (handshake_timeout).
export VRDMA_TOPOLOGY=two-hosts
source "$(dirname "$0")/../lib.sh"
RELAY=(python3 "$(dirname "$0")/../fabric_relay.py")
fabric_start "a" "b"
peer1="${HOST_ADDR[1]}:$FABRIC_PORT"
peer2="${HOST_ADDR[2]}:$FABRIC_PORT"
fabric_host 3 "" 20
fabric_link 3 1

counter() {
    host_ctl "$1" peers | sed -n "s/^fabric .* $2 \([0-9]*\).*/\1/p"
}

note "host 3 floods host 1 with pending handshakes for 8 s"
ip netns exec "${HOST_NS[3]}" "${RELAY[@]}" flood "$peer1" 8 64 >"$RUN_DIR.flood" 2>&1 &
flood_pid=$!
sleep 3
host_ctl 1 peers | sed 's/^/  host 1| /'
host_ctl 1 peers | grep -Eq "^peer ${peer2//./\\.} state up " || fail "the flood cut the link between hosts 1 and 2"
[ "$(counter 1 flood_refused)" -gt 0 ] || fail "host 1 refused no connection of the flood"
stream_run during a b 29711 -s 65536 -n 50

note "host 2's shim restarted during the flood"
fabric_kill 2 KILL
t0=$(now_ms)
fabric_shim_start 2
fabric_wait_state 1 "$peer2" up 10 >/dev/null
fabric_wait_state 2 "$peer1" up 10 >/dev/null
rejoin=$(( $(now_ms) - t0 ))
echo "  rejoined ${rejoin} ms after the restart"
[ "$rejoin" -le 5000 ] || fail "hosts 1 and 2 took ${rejoin} ms to rejoin during the flood (5000 allowed)"
kill -0 "$flood_pid" 2>/dev/null || fail "the flood ended before the restart was over (the test ran too slowly)"
stream_run after a b 29712 -s 65536 -n 50
wait "$flood_pid" || true
sed 's/^/  /' "$RUN_DIR.flood"
host_ctl 1 peers | sed 's/^/  host 1| /'
[ "$(counter 1 handshake_timeout)" -gt 0 ] || fail "host 1 counted no handshake that ran out of time"
echo "flood: ok"
