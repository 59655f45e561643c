# Helpers for the MPI integration tests (test/integration/mpi*.sh); sourced
# after test/integration/lib.sh. Not a test itself (it lives outside the
# integration directory's glob).

MPI_TEST="$VRDMA_BUILD_DIR/test/mpi/vrdma-mpi-test"
OPENIB_CHECK="$VRDMA_BUILD_DIR/test/mpi/vrdma-openib-check"
VRDMA_MPIRUN="$VRDMA_BUILD_DIR/tools/vrdma-mpirun"
MPIRUN="mpirun"
[ -s "$VRDMA_BUILD_DIR/test/mpi/mpiexec.path" ] && MPIRUN="$(head -n1 "$VRDMA_BUILD_DIR/test/mpi/mpiexec.path")"

# What every run uses: ob1 over openib and self only (no tcp, no vader),
# one-sided through Open MPI's default component for openib, osc rdma (its
# windows of ranks on one host are a /dev/shm file, which vrdma registers
# like any shared memory: docs/protocol.md "Guest memory"), openib allowed on
# an InfiniBand port, and verbose enough that Open MPI names the BTL it uses
# to each peer (OSC_VERBOSE adds the osc component of each window).
# (mpirun refuses an MCA parameter given twice: OPENIB_ONLY_BASE lacks
# btl_openib_allow_ib for tests that set it otherwise.)
OPENIB_ONLY_BASE=(--mca pml ob1 --mca btl openib,self
    --mca btl_openib_warn_no_device_params_found 0 --mca btl_base_verbose 100)
OSC_VERBOSE=(--mca osc_base_verbose 100)
OPENIB_ONLY=("${OPENIB_ONLY_BASE[@]}" --mca btl_openib_allow_ib 1)
# Plain mpirun gets the ranks' zeroed malloc that vrdma-mpirun adds: Open
# MPI 4.1.4's openib reads a counter it never initialized, and a nonzero
# heap byte there makes MPI_Finalize crash (docs/mpi.md "Known quirks").
ZEROED_MALLOC=(-x GLIBC_TUNABLES=glibc.malloc.tcache_count=0:glibc.malloc.perturb=255)
MPIRUN_BASE=("$MPIRUN" "${ZEROED_MALLOC[@]}")
[ "$(id -u)" -eq 0 ] && MPIRUN_BASE+=(--allow-run-as-root)

require_mpi() {
    command -v "$MPIRUN" >/dev/null ||
        fail "$MPIRUN not found: install Open MPI (apt-get install openmpi-bin libopenmpi-dev, or scripts/install-deps.sh)"
    [ -x "$MPI_TEST" ] ||
        fail "$MPI_TEST was not built: install libopenmpi-dev (scripts/install-deps.sh) and run cmake again"
    [ -x "$OPENIB_CHECK" ] || fail "$OPENIB_CHECK was not built"
}

# oversubscribe NP: --oversubscribe when NP ranks exceed the cores.
oversubscribe() { [ "$1" -gt "$(nproc)" ] && echo --oversubscribe; true; }

# openib_check GUEST: openib's own use of the device, step by step; fails
# the test with the step that does not work.
openib_check() {
    local out
    out="$(in_guest "$1" "$OPENIB_CHECK" 2>&1)" || {
        echo "$out" | sed 's/^/  check| /'
        fail "guest $1: vrdma0 cannot carry the openib BTL (vrdma-openib-check above)"
    }
}

# expect_openib_only LOG NP: Open MPI's own words (btl_base_verbose) say
# that every rank sent to every other rank with openib and to itself with
# self, and that no other BTL was chosen for anything.
expect_openib_only() {
    local log="$1" np="$2"
    local want=$((np * (np - 1)))
    local got_openib got_self others
    got_openib="$(grep -c 'mca: bml: Using openib btl for send to' "$log" || true)"
    got_self="$(grep -c 'mca: bml: Using self btl for send to' "$log" || true)"
    others="$(grep 'mca: bml: Using .* btl for send to' "$log" | grep -v 'Using openib btl\|Using self btl' || true)"
    [ -z "$others" ] || fail "a BTL other than openib and self carried traffic: $others"
    [ "$got_openib" -eq "$want" ] ||
        fail "openib was chosen for $got_openib rank pairs, expected $want (every ordered pair of $np ranks)"
    [ "$got_self" -eq "$np" ] || fail "self was chosen $got_self times, expected $np"
    grep -q 'select: init of component openib returned success' "$log" ||
        fail "openib did not report a successful init"
    note "Open MPI used openib for all $want ordered rank pairs (self only for a rank's messages to itself)"
}

# expect_osc_rdma LOG: Open MPI's own words (osc_base_verbose) say that the
# one-sided windows were osc rdma's, no other component's.
expect_osc_rdma() {
    grep -q 'rdma component destroying window' "$1" || fail "osc rdma did not carry the one-sided windows"
    if grep -E '(sm|pt2pt|ucx) component (creating|destroying) window' "$1" >/dev/null; then
        fail "an osc component other than rdma carried a window"
    fi
    note "one-sided windows: osc rdma (Open MPI's default; no --mca osc)"
}

# expect_passed LOG NP: the test program's own verdict.
expect_passed() {
    grep -q "vrdma-mpi-test: all checks passed, $2 ranks" "$1" || fail "vrdma-mpi-test did not pass with $2 ranks"
    grep '^ok  ' "$1" | sed 's/^/  /'
}

# run_mpi LIMIT LOG CMD...: runs CMD, output to LOG and (filtered) stdout;
# fails the test if CMD fails.
run_mpi() {
    local limit="$1" log="$2"
    shift 2
    echo "\$ $*"
    local rc=0
    timeout "$limit" "$@" >"$log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        grep -v 'mca: base: \|mca: bml: \|select: ' "$log" | tail -n 60 | sed 's/^/  | /'
        [ "$rc" -eq 124 ] && fail "timed out after $limit s"
        fail "exited with $rc"
    fi
}
