#!/usr/bin/env bash
# Attackers without the fabric key between two shims (two-hosts fabric only;
# issue 24). Host 3 sits between hosts 1 and 2 (a veth link to each; 1 and
# 2 have no link of their own) and runs test/integration/fabric_relay.py:
#
#  (a) relay: both shims name host 3 as their peer and it joins their two
#      connections (each shim's bytes reach the other unchanged). Both are
#      TLS clients, so neither handshake can finish: no peer comes up, both
#      log the refusal and count it (handshake_failed).
#  (d) tampering: host 1 names host 3, which forwards to host 2 (a valid,
#      end-to-end connection: the link comes up) and changes one bit of
#      the stream from host 1 at byte 300000, in the middle of an RC stream
#      from guest a (host 1) to guest b (host 2). Host 2 cuts the link
#      (a record that fails authentication), logs and counts it (tampered);
#      the stream's server never verifies a wrong byte; the link comes back
#      (the relay changes only one byte) and a second stream passes.
#  (b) replay: the bytes host 1 sent on that first connection (recorded by
#      the relay) are sent again to host 2 on a new connection: refused
#      (the handshake cannot finish), logged and counted.
export VRDMA_TOPOLOGY=two-hosts
source "$(dirname "$0")/../lib.sh"
RELAY=(python3 "$(dirname "$0")/../fabric_relay.py")

fabric_init
fabric_host 1 "a" 1
fabric_host 2 "b" 10
fabric_host 3 "" 20
fabric_link 3 1
fabric_link 2 3
relay_addr="${HOST_ADDR[3]}"
peer2="${HOST_ADDR[2]}:$FABRIC_PORT"

# counter H NAME: host H's fabric counter NAME (vrdmactl peers, last line).
counter() {
    host_ctl "$1" peers | sed -n "s/^fabric .* $2 \([0-9]*\).*/\1/p"
}
# relay_start ARGS...: the relay in host 3's namespace, in the background.
relay_start() {
    ip netns exec "${HOST_NS[3]}" "${RELAY[@]}" "$@" >>"$RUN_DIR.relay" 2>&1 &
    RELAY_PID=$!
    sleep 0.3
}
relay_stop() {
    kill "$RELAY_PID" 2>/dev/null || true
    wait "$RELAY_PID" 2>/dev/null || true
}

note "(a) host 3 joins the connections that hosts 1 and 2 open to it"
relay_start pair "$relay_addr:7500"
HOST_PEERS[1]="$relay_addr:7500"
HOST_PEERS[2]="$relay_addr:7500"
fabric_shim_start 1
fabric_shim_start 2
deadline=$(( $(now_ms) + 8000 ))
until [ "$(counter 1 handshake_failed)" -ge 1 ] && [ "$(counter 2 handshake_failed)" -ge 1 ]; do
    [ "$(now_ms)" -lt "$deadline" ] || fail "(a) the relayed handshakes did not fail on both hosts"
    sleep 0.1
done
for h in 1 2; do
    host_ctl "$h" peers | sed "s/^/  host $h| /"
    if host_ctl "$h" peers | grep -q ' state up '; then fail "(a) host $h has a peer up through the relay"; fi
    grep -q 'refused: authentication failed' "$(host_log "$h")" || fail "(a) host $h logged no refusal"
done
grep -h 'refused: authentication failed' "$(host_log 1)" "$(host_log 2)" | head -n 2 | sed 's/^/  log| /'
fabric_kill 1 TERM
fabric_kill 2 TERM
relay_stop

note "(d) host 3 forwards host 1's connection to host 2 and changes byte 300000"
relay_start forward "$relay_addr:7501" "$peer2" --record "$RUN_DIR.recorded" --flip-at 300000
HOST_PEERS[1]="$relay_addr:7501"
HOST_PEERS[2]=""
fabric_shim_start 2
fabric_shim_start 1
fabric_wait_state 1 "$relay_addr:7501" up 10 | sed 's/^/  host 1| /'
stream_start tampered b a 29611 -s 65536 -n 40 -t 14 -r 7
crc=0 src=0
wait "${STREAM_CPID[tampered]}" || crc=$?
kill "${STREAM_SPID[tampered]}" 2>/dev/null || true
wait "${STREAM_SPID[tampered]}" 2>/dev/null || src=$?
stream_show tampered
grep -q 'changed byte 300000' "$RUN_DIR.relay" || fail "(d) the relay changed no byte (the stream was too short?)"
if grep -q '^server: data mismatch' "$RUN_DIR.tampered.server"; then fail "(d) a changed byte reached guest b"; fi
[ "$(counter 2 tampered)" -ge 1 ] || fail "(d) host 2 did not count the tampered link"
grep -q 'received data failed authentication' "$(host_log 2)" || fail "(d) host 2 logged no authentication failure"
grep -h 'received data failed authentication' "$(host_log 2)" | head -n 1 | sed 's/^/  log| /'
echo "  (the stream's client exited with $crc)"
fabric_wait_state 1 "$relay_addr:7501" up 10 | sed 's/^/  host 1| /'
stream_run after b a 29612 -s 65536 -n 40

note "(b) host 1's recorded bytes replayed to host 2"
[ -s "$RUN_DIR.recorded" ] || fail "(b) the relay recorded nothing"
before="$(counter 2 handshake_failed)"
ip netns exec "${HOST_NS[3]}" "${RELAY[@]}" replay "$peer2" "$RUN_DIR.recorded" | sed 's/^/  /'
deadline=$(( $(now_ms) + 5000 ))
until [ "$(counter 2 handshake_failed)" -gt "$before" ]; do
    [ "$(now_ms)" -lt "$deadline" ] || fail "(b) host 2 did not count the replayed handshake as failed"
    sleep 0.1
done
host_ctl 2 peers | sed 's/^/  host 2| /'
[ "$(host_ctl 2 peers | grep -c ' state up ')" -eq 1 ] || fail "(b) host 2 has another peer up"
relay_stop
echo "attacks: ok"
