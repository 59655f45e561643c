#!/usr/bin/env bash
# Port events: `vrdmactl port a down` takes port 1 of guest a's vrdma0 down
# through the shim's control socket; a process of guest a waiting in
# ibv_get_async_event gets IBV_EVENT_PORT_ERR for port 1 and then sees the
# port DOWN (ibv_query_port, ibv_devinfo); guest b's process gets nothing;
# `vrdmactl port a up` gives IBV_EVENT_PORT_ACTIVE and an ACTIVE port, and
# traffic between the guests works again.
source "$(dirname "$0")/lib.sh"
start_shim a b
CTL="$VRDMA_BUILD_DIR/tools/vrdmactl"
WAITER="$VRDMA_BUILD_DIR/test/integration/vrdma-event-waiter"

out_a="$RUN_DIR.waiter.a" out_b="$RUN_DIR.waiter.b"
timeout 60 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- "$WAITER" --count 2 >"$out_a" 2>&1 &
wa=$!
timeout 60 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- "$WAITER" >"$out_b" 2>&1 &
wb=$!
wait_line "$out_a" '^ready$'
wait_line "$out_b" '^ready$'

note "vrdmactl port a down"
"$CTL" --run-dir "$RUN_DIR" port a down || fail "vrdmactl port a down failed"
wait_line "$out_a" '^event PORT_ERR port 1 state DOWN$'
in_guest a ibv_devinfo | grep >/dev/null 'state:.*PORT_DOWN' || fail "ibv_devinfo in guest a does not show PORT_DOWN"
in_guest b ibv_devinfo | grep >/dev/null 'state:.*PORT_ACTIVE' || fail "guest b's port changed too"

note "vrdmactl port a up"
"$CTL" --run-dir "$RUN_DIR" port a up || fail "vrdmactl port a up failed"
wait_line "$out_a" '^event PORT_ACTIVE port 1 state ACTIVE$'
wrc=0
wait "$wa" || wrc=$?
sed 's/^/  waiter a| /' "$out_a"
[ "$wrc" -eq 0 ] || fail "the waiter of guest a exited $wrc"
in_guest a ibv_devinfo | grep >/dev/null 'state:.*PORT_ACTIVE' || fail "ibv_devinfo in guest a does not show PORT_ACTIVE"

# Guest b saw no event at all.
sleep 0.2
sed 's/^/  waiter b| /' "$out_b"
[ "$(grep -c '^event' "$out_b")" -eq 0 ] || fail "guest b got an event for guest a's port"
kill "$wb" 2>/dev/null || true
wait "$wb" 2>/dev/null || true

# Wrong use: an unknown guest is refused by the shim (exit 1), bad words by
# vrdmactl itself (exit 2).
rc=0
"$CTL" --run-dir "$RUN_DIR" port nosuch down 2>/dev/null || rc=$?
[ "$rc" -eq 1 ] || fail "vrdmactl port nosuch down exited $rc, expected 1"
rc=0
"$CTL" --run-dir "$RUN_DIR" port a sideways 2>/dev/null || rc=$?
[ "$rc" -eq 2 ] || fail "vrdmactl port a sideways exited $rc, expected 2"

note "traffic after the port came back"
client_server 60 24515 "ibv_rc_pingpong -d vrdma0 -g 0 -e -c -p 24515 -n 100" \
    "ibv_rc_pingpong -d vrdma0 -g 0 -e -c -p 24515 -n 100 127.0.0.1"
rm -f "$out_a" "$out_b"
echo "events_port: ok"
