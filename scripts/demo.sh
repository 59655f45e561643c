#!/usr/bin/env bash
# The demo: installs what is missing, builds, starts a shim with two guests,
# shows ibv_devinfo in guest a and runs perftest's ib_write_bw between guest a
# and guest b, then stops the shim.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$src/build}"
"$src/scripts/install-deps.sh"
BUILD_DIR="$build" "$src/scripts/build.sh"

run_dir="$(mktemp -d /tmp/vrdma-demo.XXXXXX)"
"$build/src/shim/vrdma-shim" --run-dir "$run_dir" --guest a --guest b &
shim=$!
cleanup() { kill -TERM "$shim" 2>/dev/null; wait "$shim" 2>/dev/null; rm -rf "$run_dir"; }
trap cleanup EXIT
for _ in $(seq 1 100); do [ -e "$run_dir/ready" ] && break; sleep 0.1; done
[ -e "$run_dir/ready" ] || { echo "demo: the shim did not start" >&2; exit 1; }

vr() { "$build/tools/vrdma-run" --run-dir "$run_dir" "$@"; }
echo
echo "=== guest a: vrdma-run --guest a -- ibv_devinfo"
vr --guest a -- ibv_devinfo
echo "=== guest a <-> guest b: ib_write_bw (server in a, client in b)"
vr --guest a -- ib_write_bw -d vrdma0 -p 18999 -s 65536 -n 2000 >/tmp/vrdma-demo-server.log 2>&1 &
server=$!
for _ in $(seq 1 100); do ss -ltnH 'sport = :18999' | grep -q . && break; sleep 0.05; done
vr --guest b -- ib_write_bw -d vrdma0 -p 18999 -s 65536 -n 2000 127.0.0.1
wait "$server"
echo "=== demo done"
