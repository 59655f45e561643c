#!/usr/bin/env bash
# Tenants added and removed at run time (vrdmactl guest add / remove) while a
# checked ibv_rc_pingpong runs between two other guests, a and b, all along:
#   1. guest c is added: it gets the next LID, its device answers, and a
#      checked ping-pong between c and a passes.
#   2. guest c is removed under traffic: a ping-pong between c (server) and
#      a (client) is running and an event waiter sleeps in c; the waiter gets
#      IBV_EVENT_DEVICE_FATAL, both ping-pong ends exit non-zero within 5 s
#      (c's because its device is gone, a's because its peer QP went away),
#      and c's directory, socket and /dev link are gone.
#   3. c is added again (same LID, fresh state) and works; wrong requests
#      (a name in use, a bad option, an unknown guest) are refused with the
#      reason, and the shim's shutdown leaves nothing behind.
#   4. remove --grace: a process that closes its device on PORT_ERR lets
#      the removal go at once; one that keeps it gets DEVICE_FATAL when the
#      grace is over.
# The a-b ping-pong must pass at the end: nothing else was disturbed.
source "$(dirname "$0")/lib.sh"
start_shim a b
WAITER="$VRDMA_BUILD_DIR/test/integration/vrdma-event-waiter"
ctl() { "$VRDMACTL" --run-dir "$RUN_DIR" "$@"; }


note "a checked ping-pong between a and b runs throughout"
pingpong_start ab 26515 -c -s 4096 -n 10000

note "1. add guest c"
out="$(ctl guest add c:weight=2)"
echo "  $out"
[[ "$out" =~ ^guest\ c\ lid\ 3\ worker\ [0-9]+$ ]] || fail "guest add printed '$out'"
in_guest c ibv_devinfo -v >"$RUN_DIR.c.info" 2>&1 || { cat "$RUN_DIR.c.info"; fail "ibv_devinfo in the new guest c"; }
grep -q 'PORT_ACTIVE' "$RUN_DIR.c.info" && grep -qE 'port_lid:\s+3$' "$RUN_DIR.c.info" ||
    { cat "$RUN_DIR.c.info"; fail "guest c's port is not active with LID 3"; }
ctl list | grep -E '^c ' | sed 's/^/  list| /'
ctl load | grep -q '^guest c .*weight 2' || fail "vrdmactl load does not show guest c with weight 2"
"$VRDMA_RUN" --run-dir "$RUN_DIR" --guest c -- ibv_rc_pingpong -d vrdma0 -g 0 -c -p 26516 -n 500 \
    >"$RUN_DIR.ca.server" 2>&1 &
ca_server=$!
wait_port 26516
in_guest a ibv_rc_pingpong -d vrdma0 -g 0 -c -p 26516 -n 500 127.0.0.1 >"$RUN_DIR.ca.client" 2>&1 ||
    { cat "$RUN_DIR.ca.client"; fail "a checked ping-pong from a to the new guest c failed"; }
wait "$ca_server" || { cat "$RUN_DIR.ca.server"; fail "guest c's ping-pong server failed"; }
echo "  a <-> c: $(grep -m1 'bytes in' "$RUN_DIR.ca.client")"

note "2. remove guest c under traffic"
"$VRDMA_RUN" --run-dir "$RUN_DIR" --guest c -- "$WAITER" >"$RUN_DIR.c.waiter" 2>&1 &
waiter=$!
wait_line "$RUN_DIR.c.waiter" '^ready$'
"$VRDMA_RUN" --run-dir "$RUN_DIR" --guest c -- ibv_rc_pingpong -d vrdma0 -g 0 -p 26517 -n 1000000000 \
    >"$RUN_DIR.rm.server" 2>&1 &
rm_server=$!
wait_port 26517
"$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- ibv_rc_pingpong -d vrdma0 -g 0 -p 26517 -n 1000000000 127.0.0.1 \
    >"$RUN_DIR.rm.client" 2>&1 &
rm_client=$!
sleep 1
for p in $waiter $rm_server $rm_client; do kill -0 "$p" 2>/dev/null || fail "a client of c ended before the removal"; done
node="$(ls "$RUN_DIR/c/sys/class/infiniband_verbs" | grep '^uverbs_vrdma_c_')"
[ -L "/dev/infiniband/$node" ] || fail "guest c has no /dev/infiniband/$node"
ctl guest remove c || fail "vrdmactl guest remove c failed"
t0=$(date +%s%N)
for p in $waiter $rm_server $rm_client; do
    while kill -0 "$p" 2>/dev/null && [ $((($(date +%s%N) - t0) / 1000000)) -lt 5000 ]; do sleep 0.02; done
    kill -0 "$p" 2>/dev/null && { kill -KILL "$p"; fail "pid $p still runs 5 s after guest c was removed"; }
    rc=0
    wait "$p" || rc=$?
    [ "$rc" -ne 0 ] || fail "pid $p exited 0 after its guest or its peer was removed"
done
echo "  every client of c, and a's peer of c, exited non-zero within $((($(date +%s%N) - t0) / 1000000)) ms"
sed 's/^/  waiter| /' "$RUN_DIR.c.waiter"
[ "$(grep -c '^event DEVICE_FATAL' "$RUN_DIR.c.waiter")" -eq 1 ] || fail "the waiter in c did not get DEVICE_FATAL once"
tail -n 2 "$RUN_DIR.rm.client" | sed 's/^/  a (peer of c)| /'
[ -e "$RUN_DIR/c" ] && fail "$RUN_DIR/c is still there"
[ -e "/dev/infiniband/$node" ] || [ -L "/dev/infiniband/$node" ] && fail "guest c's /dev/infiniband/$node is still there"
ctl list | grep -q '^c ' && fail "vrdmactl list still shows c"
ctl counters | grep -q '^guest c ' && fail "vrdmactl counters still shows c"
rc=0
in_guest c ibv_devinfo >/dev/null 2>&1 || rc=$?
[ "$rc" -eq 3 ] || fail "vrdma-run into the removed guest c exited $rc, not 3"
grep -E 'guest c: (added|removed)' "$SHIM_LOG" | sed 's/^/  shim| /'

note "3. c added again; refusals"
out="$(ctl guest add c)"
[[ "$out" =~ ^guest\ c\ lid\ 3\ worker\ [0-9]+$ ]] || fail "guest add (again) printed '$out'"
in_guest c ibv_devinfo | grep -q PORT_ACTIVE || fail "the re-added guest c does not work"
for bad in "add a" "add d:weight=0" "add d:owner=nosuchuser" "add ../x" "remove nosuch"; do
    rc=0
    # shellcheck disable=SC2086
    msg="$(ctl guest $bad 2>&1)" || rc=$?
    echo "  guest $bad -> exit $rc: $msg"
    [ "$rc" -eq 1 ] || fail "vrdmactl guest $bad exited $rc, not 1"
done

note "4. remove --grace: the port goes down first; a process that closes its device lets the removal go at once"
ctl guest add f >/dev/null || fail "vrdmactl guest add f"
"$VRDMA_RUN" --run-dir "$RUN_DIR" --guest f -- "$WAITER" --count 1 >"$RUN_DIR.f.waiter" 2>&1 &
waiter=$!
wait_line "$RUN_DIR.f.waiter" '^ready$'
t0=$(date +%s%N)
ctl guest remove f --grace 20 || fail "vrdmactl guest remove f --grace 20 failed"
ms=$((($(date +%s%N) - t0) / 1000000))
wait "$waiter" || fail "the waiter in f exited $? (it closes its device after one event)"
grep -q '^event PORT_ERR' "$RUN_DIR.f.waiter" || { cat "$RUN_DIR.f.waiter"; fail "f's process did not get PORT_ERR first"; }
[ "$ms" -lt 10000 ] || fail "the removal waited $ms ms though f's process had closed its device"
[ -e "$RUN_DIR/f" ] && fail "guest f is still there"
echo "  f's process got PORT_ERR and closed its device; f removed after $ms ms (grace 20 s)"
ctl guest add f >/dev/null || fail "vrdmactl guest add f (again)"
"$VRDMA_RUN" --run-dir "$RUN_DIR" --guest f -- "$WAITER" >"$RUN_DIR.f.waiter" 2>&1 &
waiter=$!
wait_line "$RUN_DIR.f.waiter" '^ready$'
msg="$(ctl guest remove f --grace 1 2>&1)" || fail "vrdmactl guest remove f --grace 1 failed: $msg"
echo "  $msg"
grep -q 'still has 1 context(s) after 1 s: removing it now' <<<"$msg" || fail "the grace's end was not said"
wait "$waiter" && fail "the waiter that kept f's device open exited 0"
grep -q '^event DEVICE_FATAL' "$RUN_DIR.f.waiter" || fail "the lingering process did not get DEVICE_FATAL"

note "the a-b ping-pong passed throughout"
pingpong_wait ab
echo "guest_runtime: ok"
