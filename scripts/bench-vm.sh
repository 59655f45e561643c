#!/usr/bin/env bash
# Usage: scripts/bench-vm.sh [--help]
#
# A VM guest against host guests, in one run (docs/performance.md "VM
# guests"). Starts a shim serving host guests h and h2 and the VM guest
# vm1, measures ib_write_bw (64 KiB), ib_send_lat (8 B) and ib_send_lat -e
# (8 B, event mode: completion channels) from h2 to h
# (the baseline: two host guests), then boots a QEMU VM (TCG, stock
# kernel, scripts/vm/) whose ivshmem device is vm1's, and measures the same
# from vm1, its client in the VM (test/vm/vm-bench.sh) and its server in
# h. Prints a markdown table with the ratios. Under TCG the VM's CPU is
# emulated, instruction by instruction: the ratios say what emulation
# costs a VM's process, not what a VM under KVM would see (the data path
# is the same shared memory either way; see docs/protocol.md "VM
# tenants").
#
# Env: VRDMA_BUILD_DIR  the build (default: build/; built if missing)
#      VRDMA_VM_WORK    the VMs' kernel and initramfs (default /var/tmp/vrdma-vm)
#      BENCH_ITERS_BW, BENCH_ITERS_LAT  iterations (500, 2000)
set -euo pipefail
# shellcheck source=lib/vm_test.sh
source "$(dirname "$0")/lib/vm_test.sh"
vm_test_start bench-vm "$0" "$@"
# shellcheck source=lib/bench.sh
source "$root/scripts/lib/bench.sh"
export BENCH_ITERS_BW=${BENCH_ITERS_BW:-500} BENCH_ITERS_LAT=${BENCH_ITERS_LAT:-2000}

run_dir=$(mktemp -d /tmp/vrdma-bench-vm.XXXXXX)
"$build/src/shim/vrdma-shim" --run-dir "$run_dir" --workers 1 --guest h --guest h2 --guest vm1:vm:vm-memory=256M \
    >"$run_dir.log" 2>&1 &
shim=$!
cleanup() {
    jobs -p | xargs -r kill 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$run_dir" "$run_dir.log"
}
trap cleanup EXIT
for _ in $(seq 100); do [ -e "$run_dir/ready" ] && break; sleep 0.1; done

echo "bench-vm: host guests (h2 -> h)..." >&2
port=$((20000 + $$ % 20000))
host_bw=$(perftest h h2 ib_write_bw -s 65536 -n "$BENCH_ITERS_BW")
host_lat=$(perftest h h2 ib_send_lat -s 8 -n "$BENCH_ITERS_LAT")
host_lat_e=$(perftest h h2 ib_send_lat -s 8 -n "$BENCH_ITERS_LAT" -e)

echo "bench-vm: booting the VM (vm1 -> h)..." >&2
vm_port=$((port + 10))
mkdir -p "$work/share"
echo "$vm_port" >"$work/share/bench.port"
rm -f "$work/share/vm1.bench"
in_guest h ib_write_bw -d vrdma0 -p "$vm_port" -s 65536 -n "$BENCH_ITERS_BW" >/dev/null 2>&1 &
in_guest h ib_send_lat -d vrdma0 -p "$((vm_port + 1))" -s 8 -n "$BENCH_ITERS_LAT" >/dev/null 2>&1 &
in_guest h ib_send_lat -d vrdma0 -p "$((vm_port + 2))" -s 8 -n "$BENCH_ITERS_LAT" -e >/dev/null 2>&1 &
VM_QEMU_ARGS1="-chardev socket,path=$run_dir/vm1/ivshmem.sock,id=vrdma -device ivshmem-doorbell,chardev=vrdma,vectors=2 \
-netdev user,id=u -device virtio-net-pci,netdev=u,mac=52:54:00:00:01:01" \
    "$root/scripts/vm/run-pair.sh" --timeout 600 --gargs "$build" "$work" "$root/test/vm/vm-bench.sh" /bin/true >&2 ||
    echo "bench-vm: the VM run failed (its log: $work/share/vm1.log)" >&2
vm_bw=$(sed -n 's/^write_bw //p' "$work/share/vm1.bench" 2>/dev/null)
vm_lat=$(sed -n 's/^send_lat //p' "$work/share/vm1.bench" 2>/dev/null)
vm_lat_e=$(sed -n 's/^send_lat_e //p' "$work/share/vm1.bench" 2>/dev/null)

bw() { awk '{print $4}' <<<"$1"; }    # BW average [MB/sec]
col() { awk -v c="$2" '{print $c}' <<<"$1"; }
cat <<TABLE
| measurement | vm1 (TCG VM) -> h | h2 -> h (host guests) | ratio |
|---|---|---|---|
| ib_write_bw 64 KiB (MB/s, average) | $(bw "$vm_bw") | $(bw "$host_bw") | $(ratio "$(bw "$vm_bw")" "$(bw "$host_bw")") of the host's |
| ib_send_lat 8 B (us, typical) | $(col "$vm_lat" 5) | $(col "$host_lat" 5) | $(ratio "$(col "$vm_lat" 5)" "$(col "$host_lat" 5)") x |
| ib_send_lat 8 B (us, average) | $(col "$vm_lat" 6) | $(col "$host_lat" 6) | $(ratio "$(col "$vm_lat" 6)" "$(col "$host_lat" 6)") x |
| ib_send_lat 8 B (us, 99th percentile) | $(col "$vm_lat" 8) | $(col "$host_lat" 8) | $(ratio "$(col "$vm_lat" 8)" "$(col "$host_lat" 8)") x |
| ib_send_lat -e 8 B, event mode (us, typical) | $(col "$vm_lat_e" 5) | $(col "$host_lat_e" 5) | $(ratio "$(col "$vm_lat_e" 5)" "$(col "$host_lat_e" 5)") x |
| ib_send_lat -e 8 B, event mode (us, average) | $(col "$vm_lat_e" 6) | $(col "$host_lat_e" 6) | $(ratio "$(col "$vm_lat_e" 6)" "$(col "$host_lat_e" 6)") x |
TABLE
