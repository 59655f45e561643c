#!/usr/bin/env bash
# A guest process killed with SIGKILL in the middle of a transfer costs the
# others nothing: its peer sees error completions (not a hang), the shim
# reclaims what the dead process held and keeps serving.
source "$(dirname "$0")/lib.sh"
start_shim a b

shim_fds() { ls "/proc/$SHIM_PID/fd" | wc -l; }
fds_before="$(shim_fds)"

for tool in ib_send_bw ib_write_bw; do
    port=$((20000 + RANDOM % 1000))
    note "$tool: killing the client in guest b mid-transfer"
    # vrdma-run execs the program: $! is the client itself, not a subshell.
    "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- "$tool" -d vrdma0 -p $port -s 65536 -n 100000000 >"$RUN_DIR.server" 2>&1 &
    server=$!
    wait_port $port
    "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- "$tool" -d vrdma0 -p $port -s 65536 -n 100000000 127.0.0.1 >"$RUN_DIR.client" 2>&1 &
    client=$!
    sleep 1.5
    kill -0 "$client" 2>/dev/null || { cat "$RUN_DIR.client"; fail "client ended before it was killed"; }
    kill -KILL "$client"
    wait "$client" 2>/dev/null || true
    # ib_send_bw's server waits for receives: it must see them flushed and
    # exit with an error; ib_write_bw's server only waits on its TCP socket.
    for _ in $(seq 1 100); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$server" 2>/dev/null; then
        kill -KILL "$server"
        cat "$RUN_DIR.server"
        fail "$tool server still running 10 s after its peer was killed"
    fi
    wait "$server" && fail "$tool server reported success although its peer was killed" || true
    sed 's/^/  server| /' "$RUN_DIR.server" | tail -n 3
done
rm -f "$RUN_DIR.server" "$RUN_DIR.client"

# The shim keeps serving: a fresh pair of guests passes a checked pingpong.
client_server 60 18600 "ibv_rc_pingpong -d vrdma0 -g 0 -c -p 18600 -n 100" \
    "ibv_rc_pingpong -d vrdma0 -g 0 -c -p 18600 -n 100 127.0.0.1"
# The pingpong processes' detach reaches the shim shortly after they exit.
for _ in $(seq 1 30); do
    fds_after="$(shim_fds)"
    [ "$fds_after" -le "$fds_before" ] && break
    sleep 0.1
done
echo "shim fds before: $fds_before, after: $fds_after"
[ "$fds_after" -le "$fds_before" ] || fail "the shim holds $fds_after fds, $fds_before before: leak"
grep -q 'detached' "$SHIM_LOG" || fail "the shim did not log the detach of the killed guest"
echo "guest_kill: ok"
