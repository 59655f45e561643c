#!/usr/bin/env bash
# The whole test suite (CI runs it, .ci/run):
#   1. installs what is missing and, as root, reserves 16 huge pages of
#      2 MiB and mounts a hugetlbfs for the suite's hugetlb cases (both
#      undone at the end: scripts/lib/huge_pages.sh);
#   2. builds build/ and runs its ctest: unit tests and integration tests
#      (real shim, real libibverbs clients, perftest, Open MPI);
#   3. builds build-asan/ with -DVRDMA_SANITIZE=ON (ASan and UBSan in the
#      shim, the tools and every test program; the provider stays plain)
#      and runs the same ctest there;
#   4. builds build-tsan/ with -DVRDMA_TSAN=ON and runs the unit tests and
#      the integration suite there but MPI and perftest (scripts/test-tsan.sh);
#   5. runs scripts/fuzz.sh's bounded smoke (seeds, then 20 s per target);
#   6. runs scripts/test-hca.sh (below);
#   7. runs scripts/test-vm.sh (VM guests: QEMU VMs served by the shim).
# Arguments go to the ctest of step 2 only. VRDMA_SKIP_ASAN=1,
# VRDMA_SKIP_TSAN=1, VRDMA_SKIP_FUZZ=1, VRDMA_SKIP_HCA=1 and
# VRDMA_SKIP_VM=1 leave out steps 3, 4, 5, 6 and 7 (local runs; CI runs
# all).
# A failing test step does not stop the later ones; the summary names it and
# the exit status is non-zero. A failing build stops at once.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$src/build}"
asan_build="${ASAN_BUILD_DIR:-$src/build-asan}"
t_start=$(date +%s)
times=()
section() { echo; echo "======== vrdma test: $* ========"; t_section=$(date +%s); }
failed=()
done_section() {  # NAME [STATUS]
    local verdict=ok
    if [ "${2:-0}" -ne 0 ]; then verdict="FAILED"; failed+=("$1"); fi
    times+=("$(printf '%-28s %5d s  %s' "$1" $(( $(date +%s) - t_section )) "$verdict")")
}

section "dependencies"
"$src/scripts/install-deps.sh"
# shellcheck source=lib/huge_pages.sh
source "$src/scripts/lib/huge_pages.sh"
reserve_huge_pages 16
trap release_huge_pages EXIT
done_section "dependencies"

section "build ($build)"
BUILD_DIR="$build" "$src/scripts/build.sh"
done_section "build"
section "ctest ($build)"
rc=0
ctest --test-dir "$build" --output-on-failure "$@" || rc=$?
done_section "ctest" "$rc"

if [ "${VRDMA_SKIP_ASAN:-0}" != 1 ]; then
    section "build with ASan+UBSan ($asan_build)"
    BUILD_DIR="$asan_build" "$src/scripts/build.sh" -DVRDMA_SANITIZE=ON
    done_section "build (ASan+UBSan)"
    section "ctest with ASan+UBSan ($asan_build)"
    # verify_asan_link_order=0: vrdma-run preloads the plain provider into
    # instrumented test programs (vrdma-verbs-tests), ahead of libasan.
    # Leaks are errors in the shim and the tools.
    export ASAN_OPTIONS="${ASAN_OPTIONS:-verify_asan_link_order=0:detect_leaks=1:abort_on_error=0:halt_on_error=1}"
    export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
    # Excluded under the sanitizers (the plain build runs them):
    #  - integration.mpi_*: mpirun, orted and the MPI ranks are Debian's
    #    uninstrumented binaries; only vrdma-run and the shim would be
    #    instrumented, which the other integration tests already cover, and
    #    they cost 50 s.
    #  - integration.{fabric,workers}.{perftest,events_perftest,mpi_two_guests}:
    #    the same clients across the two-hosts fabric (about 4.5 min plain)
    #    and between two workers; the fabric's and the worker links' code
    #    under the sanitizers is covered by the other integration.fabric.*
    #    and integration.workers.* entries, which stay.
    rc=0
    ctest --test-dir "$asan_build" --output-on-failure \
        -E '^integration\.(mpi_|(fabric|workers)\.(perftest|events_perftest|mpi_two_guests)$)' || rc=$?
    unset ASAN_OPTIONS UBSAN_OPTIONS
    done_section "ctest (ASan+UBSan)" "$rc"
fi

if [ "${VRDMA_SKIP_TSAN:-0}" != 1 ]; then
    section "ThreadSanitizer: build-tsan, unit and integration tests (scripts/test-tsan.sh)"
    rc=0
    BUILD_DIR="${TSAN_BUILD_DIR:-$src/build-tsan}" "$src/scripts/test-tsan.sh" || rc=$?
    done_section "ThreadSanitizer" "$rc"
fi

if [ "${VRDMA_SKIP_FUZZ:-0}" != 1 ]; then
    section "fuzz smoke (scripts/fuzz.sh, ${FUZZ_SECONDS:-20} s per target)"
    rc=0
    "$src/scripts/fuzz.sh" || rc=$?
    done_section "fuzz smoke" "$rc"
fi

if [ "${VRDMA_SKIP_HCA:-0}" != 1 ]; then
    section "HCA transport on Soft-RoCE in two VMs (scripts/test-hca.sh)"
    rc=0
    VRDMA_BUILD_DIR="$build" "$src/scripts/test-hca.sh" || rc=$?
    done_section "test-hca" "$rc"
fi

if [ "${VRDMA_SKIP_VM:-0}" != 1 ]; then
    section "VM guests: QEMU VMs served by the shim (scripts/test-vm.sh)"
    rc=0
    VRDMA_BUILD_DIR="$build" "$src/scripts/test-vm.sh" || rc=$?
    done_section "test-vm" "$rc"
fi

section "summary"
printf '%s\n' "${times[@]}"
echo "total: $(( $(date +%s) - t_start )) s"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "vrdma test: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "vrdma test: all passed"
