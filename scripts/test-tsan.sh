#!/usr/bin/env bash
# ThreadSanitizer run (docs/protocol.md "Workers"): builds BUILD_DIR
# (default build-tsan/) with -DVRDMA_TSAN=ON (the shim, the tools and the
# test programs instrumented; the provider stays plain, as in build-asan)
# and runs the unit tests, whose worker tests run two engines on two
# threads, and the integration suite against the instrumented shim: one
# worker and the control thread, the fabric's shims, and the two-worker
# entries (ctest label "workers"). Left out, as under ASan: the MPI tests
# (Debian's uninstrumented ranks; the shim's part is covered by the
# others) and the perftest entries (minutes of clients against an
# instrumented shim). A data race or a lock-order inversion the sanitizer
# sees fails the test that saw it (halt_on_error: the shim exits with 66
# and stop_shim reports it). scripts/test.sh runs this; it also runs
# alone. Arguments go to ctest.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$src/build-tsan}"
BUILD_DIR="$build" "$src/scripts/build.sh" -DVRDMA_TSAN=ON
# second_deadlock_stack: both stacks of a lock-order report.
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:exitcode=66:second_deadlock_stack=1}"
ctest --test-dir "$build" --output-on-failure \
    -E '^integration\.(mpi_|((fabric|workers)\.)?(perftest|events_perftest|mpi_two_guests)$)' "$@"
