#!/usr/bin/env bash
# One VM's half of scripts/test-hca.sh: run inside VM 1 or 2 booted by
# scripts/vm/run-pair.sh, with the build directory as $VM_GARGS.
#
# Brings rxe0 up (lib.sh), measures perftest directly on rxe0 (the
# baseline), starts a vrdma-shim with --hca rxe0 serving guests gN and gNb
# that joins the other VM's shim, runs the clients across the two VMs' gN
# guests (VM 1 is every server, VM 2 every client, retrying until its server
# listens), checks the copy counters, then the failure cases
# (vm-failures.sh). Each check prints "ok NAME" or "FAIL NAME: why"; the
# script exits 1 if any failed. Results for the host: $VM_SHARE/vmN.results.
set -uo pipefail

# shellcheck source=lib.sh
source "$(cd "$(dirname "$0")" && pwd)/lib.sh"
: >"$results"

# Field N of the last result row of a perftest bandwidth run in FILE.
bw_row_field() { awk -v f="$1" '/^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+/ { v = $f } END { print v }' "$2"; }
# The figure perftest prints for a run: BW average (MB/s) or t_avg (usec).
bw_of() { bw_row_field 4 "$1"; }
# ud_received_some NAME: on VM 1 (the receiving server), a UD burst run for
# a duration reported datagrams received (perftest exits 0 with none).
ud_received_some() {
    [ "$N" = 1 ] || return 0
    local n
    n=$(bw_row_field 2 "/tmp/$1.out")
    n=${n:-0}
    if [ "$n" -gt 0 ]; then ok "$1-received ($n datagrams)"; else
        fail "$1-received" "no datagram counted: $(tail -3 "/tmp/$1.out" | tr '\n' ' ')"
    fi
}
# Latency: t_avg, and t_typical (the median: a TCG hiccup moves it less).
lat_of() { awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+/ { v = $6 " (typical " $5 ")" } END { print v }' "$1"; }

# 1. Baseline: perftest on rxe0 directly.
run_pair base_write_bw 18600 ib_write_bw -d rxe0 -x "$RXE_GID_INDEX" -s 65536 -n 100 -F
run_pair base_send_lat 18601 ib_send_lat -d rxe0 -x "$RXE_GID_INDEX" -s 8 -n 100 -F

# 2. The shims, joined over TCP, each with rxe0 (lib.sh start_shim).
if start_shim; then ok fabric-up; else
    fail fabric-up "$(tail -5 /tmp/shim.log | tr '\n' ' ')"
    cat /tmp/shim.log >>"$results"
    exit 1
fi

# 3. Across the device: the pingpongs with data checked, perftest.
run_pair rc_pingpong 18700 "${RUN[@]}" ibv_rc_pingpong -d vrdma0 -g 0 -n 50 -s 4096 -c
run_pair srq_pingpong 18714 "${RUN[@]}" ibv_srq_pingpong -d vrdma0 -g 0 -n 50 -s 4096 -c
run_pair write_bw_64k 18701 "${RUN[@]}" ib_write_bw -d vrdma0 -s 65536 -n 100 -F
run_pair write_bw_1m 18702 "${RUN[@]}" ib_write_bw -d vrdma0 -s 1048576 -n 20 -F
run_pair read_bw 18703 "${RUN[@]}" ib_read_bw -d vrdma0 -s 65536 -n 100 -F
run_pair read_bw_1m 18711 "${RUN[@]}" ib_read_bw -d vrdma0 -s 1048576 -n 20 -F
run_pair send_bw 18704 "${RUN[@]}" ib_send_bw -d vrdma0 -s 65536 -n 100 -F
run_pair send_bw_1m 18712 "${RUN[@]}" ib_send_bw -d vrdma0 -s 1048576 -n 20 -F
run_pair atomic_bw 18705 "${RUN[@]}" ib_atomic_bw -d vrdma0 -n 100 -F
run_pair write_lat 18706 "${RUN[@]}" ib_write_lat -d vrdma0 -s 8 -n 100 -F
run_pair send_lat 18707 "${RUN[@]}" ib_send_lat -d vrdma0 -s 8 -n 100 -F
run_pair read_lat 18708 "${RUN[@]}" ib_read_lat -d vrdma0 -s 8 -n 100 -F
run_pair write_lat_64k 18713 "${RUN[@]}" ib_write_lat -d vrdma0 -s 65536 -n 50 -F
# UD through the devices too (hca_ud.h): the datagrams' source LID and GRH
# are the guests'.
run_pair ud_pingpong 18709 "${RUN[@]}" ibv_ud_pingpong -d vrdma0 -g 0 -n 50 -s 1024 -c
# The UD burst runs for 2 s, not for a count: UD may lose a datagram, and a
# counting server then waits for it forever (CI once lost one of 100: the
# wire between the QEMUs is UDP, and a datagram may beat the shim's
# forwarding of its receive, docs/protocol.md "Receive queue"). The shim
# losing one is still caught: ud_lost must stay 0 (zero-copy, below).
run_pair send_bw_ud 18710 "${RUN[@]}" ib_send_bw -d vrdma0 -c UD -s 1024 -D 2 -F
ud_received_some send_bw_ud

# rdma_cm between the VMs' guests (10.20.0.1 and .2): the CM messages go
# between the shims over the fabric, the QPs then talk through the device
# (counted in the zero-copy check below).
cm_ip=$cm_prefix.1
cm_pair cm_rping "${RUN[@]}" rping -s -a "$cm_ip" -p 18720 -C 20 -S 4096 ::: "${RUN[@]}" rping -c -a "$cm_ip" -p 18720 -C 20 -S 4096 -v
if [ "$N" = 2 ] && [ "$(grep -c '^ping data: rdma-ping-' /tmp/cm_rping.out)" != 20 ]; then
    fail cm_rping_data "not 20 verified pings: $(tail -2 /tmp/cm_rping.out | tr '\n' ' ')"
fi
cm_pair cm_write_bw "${RUN[@]}" ib_write_bw -R -d vrdma0 -s 65536 -n 100 -F -p 18721 ::: \
    "${RUN[@]}" ib_write_bw -R -d vrdma0 -s 65536 -n 100 -F -p 18721 "$cm_ip"
cm_pair cm_send_bw_ud "${RUN[@]}" ib_send_bw -R -c UD -d vrdma0 -s 1024 -D 2 -F -p 18722 ::: \
    "${RUN[@]}" ib_send_bw -R -c UD -d vrdma0 -s 1024 -D 2 -F -p 18722 "$cm_ip"
ud_received_some cm_send_bw_ud

# 4. Zero-copy, shown: the device carried the payloads, the CPU copied none.
"${CTL[@]}" transports >/tmp/transports.out 2>&1
say "transports: $(tr '\n' ';' </tmp/transports.out)"
local_copied=$(awk '$1 == "local" { print $3 }' /tmp/transports.out)
tcp_copied=$(awk '$1 == "tcp" { print $3 }' /tmp/transports.out)
hca_sends=$(awk '$1 == "hca" { print $4 }' /tmp/transports.out)
ud_lost=$(awk '$1 == "hca" { for (i = 1; i < NF; i++) if ($i == "ud_lost") print $(i + 1) }' /tmp/transports.out)
if [ "${local_copied:-x}" = 0 ] && [ "${tcp_copied:-x}" = 0 ] && [ "${hca_sends:-0}" -gt 0 ] &&
    [ "${ud_lost:-x}" = 0 ]; then ok zero-copy; else
    fail zero-copy "local copied_bytes ${local_copied:-?}, tcp copied_bytes ${tcp_copied:-?}, hca sends ${hca_sends:-?}, ud_lost ${ud_lost:-?}"
fi
say "figures base_write_bw_MBps $(bw_of /tmp/base_write_bw.out) vrdma_write_bw_MBps $(bw_of /tmp/write_bw_64k.out)" \
    "base_send_lat_us $(lat_of /tmp/base_send_lat.out) vrdma_send_lat_us $(lat_of /tmp/send_lat.out)"

# 5. The verbs Catch2 suite through the device: its two ends are guests of
# one shim, so a second shim with --hca-local serves them (each VM runs it
# on its own device), on one worker: on two, a UC receive the guest posted
# before the peer's send may reach the device after it (another worker
# hands it over), and UC drops that message (docs/protocol.md "Workers").
# The cases where the device tells one worker about the other's QP (a
# remote error: Engine::fail_responder_of) run again on two workers
# below. Left out, and why
# (docs/protocol.md, "The HCA transport"): where the device, not the shim,
# is the responder it decides the outcome, and rxe's differs from the
# shim's; the rest are the stated gaps of the device path.
VERBS_EXCLUDED=(
    '~type 2:*'                         # type 2 windows are not put on rxe: its 6.1
    '~send with invalidate frees*'      #   driver crashes the kernel when a Send with
    '~bind and invalidate errors*'      #   Invalidate names an unbound one
    '~the extended QP API binds*'       #   (hca_device.h takes_windows); a bind
    '~UC: a window bound*'              #   through the device fails MW_BIND_ERR
    '~send with invalidate of an rkey*' # rxe completes it with success when the key
                                        #   is an MR's or a type 1 window's
    '~atomic write*'                    # not carried by the device (rxe on 6.1 has none)
    '~solicited_only*'                  # a device completion does not say "solicited"
    '~QP_REQ_ERR*'                      # rxe completes a SEND too large for the receive
                                        #   with REM_OP_ERR, not REM_INV_REQ_ERR
    '~a receive buffer too small*'      # rxe: IBV_WC_LOC_QP_OP_ERR, not LOC_LEN_ERR
    '~UC: a message with no receive*'   #   (and the UC QP goes to ERR)
    '~truncated shared memory*'         # the device's MR pins the pages it registered:
    '~memory registration preserves*'   #   memory mapped anew under it is not seen
    '~memory registration of a shared file*'  # split out of the one above, never run
                                        #   through the device: a stated gap
    '~Multicast:*'                      # with --hca, UD QPs receive on the device: no multicast
    '~[tm]'                             # nor tag matching: SRQs are the device's
)
"$SHIM" --run-dir /run/vrdma-loop --guest a --guest b --lid-base 100 --workers 1 --hca rxe0 --hca-local >/tmp/loop.log 2>&1 &
loop_pid=$!
for _ in $(seq 1 100); do [ -e /run/vrdma-loop/ready ] && break; sleep 0.1; done
# Two guests of one shim, by memcpy (the fabric shim) and through the
# device's loopback (this one): figures for docs/performance.md.
local_pair() {  # local_pair NAME RUN_DIR GUEST_A GUEST_B PERFTEST ARGS...
    local name=$1 dir=$2 ga=$3 gb=$4
    shift 4
    "$build/tools/vrdma-run" --run-dir "$dir" --guest "$ga" -- "$@" -p 18900 >"/tmp/$name.srv" 2>&1 &
    local srv=$!
    if connect_retrying 120 "/tmp/$name.out" "$build/tools/vrdma-run" --run-dir "$dir" --guest "$gb" -- \
        "$@" -p 18900 localhost && wait "$srv"; then ok "$name"; else
        fail "$name" "$(tail -3 "/tmp/$name.out" "/tmp/$name.srv" | tr '\n' ' ')"
        kill "$srv" 2>/dev/null
    fi
}
local_pair memcpy_write_bw /run/vrdma "g$N" "g${N}b" ib_write_bw -d vrdma0 -s 65536 -n 200 -F
local_pair loopback_write_bw /run/vrdma-loop a b ib_write_bw -d vrdma0 -s 65536 -n 200 -F
local_pair memcpy_send_lat /run/vrdma "g$N" "g${N}b" ib_send_lat -d vrdma0 -s 8 -n 200 -F
local_pair loopback_send_lat /run/vrdma-loop a b ib_send_lat -d vrdma0 -s 8 -n 200 -F
say "figures one host: memcpy_write_bw_MBps $(bw_of /tmp/memcpy_write_bw.out) loopback_write_bw_MBps" \
    "$(bw_of /tmp/loopback_write_bw.out) memcpy_send_lat_us $(lat_of /tmp/memcpy_send_lat.out)" \
    "loopback_send_lat_us $(lat_of /tmp/loopback_send_lat.out)"
if VRDMA_TEST_DEVICE_KEYS=1 VRDMA_TEST_THROUGH_RXE=1 timeout 600 "$build/tools/vrdma-run" --run-dir /run/vrdma-loop --guest a --guest b -- \
    "$build/test/integration/vrdma-verbs-tests" "${VERBS_EXCLUDED[@]}" >/tmp/verbs.out 2>&1; then
    ok "verbs-suite-through-device ($(grep -a "^All tests passed" /tmp/verbs.out))"
else
    fail verbs-suite-through-device "$(grep -a -B2 -A3 FAILED /tmp/verbs.out | head -20 | tr '\n' ' ') $(tail -2 /tmp/verbs.out | tr '\n' ' ')"
fi
say "verbs suite transports: $("${CTL[0]}" --run-dir /run/vrdma-loop transports | tr '\n' ';')"
kill "$loop_pid"
wait "$loop_pid"
# The responder's failure across workers: a and b on two workers, the
# requester's device completion tells the responder's worker.
"$SHIM" --run-dir /run/vrdma-loop2 --guest a --guest b --lid-base 100 --workers 2 --hca rxe0 --hca-local \
    >/tmp/loop2.log 2>&1 &
loop_pid=$!
for _ in $(seq 1 100); do [ -e /run/vrdma-loop2/ready ] && break; sleep 0.1; done
if VRDMA_TEST_DEVICE_KEYS=1 VRDMA_TEST_THROUGH_RXE=1 timeout 300 "$build/tools/vrdma-run" --run-dir /run/vrdma-loop2 \
    --guest a --guest b -- "$build/test/integration/vrdma-verbs-tests" \
    'remote access is checked*,QP_ACCESS_ERR*,QP_FATAL: a receive WQE*' >/tmp/verbs2.out 2>&1 &&
    grep -aq "^All tests passed (.* in 3 test cases)" /tmp/verbs2.out; then
    ok "responder-failure-across-workers ($(grep -a "^All tests passed" /tmp/verbs2.out))"
else
    fail responder-failure-across-workers "$(grep -a -B2 -A3 FAILED /tmp/verbs2.out | head -20 | tr '\n' ' ') $(tail -2 /tmp/verbs2.out | tr '\n' ' ')"
fi
kill "$loop_pid"
wait "$loop_pid"

# 6. Failures: the remote shim killed, a guest killed, the link lost.
# shellcheck source=vm-failures.sh
source "$(dirname "$0")/vm-failures.sh"

finish
