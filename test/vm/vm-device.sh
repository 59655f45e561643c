#!/usr/bin/env bash
# One VM's half of scripts/test-vm.sh: run inside VM N (1 or 2) booted by
# scripts/vm/run-pair.sh with an ivshmem-doorbell device whose server is the
# host's vrdma-shim (VM guest vmN). With the VM's stock kernel and no
# driver: finds the device (1af4:1110) in sysfs, enables it, and through
# its BARs (the sysfs resource files, as root):
#   - reads the device page at the start of BAR2 (vm_abi.h): the magic, the
#     version, the guest's name and LID, the memory's size;
#   - reads its own peer ID from BAR0 (IVPosition);
#   - rings the shim through BAR0's Doorbell register (peer 0, vector 0)
#     three times and sees the shim count each ring in the device page.
# Then starts the VM's agent (vrdma-vm-agent, from the build in $1) and
# runs `vrdma-run -- ibv_devinfo -v` as an application would: vrdma0 with
# the guest's LID, its port ACTIVE. Then ibv_rc_pingpong, ibv_ud_pingpong
# and ibv_srq_pingpong between the two VMs (VM 1 serves, VM 2 connects
# over the VMs' own network, 10.10.0.N, for the connection data only),
# their data checked (--chk): the messages go VM memory -> shim -> VM
# memory; and the three in event mode (-e). Then the six perftest
# programs (send, write and read; bandwidth and latency) at 8 B and 64 KiB
# between the VMs, and ib_send_lat -e. Then VM 2's QEMU is
# killed in the middle of a pingpong with VM 1, whose pingpong must end
# with an error. Then VM 1 serves the rc, ud and srq pingpongs, polling
# and -e (vm_host_pingpongs), on port 18516 for guest h of its shim's
# host, and the rc pingpong on port 18518 for guest f of another shim of
# the fabric (scripts/test-vm.sh runs the clients; the connection data
# crosses QEMU's user network, eth1, forwarded from the host). Then the
# verbs suite runs in VM 1. Last, VM 1 waits on vrdma0's async events while
# the host kills the shim (SIGKILL): it must get IBV_EVENT_DEVICE_FATAL.
# Prints "ok NAME (at SECONDS s)" or "FAIL NAME: why (at ...)" per check into
# $VM_SHARE/vmN.results; exits 1 if any failed.
set -uo pipefail
# shellcheck source=vm-lib.sh
source "$(dirname "$0")/vm-lib.sh"
results="$VM_SHARE/vm$VMID.results"
: >"$results"
status=0
ok() { echo "ok $1 (at ${SECONDS} s)" | tee -a "$results"; }
fail() { echo "FAIL $1: $2 (at ${SECONDS} s)" | tee -a "$results"; status=1; }

dev=
for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor")" = 0x1af4 ] && [ "$(cat "$d/device")" = 0x1110 ] && dev=$d
done
if [ -z "$dev" ]; then
    fail device "no ivshmem device (1af4:1110) in /sys/bus/pci/devices"
    exit 1
fi
ok "device $(basename "$dev")"
echo 1 >"$dev/enable" 2>/dev/null || true

out=$(python3 - "$dev" "vm$VMID" "$((VMID + 1))" <<'PY'
import ctypes, mmap, os, sys, time
dev, want_name, want_lid = sys.argv[1], sys.argv[2], int(sys.argv[3])
def region(n, size):
    fd = os.open("%s/resource%d" % (dev, n), os.O_RDWR | os.O_SYNC)
    return mmap.mmap(fd, size)
bar2, bar0 = region(2, 4096), region(0, 256)
u32 = lambda m, off: ctypes.c_uint32.from_buffer(m, off)
u64 = lambda m, off: ctypes.c_uint64.from_buffer(m, off)
u16 = lambda m, off: ctypes.c_uint16.from_buffer(m, off)
magic, version, memory, lid = u64(bar2, 0).value, u32(bar2, 8).value, u64(bar2, 16).value, u16(bar2, 32).value
name = bytes(bar2[40:104]).split(b"\0")[0].decode()
print("page magic %#x version %d memory %d MiB guest %s lid %d" % (magic, version, memory >> 20, name, lid))
if magic != 0x4d562d414d445276 or version != 2 or name != want_name or lid != want_lid:
    sys.exit("the device page is not the shim's for %s lid %d" % (want_name, want_lid))
print("ivposition %d" % u32(bar0, 8).value)
kicks = u64(bar2, 136)
for ring in range(3):
    before = kicks.value
    u32(bar0, 12).value = (0 << 16) | 0  # Doorbell: peer 0 (the shim), vector 0
    deadline = time.time() + 10
    while kicks.value == before:
        if time.time() > deadline:
            sys.exit("ring %d: the shim did not count it within 10 s" % ring)
        time.sleep(0.01)
print("rings 3 counted %d" % kicks.value)
PY
) && rc=0 || rc=$?
echo "$out"
if [ "$rc" = 0 ]; then
    ok "page: $(grep '^page' <<<"$out")"
    [ "$(sed -n 's/^ivposition //p' <<<"$out")" = 1 ] && ok "ivposition 1" || fail ivposition "$out"
    ok "doorbell: $(grep '^rings' <<<"$out")"
else
    fail page-and-doorbell "$out"
fi
build=${1:-${VM_GARGS:-}}
if [ -z "$build" ] || [ ! -x "$build/src/shim/vrdma-vm-agent" ]; then
    fail agent "no build given (scripts/test-vm.sh passes it)"
    exit 1
fi
if vm_agent_start "$build"; then ok "agent: $(head -1 /tmp/agent.log)"; else fail agent "$(cat /tmp/agent.log)"; fi
devinfo=$("$build/tools/vrdma-run" --run-dir /run/vrdma --guest "vm$VMID" -- ibv_devinfo -v 2>&1) && rc=0 || rc=$?
echo "$devinfo"
lid=$(awk '$1 == "port_lid:" { print $2 }' <<<"$devinfo")
if [ "$rc" = 0 ] && grep -q 'hca_id:[[:space:]]*vrdma0' <<<"$devinfo" && [ "$lid" = "$((VMID + 1))" ] &&
    grep -q 'state:[[:space:]]*PORT_ACTIVE' <<<"$devinfo"; then
    ok "ibv_devinfo in the VM: vrdma0, port_lid $lid, PORT_ACTIVE"
else
    fail ibv_devinfo "exit $rc: $(tail -5 <<<"$devinfo")"
fi
# watched SECONDS COMMAND...: COMMAND with its output line-buffered (what
# it printed is kept when it is killed), killed after SECONDS (status
# 124). Before the kill, hang_dump records what still runs.
watched() {
    local secs=$1 pid n
    shift
    stdbuf -oL -eL "$@" &
    pid=$!
    for ((n = 0; n < secs * 10; n++)); do
        kill -0 "$pid" 2>/dev/null || { wait "$pid"; return; }
        sleep 0.1
    done
    hang_dump "$*"
    kill "$pid" 2>/dev/null
    sleep 1
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return 124
}
# hang_dump WHAT: the threads' kernel wait channels and backtraces (gdb) of
# every verbs program still running in this VM, into $VM_SHARE/vmN.hang;
# then vmN.hang.ready asks scripts/test-vm.sh for the shim's side (its
# counters and its threads), which it prints with these after the run.
hang_dump() {
    local f="$VM_SHARE/vm$VMID.hang" p t
    {
        echo "=== VM $VMID at ${SECONDS} s: $1 did not end"
        for p in $(pgrep '^(ib_|ibv_)'); do
            echo "--- pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline")"
            for t in /proc/"$p"/task/*; do echo "  thread ${t##*/} $(cat "$t/comm"): waits in $(cat "$t/wchan")"; done
            timeout 30 gdb -p "$p" -batch -ex "thread apply all bt" 2>&1 | grep -E '^(Thread|#)'
        done
    } >>"$f" 2>&1
    touch "$f.ready"
    for _ in $(seq 20); do [ -e "$f.done" ] && break; sleep 0.5; done
    rm -f "$f.ready" "$f.done"
}
# between VM PROGRAM ARGS... : PROGRAM with ARGS, --chk, VM 1 serving and
# VM 2 connecting (retried until VM 1 listens); "ok" when it exits 0 and
# printed its "bytes in" line.
between() {
    local name=$1 out rc=1
    shift
    if [ "$VMID" = 1 ]; then
        out=$(watched 120 "$build/tools/vrdma-run" --run-dir /run/vrdma --guest vm1 -- "$@" --chk 2>&1) && rc=0 || rc=$?
    else
        for _ in $(seq 60); do
            out=$(watched 120 "$build/tools/vrdma-run" --run-dir /run/vrdma --guest vm2 -- "$@" --chk 10.10.0.1 2>&1) &&
                rc=0 || rc=$?
            [ "$rc" = 0 ] && break
            grep -q "Couldn't connect" <<<"$out" || break
            sleep 1
        done
    fi
    echo "$out"
    if [ "$rc" = 0 ] && grep -q ' bytes in ' <<<"$out"; then
        ok "$name between the VMs ($([ "$VMID" = 1 ] && echo server || echo client)): $(grep 'bytes in' <<<"$out")"
    else
        fail "$name" "exit $rc: $(tail -3 <<<"$out")"
    fi
}
# perf_between TOOL PORT ARGS...: perftest's TOOL with ARGS, VM 1 serving
# on PORT and VM 2 connecting (retried until VM 1 listens). Under TCG
# perftest's calibration of its cycle counter against gettimeofday can
# fail ("Correlation coefficient r^2: ... < 0.9", "Can't produce a
# report"): that side exits 1 after the transfer, the other one fails the
# final exchange, and both run the pair once more on the same port.
#
# A run that hangs (killed after 60 s, status 124) is run once more too,
# and the "ok" line says so: ib_send_lat -e between the VMs hung in 2 of 11
# full runs of the suite and in none of 90 runs alone (docs/protocol.md
# "Events in a VM, by polling"), and hang_dump records what it waited in,
# which scripts/test-vm.sh prints.
perf_between() {
    local tool=$1 port=$2 out rc=1 line attempt again=""
    shift 2
    for attempt in 1 2; do
        if [ "$VMID" = 1 ]; then
            out=$(watched 60 "$build/tools/vrdma-run" --run-dir /run/vrdma --guest vm1 -- "$tool" -d vrdma0 -p "$port" \
                "$@" 2>&1) && rc=0 || rc=$?
        else
            for _ in $(seq 60); do
                out=$(watched 60 "$build/tools/vrdma-run" --run-dir /run/vrdma --guest vm2 -- "$tool" -d vrdma0 \
                    -p "$port" "$@" 10.10.0.1 2>&1) && rc=0 || rc=$?
                [ "$rc" = 0 ] && break
                grep -q "Couldn't connect\|Unable to init the socket" <<<"$out" || break
                sleep 1
            done
        fi
        [ "$rc" = 0 ] && break
        if [ "$rc" = 124 ]; then
            again=" (second run: the first hung, killed after 60 s; test-vm prints what it waited in)"
        elif grep -q "Can't produce a report\|Failed to exchange data" <<<"$out"; then
            again=" (second run: perftest's report failed the first)"
        else
            break
        fi
        [ "$attempt" = 1 ] && echo "$out"
    done
    line=$(awk '$1 ~ /^[0-9]+$/ && NF >= 5 { print; exit }' <<<"$out")
    # ib_read_lat's server only lends its memory: it prints no result.
    [ "$VMID" = 1 ] && [ "$tool" = ib_read_lat ] && [ -z "$line" ] && line="(the server prints no result)"
    if [ "$rc" = 0 ] && [ -n "$line" ]; then
        ok "$tool $* between the VMs$again: $(tr -s ' ' <<<"$line" | sed 's/^ //')"
    else
        echo "$out"
        fail "$tool $*" "exit $rc: $(tail -3 <<<"$out")"
    fi
}
if ! vm_net_up; then
    fail network "eth0 did not come up"
else
    between ibv_rc_pingpong ibv_rc_pingpong -d vrdma0 -n 200 -s 4096
    between ibv_ud_pingpong ibv_ud_pingpong -d vrdma0 -n 200 -s 1024
    between ibv_srq_pingpong ibv_srq_pingpong -d vrdma0 -n 100 -s 4096 -q 4
    # Event mode: completion channels, the VM's process raising the events.
    between "ibv_rc_pingpong -e" ibv_rc_pingpong -d vrdma0 -n 200 -s 4096 -e
    between "ibv_ud_pingpong -e" ibv_ud_pingpong -d vrdma0 -n 200 -s 1024 -e
    between "ibv_srq_pingpong -e" ibv_srq_pingpong -d vrdma0 -n 100 -s 4096 -q 4 -e
    # The six perftest programs, RC, at 8 B and 64 KiB; "ok" when both
    # sides exit 0 and print their result line (perftest checks no data).
    port=18600
    for tool in ib_send_bw ib_write_bw ib_read_bw ib_send_lat ib_write_lat ib_read_lat; do
        for size in 8 65536; do
            perf_between "$tool" "$port" -s "$size" -n 100
            port=$((port + 1))
        done
    done
    # And perftest's latency in event mode (it polls once per event).
    perf_between ib_send_lat "$port" -s 8 -n 100 -e
fi
# VM 2's QEMU killed mid-transfer: VM 1 serves a pingpong far longer than
# the test, VM 2 runs its client, says so in $VM_SHARE/vm2.transfer, and
# scripts/test-vm.sh kills VM 2's QEMU with SIGKILL a few seconds later. VM
# 1's pingpong must end with an error (the shim moves a QP whose peer
# vanished to error, flushing its work requests), not hang; then VM 1 goes
# on to guest h, served by the same shim.
if [ "$VMID" = 1 ]; then
    out=$(timeout 240 "$build/tools/vrdma-run" --run-dir /run/vrdma --guest vm1 -- ibv_rc_pingpong -d vrdma0 \
        -n 10000000 -s 4096 --chk -p 18517 2>&1) && rc=0 || rc=$?
    echo "$out"
    if [ "$rc" != 0 ] && [ "$rc" != 124 ] && grep -q 'Failed status' <<<"$out"; then
        ok "peer error when VM 2's QEMU was killed mid-transfer (exit $rc): $(grep -m1 'Failed status' <<<"$out")"
    else
        fail peer_error "exit $rc (124: it hung until the timeout): $(tail -3 <<<"$out")"
    fi
else
    for _ in $(seq 60); do
        "$build/tools/vrdma-run" --run-dir /run/vrdma --guest vm2 -- ibv_rc_pingpong -d vrdma0 -n 10000000 -s 4096 \
            --chk -p 18517 10.10.0.1 >/tmp/transfer.log 2>&1 &
        transfer=$!
        sleep 3
        kill -0 "$transfer" 2>/dev/null && break
        wait "$transfer"
    done
    if kill -0 "$transfer" 2>/dev/null; then
        ok "transfer to VM 1 running: QEMU may be killed now"
        touch "$VM_SHARE/vm2.transfer"
        wait "$transfer"
        fail not_killed "the transfer ended and this VM is still running: $(tail -2 /tmp/transfer.log)"
    else
        fail transfer "the pingpong to VM 1 did not start: $(tail -3 /tmp/transfer.log)"
    fi
fi
# VM 1 serves guest h of its own shim's host on port 18516, then guest f
# of the other host of the fabric on port 18518 (the messages cross VM 1's
# shim, the TCP fabric and the other shim).
# serve PORT WHO PROGRAM ARGS...: VM 1's server for a client of the host.
serve() {
    local port=$1 who=$2 out rc
    shift 2
    out=$(timeout 180 "$build/tools/vrdma-run" --run-dir /run/vrdma --guest vm1 -- "$@" -d vrdma0 --chk -p "$port" 2>&1) &&
        rc=0 || rc=$?
    echo "$out"
    if [ "$rc" = 0 ] && grep -q ' bytes in ' <<<"$out"; then
        ok "$* with $who (server): $(grep ' bytes in ' <<<"$out")"
    else
        fail "$* with $who" "exit $rc: $(tail -3 <<<"$out")"
    fi
}
if [ "$VMID" = 1 ]; then
    for p in "${vm_host_pingpongs[@]}"; do
        # shellcheck disable=SC2086
        serve 18516 "host guest h" $p
    done
    serve 18518 "guest f across the fabric" ibv_rc_pingpong -n 200 -s 4096
fi
# The verbs suite (Catch2, test/integration/verbs_*.cpp) on VM 1's device,
# both ends of each connection on it, completion channels and async
# events included (the process's event thread raises or forwards them:
# vm_events.h), less what a VM does not offer (docs/protocol.md "VM
# tenants"): shared memory and device memory (a memfd) under an MR, and
# completion timestamps comparable with the VM's clocks (they are the
# host's). Its output is kept in $VM_SHARE/vm1.verbs.log.
vm_skips='~"extended CQ: completions stamped*" ~"ibv_reg_mr takes shared memory*"'
vm_skips+=' ~"shared memory another process*" ~"truncated shared memory*"'
vm_skips+=' ~"memory registration of a shared file*" ~"a zero-based MR over device memory*"'
if [ "$VMID" = 1 ]; then
    timeout 150 "$build/tools/vrdma-run" --run-dir /run/vrdma --guest vm1 -- \
        "$build/test/integration/vrdma-verbs-tests" -d yes "$vm_skips" >"$VM_SHARE/vm1.verbs.log" 2>&1 && rc=0 || rc=$?
    out=$(cat "$VM_SHARE/vm1.verbs.log")
    if [ "$rc" = 0 ] && grep -q '^All tests passed' <<<"$out"; then
        ok "the verbs suite in the VM: $(grep '^All tests passed' <<<"$out")"
    else
        fail verbs_suite "exit $rc: $(grep -E '^test cases|^assertions' <<<"$out" | tr '\n' ' ')"
    fi
fi
# The shim killed: VM 1 runs a process that waits on vrdma0's async
# events and says so in $VM_SHARE/vm1.waiting; scripts/test-vm.sh then
# kills the shim with SIGKILL, which writes nothing into the device page.
# The agent must notice that the shim stopped answering its pings and exit
# 1, and the process must get IBV_EVENT_DEVICE_FATAL.
if [ "$VMID" = 1 ]; then
    "$build/tools/vrdma-run" --run-dir /run/vrdma --guest vm1 -- "$build/test/integration/vrdma-event-waiter" \
        >/tmp/waiter.log 2>&1 &
    waiter=$!
    for _ in $(seq 100); do grep -q '^ready' /tmp/waiter.log && break; sleep 0.1; done
    if grep -q '^ready' /tmp/waiter.log; then
        touch "$VM_SHARE/vm1.waiting"
        for _ in $(seq 1200); do kill -0 "$waiter" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$waiter" 2>/dev/null && kill "$waiter"
        wait "$waiter"
        wrc=$?
        cat /tmp/waiter.log
        # The waiter exits 1 when ibv_get_async_event fails after DEVICE_FATAL.
        if [ "$wrc" = 1 ] && grep -q '^event DEVICE_FATAL' /tmp/waiter.log; then
            ok "IBV_EVENT_DEVICE_FATAL in the VM when the shim was killed: $(tr '\n' ' ' </tmp/waiter.log)"
        else
            fail device_fatal "exit $wrc: $(tr '\n' ' ' </tmp/waiter.log)"
        fi
        for _ in $(seq 300); do kill -0 "$agent" 2>/dev/null || break; sleep 0.1; done
        wait "$agent"
        arc=$?
        if [ "$arc" = 1 ] && grep -q 'has not answered' /tmp/agent.log; then
            ok "agent exited 1: $(grep -m1 'has not answered' /tmp/agent.log); $(grep -m1 'device is gone' /tmp/agent.log)"
        else
            fail agent_exit "exit $arc: $(tail -3 /tmp/agent.log)"
        fi
    else
        fail waiter "the event waiter did not start: $(tail -3 /tmp/waiter.log)"
        kill "$waiter" "$agent" 2>/dev/null
    fi
    exit "$status"
fi
kill "$agent" 2>/dev/null
wait "$agent" 2>/dev/null
[ -e /run/vrdma/ready ] && fail agent-stop "the agent left its ready file" || ok "agent stopped"
exit "$status"
