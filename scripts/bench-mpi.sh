#!/usr/bin/env bash
# The MPI benchmark (separate from the tests). Builds if needed, starts a
# shim with guests a and b, and measures in one run, on this machine, MPI
# ping-pong (test/mpi/mpi_pingpong.c: half round-trip latency, and size
# divided by it as bandwidth) from 8 B to 4 MiB between two ranks with
# pml ob1 over:
#   openib   the openib BTL on vrdma0, rank 0 in guest a, rank 1 in guest b
#   tcp      btl tcp over loopback (the baseline vrdma must beat)
#   vader    btl vader, shared memory (the bound for one host)
# and prints a markdown table with the ratios (the table in
# docs/performance.md comes from here). Targets: openib bandwidth at least
# 2x tcp's from 64 KiB up, openib latency below tcp's at every size.
#
# Environment: BUILD_DIR (default build), BUDGET seconds per size and
# transport (default 0.25), MAX_SIZE (default 4194304), BIND (mpirun
# --bind-to value, default none).
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$src/build}"
[ -x "$build/src/shim/vrdma-shim" ] && [ -x "$build/test/mpi/vrdma-mpi-pingpong" ] ||
    BUILD_DIR="$build" "$src/scripts/build.sh"
pingpong="$build/test/mpi/vrdma-mpi-pingpong"
[ -x "$pingpong" ] || { echo "bench-mpi: $pingpong not built (install openmpi-bin libopenmpi-dev, reconfigure)" >&2; exit 3; }
BUDGET="${BUDGET:-0.25}"
MAX_SIZE="${MAX_SIZE:-4194304}"
BIND="${BIND:-none}"

run_dir="$(mktemp -d /tmp/vrdma-bench-mpi.XXXXXX)"
# One worker, whatever the CPUs: the figures are those of two guests of
# one worker (scripts/bench-scale.sh measures two workers).
"$build/src/shim/vrdma-shim" --run-dir "$run_dir" --workers 1 --guest a --guest b >"$run_dir.log" 2>&1 &
shim=$!
cleanup() {
    kill -TERM "$shim" 2>/dev/null || true
    wait "$shim" 2>/dev/null || true
    rm -rf "$run_dir" "$run_dir.log" "$run_dir".out.*
}
trap cleanup EXIT
for _ in $(seq 1 100); do [ -e "$run_dir/ready" ] && break; sleep 0.1; done
[ -e "$run_dir/ready" ] || { cat "$run_dir.log" >&2; echo "bench-mpi: shim not ready" >&2; exit 1; }

# Every run yields the CPU when idle, as vrdma's pollers do: on 2 cores the
# two ranks, the shim and mpirun's helpers share the CPUs, and a rank that
# spins without yielding measures the scheduler, not the transport.
mpirun=(mpirun -np 2 --bind-to "$BIND" --mca mpi_yield_when_idle 1)
[ "$(id -u)" -eq 0 ] && mpirun+=(--allow-run-as-root)
args=(--max "$MAX_SIZE" --budget "$BUDGET")

# measure NAME MPIRUN-ARGS... -- LAUNCHER...: prints "size lat bw" lines
# into $run_dir.out.NAME.
measure() {
    local name="$1"
    shift
    local opts=()
    while [ "$1" != "--" ]; do opts+=("$1"); shift; done
    shift
    echo "measuring $name..." >&2
    if ! "${mpirun[@]}" "${opts[@]}" "$@" "$pingpong" "${args[@]}" >"$run_dir.out.$name" 2>"$run_dir.out.$name.err"; then
        cat "$run_dir.out.$name.err" >&2
        echo "bench-mpi: the $name run failed" >&2
        exit 1
    fi
    grep -v '^#' "$run_dir.out.$name" | awk 'NF == 3' >"$run_dir.out.$name.data"
}

measure openib --mca pml ob1 --mca btl openib,self --mca btl_openib_allow_ib 1 \
    --mca btl_openib_warn_no_device_params_found 0 -- \
    "$build/tools/vrdma-run" --run-dir "$run_dir" --guest-by-rank a,b --
measure tcp --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo --
measure vader --mca pml ob1 --mca btl vader,self --

join_all() {
    join "$run_dir.out.openib.data" "$run_dir.out.tcp.data" | join - "$run_dir.out.vader.data"
}

echo "| size | openib/vrdma latency (us) | tcp latency (us) | vader latency (us) | openib/vrdma bandwidth (MB/s) | tcp bandwidth (MB/s) | vader bandwidth (MB/s) | bandwidth openib/tcp | latency tcp/openib |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
join_all | awk '
function human(n) {
    if (n >= 1048576) return (n / 1048576) " MiB"
    if (n >= 1024) return (n / 1024) " KiB"
    return n " B"
}
{
    # size, openib lat bw, tcp lat bw, vader lat bw
    size = $1; olat = $2; obw = $3; tlat = $4; tbw = $5; vlat = $6; vbw = $7
    printf "| %s | %.2f | %.2f | %.2f | %.0f | %.0f | %.0f | %.2f | %.2f |\n", human(size), olat, tlat, vlat, obw, tbw, vbw, obw / tbw, tlat / olat
    if (size >= 65536 && obw < 2 * tbw) bw_miss = bw_miss " " human(size)
    if (olat >= tlat) lat_miss = lat_miss " " human(size)
}
END {
    print ""
    if (bw_miss == "") print "Bandwidth target (openib >= 2x tcp from 64 KiB): met."
    else print "Bandwidth target (openib >= 2x tcp from 64 KiB): MISSED at" bw_miss "."
    if (lat_miss == "") print "Latency target (openib below tcp at every size): met."
    else print "Latency target (openib below tcp at every size): MISSED at" lat_miss "."
}'
echo
echo "Two ranks, pml ob1, mpirun --bind-to $BIND; openib ranks in guests a and b of one shim. Machine: $(nproc) cores, $(uname -r), Open MPI $(ompi_info --version 2>/dev/null | awk 'NR==1{print $NF}')."
