#!/usr/bin/env bash
# Open MPI with the openib BTL over vrdma, all ranks in one guest: the MPI
# test program with 2 ranks (plain mpirun) and with 4 ranks (vrdma-mpirun,
# the wrapper). Only openib and self are BTLs (no vader), so ranks of one
# guest talk through vrdma0 too; Open MPI's verbose output must show it.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/../mpi/lib.sh"
require_mpi
start_shim a
openib_check a
log="$RUN_DIR.mpi.log"

note "2 ranks in guest a, plain mpirun"
run_mpi 400 "$log" "${MPIRUN_BASE[@]}" "${OPENIB_ONLY[@]}" \
    -np 2 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- "$MPI_TEST"
grep -q "^rank 1 of 2: .*, vrdma guest a\$" "$log" || fail "rank 1 did not run in guest a"
expect_passed "$log" 2
expect_openib_only "$log" 2

note "4 ranks in guest a, vrdma-mpirun"
run_mpi 480 "$log" "$VRDMA_MPIRUN" --run-dir "$RUN_DIR" --guests a -np 4 --verbose -- "$MPI_TEST"
expect_passed "$log" 4
expect_openib_only "$log" 4
rm -f "$log"
echo "mpi_one_guest: ok"
