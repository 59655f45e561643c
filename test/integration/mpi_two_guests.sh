#!/usr/bin/env bash
# Open MPI with the openib BTL over vrdma, ranks split across two guests:
# the MPI test program (test/mpi/vrdma_mpi_test.c: point-to-point 0 B to
# 16 MiB, collectives, one-sided) with 2 ranks (plain mpirun, MPMD, one
# rank per guest) and with 4 ranks (plain mpirun, vrdma-run
# --guest-by-rank a,b). Only openib and self are BTLs; Open MPI's verbose
# output must show openib for every pair of ranks and osc rdma, its default
# one-sided component, for the windows (no --mca osc).
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/../mpi/lib.sh"
require_mpi
start_shim a b
openib_check a
openib_check b
log="$RUN_DIR.mpi.log"

# expect_guests LOG R:GUEST...: rank R ran in GUEST.
expect_guests() {
    local log="$1"
    shift
    for rg in "$@"; do
        grep -q "^rank ${rg%%:*} of .*, vrdma guest ${rg#*:}\$" "$log" || fail "rank ${rg%%:*} did not run in guest ${rg#*:}"
    done
}

note "2 ranks, plain mpirun (MPMD): rank 0 in guest a, rank 1 in guest b"
run_mpi 400 "$log" "${MPIRUN_BASE[@]}" "${OPENIB_ONLY[@]}" "${OSC_VERBOSE[@]}" \
    -np 1 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- "$MPI_TEST" : \
    -np 1 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- "$MPI_TEST"
expect_guests "$log" 0:a 1:b
expect_passed "$log" 2
expect_openib_only "$log" 2
expect_osc_rdma "$log"

note "4 ranks, plain mpirun, vrdma-run --guest-by-rank a,b: ranks 0 and 2 in guest a, 1 and 3 in guest b"
# shellcheck disable=SC2046
run_mpi 480 "$log" "${MPIRUN_BASE[@]}" $(oversubscribe 4) "${OPENIB_ONLY[@]}" "${OSC_VERBOSE[@]}" \
    -np 4 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest-by-rank a,b -- "$MPI_TEST"
expect_guests "$log" 0:a 1:b 2:a 3:b
expect_passed "$log" 4
expect_openib_only "$log" 4
expect_osc_rdma "$log"
rm -f "$log"
echo "mpi_two_guests: ok"
