#!/usr/bin/env bash
# VM 1's half of scripts/bench-vm.sh (VM 2 only boots and powers off):
# with the VM's agent serving vm1's device, runs the perftest clients
# against the servers scripts/bench-vm.sh runs in host guest h, reached
# over QEMU's user network (the host is 10.0.2.2): ib_write_bw 64 KiB on
# port $BENCH_PORT, then ib_send_lat 8 B on the next, then ib_send_lat -e
# (event mode) on the one after. Each client's result line goes to
# $VM_SHARE/vm1.bench ("write_bw LINE", "send_lat LINE", "send_lat_e
# LINE"); exit 1 if one fails.
set -uo pipefail
# shellcheck source=vm-lib.sh
source "$(dirname "$0")/vm-lib.sh"
[ "$VMID" = 1 ] || exit 0
build=${1:-${VM_GARGS:-}}
port=$(cat "$VM_SHARE/bench.port")
out="$VM_SHARE/vm1.bench"
: >"$out"
vm_net_up || { echo "the network did not come up" >&2; exit 1; }
vm_agent_start "$build" || exit 1
status=0
# client NAME PORT TOOL ARGS...: retried until the host's server listens.
client() {
    local name=$1 p=$2 line=""
    shift 2
    for _ in $(seq 120); do
        line=$("$build/tools/vrdma-run" --run-dir /run/vrdma --guest vm1 -- "$@" -d vrdma0 -p "$p" 10.0.2.2 2>&1 |
            awk '$1 ~ /^[0-9]+$/ && NF >= 5 { print; exit }')
        [ -n "$line" ] && break
        sleep 1
    done
    if [ -n "$line" ]; then echo "$name $line" >>"$out"; else status=1; fi
}
client write_bw "$port" ib_write_bw -s 65536 -n "${BENCH_ITERS_BW:-500}"
client send_lat "$((port + 1))" ib_send_lat -s 8 -n "${BENCH_ITERS_LAT:-2000}"
client send_lat_e "$((port + 2))" ib_send_lat -s 8 -n "${BENCH_ITERS_LAT:-2000}" -e
kill "$agent" 2>/dev/null
exit "$status"
