#!/usr/bin/env bash
# Failure cases of scripts/test-hca.sh, one VM's half: sourced by
# vm-guest.sh after the traffic tests (lib.sh loaded, the shim running), or
# run alone as a run-pair guest script. VM 1 serves, VM 2 is the client:
#   1. the remote shim killed: VM 1's shim dies under ib_write_bw; VM 2's
#      client ends with IBV_WC_RETRY_EXC_ERR (status 12), as on a real
#      device whose peer host died. VM 1 starts a new shim.
#   2. a guest killed mid-transfer: VM 2's client of a bidirectional
#      ib_write_bw is killed; VM 2's shim frees its device QPs and MRs, and
#      VM 1's server ends with an error, not a hang.
#   3. the link lost: VM 2's eth0 goes down under ib_write_bw; the client
#      ends with an error, VM 2's guest gets IBV_EVENT_PORT_ERR, and VM 2's
#      shim still serves its two local guests (ibv_rc_pingpong -c between
#      them). Last: the VMs cannot talk afterwards.
# (`rdma link delete rxe0` would be the device removed instead: rxe cannot
# take its user contexts away, so the kernel waits for the shim to close
# the device; not tested.)
if [ -z "${hca_src:-}" ]; then
    set -uo pipefail
    # shellcheck source=lib.sh
    source "$(cd "$(dirname "$0")" && pwd)/lib.sh"
    : >"$results"
    start_shim || { fail fabric-up "$(tail -5 /tmp/shim.log | tr '\n' ' ')"; exit 1; }
    standalone=1
fi

# stdbuf: perftest writes its lines to a file; "remote address" is awaited.
WBW=(stdbuf -oL ib_write_bw -d vrdma0 -s 65536 -D 20 -F)
# The link-down case runs longer: its client must end with an error before
# its duration does (rxe usually fails it within a second; once in CI it
# had not after 17 s, and the client did not end: after its duration
# perftest's closing handshake goes to the server across the dead link).
WBW_LINK=(stdbuf -oL ib_write_bw -d vrdma0 -s 65536 -D 60 -F)

# Both VMs start the cases together: VM 2's clients retry their connection
# for a minute only, and VM 1 may still be busy with what came before.
barrier=$share/failures.ready
if [ "$N" = 1 ]; then
    touch "$barrier"
else
    for _ in $(seq 1 3000); do [ -e "$barrier" ] && break; sleep 0.2; done
    [ -e "$barrier" ] || fail failures-barrier "VM 1 never reached the failure cases"
fi

# 1. The remote shim killed.
if [ "$N" = 1 ]; then
    "${RUN[@]}" "${WBW[@]}" -p 18800 >/tmp/kill_shim.out 2>&1 &
    server=$!
    if wait_for "remote address" /tmp/kill_shim.out 120; then
        sleep 3
        kill -9 "$shim_pid"
        wait "$shim_pid" 2>/dev/null
        shim_pid=
        kill -9 "$server" 2>/dev/null
        wait "$server" 2>/dev/null
        if start_shim; then ok kill-shim-restart; else fail kill-shim-restart "the new shim did not rejoin the fabric"; fi
    else
        fail kill-shim "the client never connected: $(tail -3 /tmp/kill_shim.out | tr '\n' ' ')"
        kill -9 "$server" 2>/dev/null
        wait "$server" 2>/dev/null
    fi
else
    start=$SECONDS
    connect_retrying 120 /tmp/kill_shim.out "${RUN[@]}" "${WBW[@]}" -p 18800 "$server_ip"
    rc=$?
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -qE "status 12|retry counter exceeded|RETRY_EXC" /tmp/kill_shim.out; then
        ok "kill-shim-retry-exceeded ($((SECONDS - start)) s)"
    else
        fail kill-shim-retry-exceeded "rc $rc: $(tail -4 /tmp/kill_shim.out | tr '\n' ' ')"
    fi
    wait_fabric || fail kill-shim-rejoin "the peer's new shim did not come up"
fi

# 2. A guest killed mid-transfer.
if [ "$N" = 1 ]; then
    start=$SECONDS
    timeout 120 "${RUN[@]}" "${WBW[@]}" -b -p 18801 >/tmp/kill_guest.out 2>&1
    rc=$?
    if [ "$rc" != 0 ] && [ "$rc" != 124 ]; then
        ok "kill-guest-peer-error ($((SECONDS - start)) s: $(grep -m1 -iE "status|fail|error" /tmp/kill_guest.out))"
    else
        fail kill-guest-peer-error "rc $rc: $(tail -4 /tmp/kill_guest.out | tr '\n' ' ')"
    fi
else
    qps0=$(device_objects qp) mrs0=$(device_objects mr)
    client=
    for _ in $(seq 1 120); do
        "${RUN[@]}" "${WBW[@]}" -b -p 18801 "$server_ip" >/tmp/kill_guest.out 2>&1 &
        client=$!
        wait_for "remote address|couldn't connect|Unable to|Failed" /tmp/kill_guest.out 60
        grep -q "remote address" /tmp/kill_guest.out && break
        kill -9 "$client" 2>/dev/null  # (hung without a word: not waited for forever)
        wait "$client"
        client=
        sleep 0.5
    done
    [ -n "$client" ] || fail kill-guest "the client never connected: $(tail -3 /tmp/kill_guest.out | tr '\n' ' ')"
    sleep 3
    qps1=$(device_objects qp) mrs1=$(device_objects mr)
    kill -9 "$client"
    wait "$client" 2>/dev/null
    for _ in $(seq 1 100); do
        [ "$(device_objects qp)" = "$qps0" ] && [ "$(device_objects mr)" = "$mrs0" ] && break
        sleep 0.2
    done
    if [ "$qps1" -gt "$qps0" ] && [ "$(device_objects qp)" = "$qps0" ] && [ "$(device_objects mr)" = "$mrs0" ]; then
        ok "kill-guest-freed (device QPs $qps0 -> $qps1 -> $qps0, MRs $mrs0 -> $mrs1 -> $mrs0)"
    else
        fail kill-guest-freed "device QPs $qps0 -> $qps1 -> $(device_objects qp), MRs $mrs0 -> $mrs1 -> $(device_objects mr)"
    fi
fi

# 3. The link lost under traffic.
if [ "$N" = 1 ]; then
    timeout 90 "${RUN[@]}" "${WBW_LINK[@]}" -p 18802 >/tmp/link_down.out 2>&1
    say "link-down server: rc $? $(grep -m1 -iE "status|fail|error" /tmp/link_down.out)"
else
    "${RUN[@]}" stdbuf -oL ibv_asyncwatch -d vrdma0 >/tmp/asyncwatch.out 2>&1 &
    watch=$!
    connect_retrying 180 /tmp/link_down.out "${RUN[@]}" "${WBW_LINK[@]}" -p 18802 "$server_ip" &
    client=$!
    if ! wait_for "remote address" /tmp/link_down.out 120; then
        fail link-down "the client never connected: $(tail -3 /tmp/link_down.out | tr '\n' ' ')"
    fi
    sleep 3
    ip link set "$RXE_NETDEV" down
    start=$SECONDS
    for _ in $(seq 1 600); do kill -0 "$client" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$client" 2>/dev/null; then
        kill -9 "$client"
        pkill -9 -x ib_write_bw
        fail link-down-error "the client still ran 120 s after the link went down: $(tail -4 /tmp/link_down.out | tr '\n' ' ') transports: $("${CTL[@]}" transports 2>&1 | tr '\n' ' ') peers: $("${CTL[@]}" peers 2>&1 | tr '\n' ' ') shim log: $(tail -25 /tmp/shim.log | tr '\n' ' ')"
    else
        wait "$client"
        rc=$?
        if [ "$rc" != 0 ]; then ok "link-down-error ($((SECONDS - start)) s: $(grep -m1 -iE "status" /tmp/link_down.out))"; else
            fail link-down-error "the client succeeded: $(tail -3 /tmp/link_down.out | tr '\n' ' ')"
        fi
    fi
    if wait_for "port error|PORT_ERR" /tmp/asyncwatch.out 30; then ok link-down-port-err; else
        fail link-down-port-err "asyncwatch: $(tr '\n' ' ' </tmp/asyncwatch.out)"
    fi
    kill "$watch" 2>/dev/null
    wait "$watch" 2>/dev/null
    LOCALB=("$build/tools/vrdma-run" --run-dir /run/vrdma --guest "g${N}b" --)
    "${RUN[@]}" ibv_rc_pingpong -d vrdma0 -g 0 -n 50 -s 4096 -c -p 18803 >/tmp/local_server.out 2>&1 &
    server=$!
    if connect_retrying 60 /tmp/local_client.out "${LOCALB[@]}" ibv_rc_pingpong -d vrdma0 -g 0 -n 50 -s 4096 -c \
        -p 18803 localhost && wait "$server"; then ok link-down-local-serves; else
        fail link-down-local-serves "$(tail -3 /tmp/local_client.out /tmp/local_server.out | tr '\n' ' ')"
    fi
fi

if [ -n "${standalone:-}" ]; then finish; fi
