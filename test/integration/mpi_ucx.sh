#!/usr/bin/env bash
# Open MPI over UCX on vrdma (issue 10): the MPI test program
# (test/mpi/vrdma_mpi_test.c: point-to-point, collectives, one-sided) with
# 2 ranks, one per guest, under pml ucx and osc ucx, with UCX limited to the
# verbs transports on vrdma0 (UCX_NET_DEVICES=vrdma0:1,
# UCX_TLS=rc_verbs,ud_verbs,self: no shared memory, no TCP), so every byte
# between the ranks crosses vrdma. UCX registers the program's static
# arrays and osc ucx its windows, which vrdma once refused.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/../mpi/lib.sh"
require_mpi
ompi_info 2>/dev/null | grep -q 'MCA pml: ucx' || fail "Open MPI has no pml ucx (Debian's openmpi-bin has it)"
start_shim a b
log="$RUN_DIR.mpi.log"

note "2 ranks, pml ucx + osc ucx, UCX_TLS=rc_verbs,ud_verbs,self on vrdma0:1: rank 0 in guest a, rank 1 in guest b"
run_mpi 400 "$log" "${MPIRUN_BASE[@]}" --mca pml ucx --mca osc ucx --mca btl self \
    -x UCX_NET_DEVICES=vrdma0:1 -x UCX_TLS=rc_verbs,ud_verbs,self \
    -np 1 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- "$MPI_TEST" : \
    -np 1 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- "$MPI_TEST"
expect_passed "$log" 2
# Both ranks opened vrdma0. With pml ucx forced and UCX_TLS holding no
# shared-memory or TCP transport, UCX had no other way between the ranks:
# had it failed on vrdma0, MPI_Init would have aborted.
for g in a b; do
    grep -Eq "guest $g: pid [0-9]+ attached" "$SHIM_LOG" || fail "no rank opened vrdma0 in guest $g"
done
note "both ranks ran over vrdma0 (the only transport UCX was given)"
rm -f "$log"
echo "mpi_ucx: ok"
