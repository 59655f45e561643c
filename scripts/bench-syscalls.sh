#!/usr/bin/env bash
# System calls, context switches and CPU time per message in the shims: the
# proxy for per-message work that needs no many-core machine and no
# hardware counters (this machine's virtual CPUs have none, so `perf stat`
# counts the kernel's syscall tracepoints and software events instead).
# Separate from the tests; needs root (perf, network namespaces).
#
# Workloads, each with perf stat attached to every shim for its length:
#   same host   ib_send_lat -s 8 between guests a and b of one shim, then
#               the same with -e (the guests sleep until completion events)
#   fabric      ib_send_lat -s 8 between guest a (host 1) and guest b
#               (host 2), two shims joined by the TCP fabric as in
#               scripts/bench-fabric.sh
#   fabric      ib_write_bw -s 64 (a stream of 64-byte RDMA writes)
# The fabric workloads run once for each --fabric-ack-delay in ACK_DELAYS
# (default "0 10": acknowledge at once, the behaviour before delayed ACKs,
# and the default), so the table compares them in one run.
#
# Counts are per round trip for ib_send_lat (one message each way) and per
# message for ib_write_bw, for each shim. "data" calls are the reads and
# writes that moved bytes; "empty reads" found nothing (EAGAIN); yields
# and epoll_wait are the idle loop's. An idle shim's calls depend on how
# long it waits, so the data calls are the figure that compares builds.
#
# Environment: BUILD_DIR (default build), ITERS_LAT (20000), ITERS_RATE
# (200000), ACK_DELAYS ("0 10").
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$src/build}"
ITERS_LAT="${ITERS_LAT:-20000}"
ITERS_RATE="${ITERS_RATE:-200000}"
ACK_DELAYS="${ACK_DELAYS:-0 10}"

if [ -z "${BENCH_SYSCALLS_PHASE:-}" ]; then
    [ -x "$build/src/shim/vrdma-shim" ] || BUILD_DIR="$build" "$src/scripts/build.sh"
    [ "$(id -u)" -eq 0 ] || { echo "bench-syscalls: needs root (perf, network namespaces)" >&2; exit 3; }
    command -v perf >/dev/null || { echo "bench-syscalls: no perf (apt-get install linux-perf)" >&2; exit 3; }
    perf stat -e raw_syscalls:sys_enter -- true >/dev/null 2>&1 ||
        { echo "bench-syscalls: perf cannot count syscall tracepoints here (is tracefs mounted?)" >&2; exit 3; }
    echo "measuring (a minute or two)..." >&2
    echo "| workload | shim | --fabric-ack-delay (us) | result | syscalls | data writes | data reads | empty reads | sched_yield | epoll_wait | context switches | CPU (us) |"
    echo "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    # phase NAME [DELAY]: one part in its own process (its own shims and
    # namespaces); what it logs is shown only if it fails.
    phase() {
        local log
        log="$(mktemp /tmp/vrdma-bench-syscalls.XXXXXX)"
        if ! BENCH_SYSCALLS_PHASE="$1" ACK_DELAY="${2:-}" "$0" >"$log" 2>&1; then
            cat "$log" >&2
            rm -f "$log"
            echo "bench-syscalls: the $1 part failed" >&2
            exit 1
        fi
        grep '^| ' "$log" || true   # the rows (the test library's own lines stay out)
        rm -f "$log"
    }
    echo "  same host" >&2
    phase same
    for d in $ACK_DELAYS; do
        echo "  fabric, --fabric-ack-delay $d" >&2
        phase fabric "$d"
    done
    echo
    echo "Per round trip (ib_send_lat, $ITERS_LAT iterations) or per 64-byte write (ib_write_bw, $ITERS_RATE writes), each shim's whole process. Machine: $(nproc) cores, $(uname -r)."
    exit 0
fi

if [ "$BENCH_SYSCALLS_PHASE" = fabric ]; then
    export VRDMA_TOPOLOGY=two-hosts VRDMA_SHIM_ARGS="--workers 1 --fabric-ack-delay $ACK_DELAY"
else
    export VRDMA_TOPOLOGY=one-host
fi
export VRDMA_BUILD_DIR="$build"
# shellcheck source=../test/integration/lib.sh
source "$src/test/integration/lib.sh"   # its EXIT trap removes everything
start_shim a b
if [ "$BENCH_SYSCALLS_PHASE" = fabric ]; then
    pids=("${HOST_PID[1]}" "${HOST_PID[2]}")
    names=("host 1 (guest a, the server)" "host 2 (guest b, the client: it writes)")
else
    pids=("$SHIM_PID")
    names=("the shim")
    ACK_DELAY="(no fabric)"
fi

events="raw_syscalls:sys_enter,syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg,syscalls:sys_enter_sched_yield"
events="$events,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait,context-switches,task-clock"

port=22715
# measure LABEL PER TOOL ARGS...: runs TOOL (server in guest a, client in
# guest b) with perf stat on every shim; prints one table row per shim.
measure() {
    local label="$1" per="$2" tool="$3"
    shift 3
    port=$((port + 1))
    "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- "$tool" -d vrdma0 -p $port "$@" >/dev/null 2>&1 &
    local server=$! i
    wait_port $port
    local perfs=()
    for i in "${!pids[@]}"; do
        # Reads: all of them, and those that found nothing (a filter
        # applies to the event before it).
        perf stat -x, -o "$RUN_DIR.perf.$i" -p "${pids[$i]}" -e "$events" \
            -e syscalls:sys_exit_recvfrom -e syscalls:sys_exit_recvfrom --filter 'ret < 0' 2>/dev/null &
        perfs+=($!)
    done
    sleep 0.5   # perf attached
    local line
    line="$("$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- "$tool" -d vrdma0 -p $port "$@" 127.0.0.1 |
        awk '$1 ~ /^[0-9]+$/ && NF >= 5 { print; exit }')"
    wait "$server" || fail "$tool $* (server) failed"
    kill -INT "${perfs[@]}"
    wait "${perfs[@]}" 2>/dev/null || true
    [ -n "$line" ] || fail "$tool $*: no result"
    local result
    if [ "$tool" = ib_send_lat ]; then
        result="$(awk '{ printf "%s us typical", $5 }' <<<"$line")"
    else
        result="$(awk '{ printf "%.2f M writes/s", $5 }' <<<"$line")"
    fi
    for i in "${!pids[@]}"; do
        awk -F, -v per="$per" -v label="$label" -v shim="${names[$i]}" -v delay="${ACK_DELAY:-}" -v result="$result" '
            /^#/ || NF < 3 { next }
            { v = $1 + 0; e = $3 }
            e ~ /raw_syscalls:sys_enter/ { all = v }
            e ~ /sys_enter_sendto/ || e ~ /sys_enter_sendmsg/ { writes += v }
            e ~ /sys_exit_recvfrom/ { if (seen_rx++) empty = v; else reads = v }
            e ~ /sched_yield/ { yields = v }
            e ~ /epoll_wait/ || e ~ /epoll_pwait/ { epw += v }
            e ~ /context-switches/ { cs = v }
            e ~ /task-clock/ { ms = v }   # msec
            END {
                f = "%.2f"
                printf "| %s | %s | %s | %s | " f " | " f " | " f " | " f " | " f " | " f " | " f " | " f " |\n",
                    label, shim, delay, result, all / per, writes / per, (reads - empty) / per, empty / per,
                    yields / per, epw / per, cs / per, ms * 1000 / per
            }' "$RUN_DIR.perf.$i"
    done
}

if [ "$BENCH_SYSCALLS_PHASE" = fabric ]; then
    measure "fabric, ib_send_lat 8 B" "$ITERS_LAT" ib_send_lat -s 8 -n "$ITERS_LAT"
    measure "fabric, ib_write_bw 64 B" "$ITERS_RATE" ib_write_bw -s 64 -n "$ITERS_RATE"
else
    measure "same host, ib_send_lat 8 B" "$ITERS_LAT" ib_send_lat -s 8 -n "$ITERS_LAT"
    # The guests wait for completion events: between messages they sleep
    # and the shim idles.
    measure "same host, ib_send_lat -e 8 B" "$ITERS_LAT" ib_send_lat -s 8 -n "$ITERS_LAT" -e
fi
