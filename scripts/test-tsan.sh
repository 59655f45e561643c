#!/usr/bin/env bash
# ThreadSanitizer run (docs/protocol.md "Workers"): builds BUILD_DIR
# (default build-tsan/) with -DVRDMA_TSAN=ON (the shim, the tools and the
# test programs instrumented; the provider stays plain, as in build-asan)
# and runs the unit tests, whose worker tests run two engines on two
# threads, and the suite's two-worker entries (ctest label "workers": the
# real clients between guests on two workers of one instrumented shim).
# A data race or a lock-order inversion the sanitizer sees fails the test
# that saw it (halt_on_error: the shim exits with 66 and stop_shim reports
# it). scripts/test.sh runs this; it also runs alone. Arguments go to
# ctest.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$src/build-tsan}"
BUILD_DIR="$build" "$src/scripts/build.sh" -DVRDMA_TSAN=ON
# second_deadlock_stack: both stacks of a lock-order report.
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1:exitcode=66:second_deadlock_stack=1}"
# The MPI ranks are Debian's uninstrumented binaries and the perftest
# clients run for minutes under an instrumented shim: the plain and ASan
# builds run those entries.
ctest --test-dir "$build" --output-on-failure \
    -R '^(unit|integration\.workers\..*)$' -E '^integration\.workers\.(mpi_two_guests|perftest|events_perftest)$' "$@"
