#!/usr/bin/env bash
# File-descriptor exhaustion (docs/reliability.md "What a tenant can do to
# another"): the shim runs with a small fd limit (2048); guest c attaches
# contexts with as many completion channels as the shim takes, and holds
# them. Each guest's fds (sockets, each context's eventfds and async pipe,
# channels) count against its share of the shim's limit, so c is refused
# well before the shim runs out; meanwhile guests a and b attach and run a
# checked ibv_rc_pingpong (-c) and an event-driven one (-e: channels of
# their own). Then a process of guest a opens 300 connections and never
# attaches: a's own connection quota (256) is full, but only until the
# shim's --attach-timeout (1 s here) closes them.
source "$(dirname "$0")/lib.sh"
ulimit -n 2048
VRDMA_SHIM_ARGS="--attach-timeout 1" start_shim a b c

note "guest c floods the shim with contexts and completion channels"
"$VRDMA_RUN" --run-dir "$RUN_DIR" --guest c -- "$VRDMA_BUILD_DIR/test/integration/adversarial_guest" \
    --flood-fds 8 >"$RUN_DIR.flood" 2>&1 &
flood=$!
for _ in $(seq 1 100); do
    grep -q "holding them" "$RUN_DIR.flood" && break
    kill -0 "$flood" 2>/dev/null || break
    sleep 0.1
done
cat "$RUN_DIR.flood"
grep -q "holding them" "$RUN_DIR.flood" || fail "the flood did not get going"
echo "shim fds during the flood: $(ls "/proc/$SHIM_PID/fd" | wc -l) (limit 2048)"

note "meanwhile a and b attach and run checked pingpongs"
client_server 60 18690 "ibv_rc_pingpong -d vrdma0 -g 0 -c -p 18690 -s 4096 -n 200" \
    "ibv_rc_pingpong -d vrdma0 -g 0 -c -p 18690 -s 4096 -n 200 127.0.0.1"
client_server 60 18691 "ibv_rc_pingpong -d vrdma0 -g 0 -e -p 18691 -s 4096 -n 200" \
    "ibv_rc_pingpong -d vrdma0 -g 0 -e -p 18691 -s 4096 -n 200 127.0.0.1"
kill -0 "$flood" 2>/dev/null || fail "the flood ended before the pingpongs did (raise --flood-fds)"
rc=0
wait "$flood" || rc=$?
[ "$rc" -eq 0 ] || fail "the flooding guest reported a failure (exit $rc)"
grep -q "quota" "$SHIM_LOG" && grep -m1 "fds" "$SHIM_LOG" || true

note "a process of guest a holds 300 unattached connections; after --attach-timeout a attaches again"
python3 -c "
import socket, time
socks = []
for i in range(300):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect('$RUN_DIR/a/vrdma.sock')
    socks.append(s)
print('holding 300 connections', flush=True)
time.sleep(6)
" >"$RUN_DIR.flood" 2>&1 &
holder=$!
for _ in $(seq 1 50); do grep -q holding "$RUN_DIR.flood" && break; sleep 0.1; done
sleep 1.5
in_guest a ibv_devinfo | grep -q PORT_ACTIVE || fail "guest a cannot attach 1.5 s after its connection flood"
grep -m1 "did not attach within 1 s" "$SHIM_LOG" || fail "the shim did not close the stale connections"
kill "$holder" 2>/dev/null || true
wait "$holder" 2>/dev/null || true
rm -f "$RUN_DIR.flood"
echo "fd_flood: ok"
