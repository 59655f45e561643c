#!/usr/bin/env bash
# One VM's half of scripts/test-hca.sh: run inside VM 1 or 2 booted by
# scripts/vm/run-pair.sh, with the build directory as $VM_GARGS.
#
# Brings rxe0 up, measures perftest directly on rxe0 (the baseline), starts
# a vrdma-shim with --hca rxe0 serving guest gN (LID N) that joins the other
# VM's shim, and runs the clients across the two guests: VM 1 is every
# server, VM 2 every client (a client retries until its server listens).
# Each check prints "ok NAME" or "FAIL NAME: why"; the script exits 1 if
# any failed. Results for the host: $VM_SHARE/vmN.results.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${VM_GARGS:?the build directory (run-pair.sh --gargs)}
N=${VMID:?}
peer=$((3 - N))
share=${VM_SHARE:?}
results=$share/vm$N.results
: >"$results"
failures=0

say() { echo "$*" | tee -a "$results"; }
ok() { say "ok $1"; }
fail() {
    say "FAIL $1: $2"
    failures=$((failures + 1))
}

# shellcheck source=../../scripts/vm/rxe-up.sh
source "$src/scripts/vm/rxe-up.sh" >/dev/null || {
    fail rxe-up "Soft-RoCE did not come up"
    exit 1
}

SHIM=$build/src/shim/vrdma-shim
RUN=("$build/tools/vrdma-run" --run-dir /run/vrdma --guest "g$N" --)
CTL=("$build/tools/vrdmactl" --run-dir /run/vrdma)
server_ip=10.10.0.1

# run_pair NAME PORT CMD...: VM 1 serves, VM 2 connects to VM 1 (retrying
# while nobody listens yet). Output goes to /tmp/NAME.out.
run_pair() {
    local name=$1 port=$2
    shift 2
    local out=/tmp/$name.out
    if [ "$N" = 1 ]; then
        if timeout 180 "$@" -p "$port" >"$out" 2>&1; then ok "$name"; else fail "$name" "server: $(tail -3 "$out" | tr '\n' ' ')"; fi
        return
    fi
    local tries=0
    while :; do
        if timeout 180 "$@" -p "$port" "$server_ip" >"$out" 2>&1; then
            ok "$name"
            return
        fi
        if grep -qiE "couldn't connect|unable to connect|connection refused|Failed to connect" "$out" && [ $tries -lt 120 ]; then
            tries=$((tries + 1))
            sleep 0.5
            continue
        fi
        fail "$name" "client: $(tail -3 "$out" | tr '\n' ' ')"
        return
    done
}

# The figure perftest prints for a run: BW average (MB/s) or t_avg (usec).
bw_of() { awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+/ { v = $4 } END { print v }' "$1"; }
lat_of() { awk '/^ *[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+/ { v = $6 } END { print v }' "$1"; }

# 1. Baseline: perftest on rxe0 directly.
run_pair base_write_bw 18600 ib_write_bw -d rxe0 -x "$RXE_GID_INDEX" -s 65536 -n 100 -F
run_pair base_send_lat 18601 ib_send_lat -d rxe0 -x "$RXE_GID_INDEX" -s 8 -n 100 -F

# 2. The shims, joined over TCP, each with rxe0.
"$SHIM" --run-dir /run/vrdma --guest "g$N" --lid-base "$N" --fabric-listen "10.10.0.$N:7400" \
    --fabric-peer "10.10.0.$peer:7400" --fabric-key "$share/fabric.key" --hca rxe0 >/tmp/shim.log 2>&1 &
shim_pid=$!
for _ in $(seq 1 300); do
    "${CTL[@]}" peers 2>/dev/null | grep -q "state up" && break
    sleep 0.2
done
if "${CTL[@]}" peers 2>/dev/null | grep -q "state up"; then ok fabric-up; else
    fail fabric-up "$(tail -5 /tmp/shim.log | tr '\n' ' ')"
    cat /tmp/shim.log >>"$results"
    exit 1
fi

# 3. Across the device: the pingpongs with data checked, perftest.
run_pair rc_pingpong 18700 "${RUN[@]}" ibv_rc_pingpong -d vrdma0 -g 0 -n 50 -s 4096 -c
run_pair write_bw_64k 18701 "${RUN[@]}" ib_write_bw -d vrdma0 -s 65536 -n 100 -F
run_pair write_bw_1m 18702 "${RUN[@]}" ib_write_bw -d vrdma0 -s 1048576 -n 20 -F
run_pair read_bw 18703 "${RUN[@]}" ib_read_bw -d vrdma0 -s 65536 -n 100 -F
run_pair send_bw 18704 "${RUN[@]}" ib_send_bw -d vrdma0 -s 65536 -n 100 -F
run_pair atomic_bw 18705 "${RUN[@]}" ib_atomic_bw -d vrdma0 -n 100 -F
run_pair write_lat 18706 "${RUN[@]}" ib_write_lat -d vrdma0 -s 8 -n 100 -F
run_pair send_lat 18707 "${RUN[@]}" ib_send_lat -d vrdma0 -s 8 -n 100 -F
run_pair read_lat 18708 "${RUN[@]}" ib_read_lat -d vrdma0 -s 8 -n 100 -F
# UD is not on the device yet: between these shims it goes over their TCP link.
run_pair ud_pingpong 18709 "${RUN[@]}" ibv_ud_pingpong -d vrdma0 -g 0 -n 50 -s 1024 -c

# 4. Zero-copy, shown: the device carried the payloads, the CPU copied none.
"${CTL[@]}" transports >/tmp/transports.out 2>&1
say "transports: $(tr '\n' ';' </tmp/transports.out)"
local_copied=$(awk '$1 == "local" { print $3 }' /tmp/transports.out)
hca_sends=$(awk '$1 == "hca" { print $4 }' /tmp/transports.out)
if [ "${local_copied:-x}" = 0 ] && [ "${hca_sends:-0}" -gt 0 ]; then ok zero-copy; else
    fail zero-copy "local copied_bytes ${local_copied:-?}, hca sends ${hca_sends:-?}"
fi
say "figures base_write_bw_MBps $(bw_of /tmp/base_write_bw.out) vrdma_write_bw_MBps $(bw_of /tmp/write_bw_64k.out)" \
    "base_send_lat_us $(lat_of /tmp/base_send_lat.out) vrdma_send_lat_us $(lat_of /tmp/send_lat.out)"

kill "$shim_pid" 2>/dev/null
wait "$shim_pid" 2>/dev/null
grep -E "^vrdma-shim: (warning|error)" /tmp/shim.log | head -20 >>"$results"
[ "$failures" = 0 ]
