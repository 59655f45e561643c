#!/usr/bin/env bash
# The shim stopping in the middle of an event-driven run: ibv_rc_pingpong -e
# with a huge -n in guests a and b (sleeping in ibv_get_cq_event), and
# vrdma-event-waiter in guest a (sleeping in ibv_get_async_event, and with
# --cq-wait in ibv_get_cq_event too). Round 1 stops the shim with SIGTERM,
# round 2 kills it with SIGKILL (a crash). Each time every client must exit
# non-zero within 2 s, the waiter must report IBV_EVENT_DEVICE_FATAL once
# and then a failing ibv_get_async_event and ibv_get_cq_event; then a new
# shim started on the same run directory serves a new ibv_open_device
# (ibv_devinfo) and a new event-mode ping-pong.
source "$(dirname "$0")/lib.sh"
start_shim a b
WAITER="$VRDMA_BUILD_DIR/test/integration/vrdma-event-waiter"


restart_shim() {  # a new shim on the same run directory
    "$SHIM" --run-dir "$RUN_DIR" --guest a --guest b >>"$SHIM_LOG" 2>&1 &
    SHIM_PID=$!
    # A killed shim leaves its ready file (with its pid) behind: wait for ours.
    for _ in $(seq 1 100); do
        [ "$(head -n1 "$RUN_DIR/ready" 2>/dev/null)" = "$SHIM_PID" ] && return 0
        kill -0 "$SHIM_PID" 2>/dev/null || fail "the new shim exited during start"
        sleep 0.1
    done
    fail "the new shim is not ready after 10 s"
}

port=25515
for sig in TERM KILL; do
    note "round SIG$sig: clients sleeping on events"
    out="$RUN_DIR.$sig"
    "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- "$WAITER" --cq-wait >"$out.waiter" 2>&1 &
    pw=$!
    "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- \
        ibv_rc_pingpong -d vrdma0 -g 0 -e -p $port -n 1000000000 >"$out.server" 2>&1 &
    ps=$!
    wait_port $port
    "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- \
        ibv_rc_pingpong -d vrdma0 -g 0 -e -p $port -n 1000000000 127.0.0.1 >"$out.client" 2>&1 &
    pc=$!
    wait_line "$out.waiter" '^ready$'
    sleep 1
    for p in $pw $ps $pc; do kill -0 "$p" 2>/dev/null || fail "a client ended before the shim stopped"; done

    kill -"$sig" "$SHIM_PID"
    t0=$(date +%s%N)
    declare -A rcs=()
    for p in $pw $ps $pc; do
        while kill -0 "$p" 2>/dev/null && [ $(( ($(date +%s%N) - t0) / 1000000 )) -lt 2000 ]; do sleep 0.02; done
        kill -0 "$p" 2>/dev/null && { kill -KILL "$p"; fail "pid $p still runs 2 s after SIG$sig of the shim"; }
        rc=0
        wait "$p" || rc=$?
        rcs[$p]=$rc
    done
    ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    src=0
    wait "$SHIM_PID" || src=$?
    SHIM_PID=""
    sed 's/^/  waiter| /' "$out.waiter"
    grep -v 'bytes\|iters\|address' "$out.server" | sed 's/^/  server| /'
    grep -v 'bytes\|iters\|address' "$out.client" | sed 's/^/  client| /'
    echo "  all clients exited ${ms} ms after SIG$sig (shim exit $src); exit codes: waiter ${rcs[$pw]} server ${rcs[$ps]} client ${rcs[$pc]}"
    [ "$sig" = TERM ] && [ "$src" -ne 0 ] && fail "the shim exited $src on SIGTERM"
    for p in $pw $ps $pc; do [ "${rcs[$p]}" -ne 0 ] || fail "a client (pid $p) exited 0 after the shim stopped"; done
    [ "${rcs[$pw]}" -eq 1 ] || fail "the waiter exited ${rcs[$pw]}: no DEVICE_FATAL before the failure"
    [ "$(grep -c '^event DEVICE_FATAL$' "$out.waiter")" -eq 1 ] || fail "DEVICE_FATAL not reported exactly once"
    grep -q '^async_event: failed' "$out.waiter" || fail "ibv_get_async_event did not fail after DEVICE_FATAL"
    grep -q '^cq_event: failed' "$out.waiter" || fail "ibv_get_cq_event did not fail"
    rm -f "$out.waiter" "$out.server" "$out.client"

    note "a new shim on the same run directory"
    restart_shim
    in_guest a ibv_devinfo -d vrdma0 | grep >/dev/null 'state:.*PORT_ACTIVE' || fail "ibv_devinfo fails on the new shim"
    port=$((port + 1))
    client_server 60 $port "ibv_rc_pingpong -d vrdma0 -g 0 -e -c -p $port -n 100" \
        "ibv_rc_pingpong -d vrdma0 -g 0 -e -c -p $port -n 100 127.0.0.1"
    port=$((port + 1))
done
echo "events_shim_stop: ok"
