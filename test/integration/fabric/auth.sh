#!/usr/bin/env bash
# A shim with the wrong fabric key (two-hosts fabric only), task (e): hosts 1
# and 2 share a key and are up; a third host (its own namespace, linked to
# host 1) runs a shim serving guest c with another key file and naming host 1
# as its peer. It must be refused: its `vrdmactl peers` shows host 1 as
# `refused`, a shim's log says that authentication failed, host 1 never
# shows it up, and an RC QP from guest c to guest a gets no answer (an error
# completion, not data). The fabric of hosts 1 and 2 keeps working: both
# still up, a stream and ibv_rc_pingpong between a and b pass.
export VRDMA_TOPOLOGY=two-hosts
source "$(dirname "$0")/../lib.sh"
fabric_start "a" "b"
peer1="${HOST_ADDR[1]}:$FABRIC_PORT"

note "host 3 (guest c, lid-base 20) with another key, naming host 1"
fabric_host 3 "c" 20
fabric_link 3 1
fabric_key "$RUN_DIR/other.key"
HOST_KEY[3]="$RUN_DIR/other.key"
fabric_peer 3 1
fabric_shim_start 3
fabric_wait_state 3 "$peer1" refused 20 | sed 's/^/  host 3| /'
log_lines="$(grep -h 'refused' "$(host_log 1)" "$(host_log 3)" | grep 'authentication' || true)"
[ -n "$log_lines" ] || fail "no shim logged the refusal ('refused' ... 'authentication')"
echo "$log_lines" | sed 's/^/  log| /'
if host_ctl 1 peers | grep -E "^peer ${HOST_ADDR[3]//./\\.}:[0-9]+ state up " >/dev/null; then
    fail "host 1 shows the host with the wrong key up"
fi

note "guest c (refused host) -> guest a: no answer"
stream_start intruder a c 29515 -s 4096 -n 10 -t 14 -r 1
crc=0
wait "${STREAM_CPID[intruder]}" || crc=$?
kill "${STREAM_SPID[intruder]}" 2>/dev/null || true
wait "${STREAM_SPID[intruder]}" 2>/dev/null || true
stream_show intruder
[ "$crc" -eq 1 ] && grep -q '^client: completion error ' "$RUN_DIR.intruder.client" ||
    fail "guest c's QP did not fail (exit $crc)"
grep -q '^server: verified' "$RUN_DIR.intruder.server" && fail "guest a received data from the refused host"

note "hosts 1 and 2 still work"
fabric_wait_up 1 2
stream_run good a b 29516 -s 65536 -n 300
client_server 60 29517 "ibv_rc_pingpong -d vrdma0 -g 0 -c -p 29517 -s 4096 -n 200" \
    "ibv_rc_pingpong -d vrdma0 -g 0 -c -p 29517 -s 4096 -n 200 127.0.0.1"
echo "auth: ok"
