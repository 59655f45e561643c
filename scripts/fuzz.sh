#!/usr/bin/env bash
# The libFuzzer harnesses of the shim (test/fuzz, docs/reliability.md):
# configures BUILD_DIR (default build-fuzz/) with clang and -DVRDMA_FUZZ=ON,
# builds, then for each target runs its seeds (test/fuzz/corpus/<target>/)
# once and fuzzes for FUZZ_SECONDS (default 20) more. As many targets at
# once as there are cores (FUZZ_JOBS=N to choose).
# Exits non-zero when a target crashes, leaks, times out or breaks one of
# the harness's invariants; the input that did it is kept in
# BUILD_DIR/artifacts/<target>/ and its reproduction command printed.
#
#   scripts/fuzz.sh                      the CI smoke: 20 s per target
#   FUZZ_SECONDS=300 scripts/fuzz.sh     the longer run of docs/reliability.md
#   scripts/fuzz.sh wqe rings            only these targets
#
# FUZZ_CORPUS_OUT=DIR keeps each target's grown corpus in DIR/<target>/ (to
# refresh the seeds: minimise it into test/fuzz/corpus/<target>/ with
# -merge=1). The repository's seeds are never modified.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$src/build-fuzz}"
seconds="${FUZZ_SECONDS:-20}"
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(attach commands wqe rings fabric cm)

for t in clang clang++; do
    command -v "$t" >/dev/null || { echo "fuzz.sh: $t not found (scripts/install-deps.sh installs it)" >&2; exit 1; }
done
cmake -S "$src" -B "$build" -DVRDMA_FUZZ=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null

work="$(mktemp -d /tmp/vrdma-fuzz.XXXXXX)"
trap 'rm -rf "$work"' EXIT
# Leaks are crashes; a harness input that runs longer than 10 s is a hang.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
flags=(-timeout=10 -rss_limit_mb=2048 -print_final_stats=1)

# fuzz_one TARGET: its seeds, then FUZZ_SECONDS of fuzzing; the verdict
# line goes to $work/TARGET.summary, the reasons for a failure to
# $work/TARGET.why.
fuzz_one() {
    local t=$1 bin="$build/test/fuzz/fuzz_$1" seeds="$src/test/fuzz/corpus/$1" art="$build/artifacts/$1/"
    local log="$work/$t.log" rc=0 execs
    mkdir -p "$art" "$work/$t"
    if [ ! -d "$seeds" ]; then
        seeds="$work/empty-$t"
        mkdir -p "$seeds"
    fi
    echo "--- fuzz_$t: $(find "$seeds" -type f | wc -l) seeds, then ${seconds} s"
    # The seeds alone first: a regression on a known input is named as such.
    "$bin" "${flags[@]}" -artifact_prefix="$art" -runs=0 "$seeds" >"$log" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ]; then
        "$bin" "${flags[@]}" -artifact_prefix="$art" -max_total_time="$seconds" "$work/$t" "$seeds" >"$log" 2>&1 || rc=$?
    fi
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
    if [ "$rc" -ne 0 ]; then
        printf '%-10s %12s executions  FAILED (exit %d)\n' "$t" "${execs:-?}" "$rc" >"$work/$t.summary"
        {
            echo "fuzz_$t FAILED (exit $rc):"
            grep -E 'ERROR|INVARIANT|runtime error|SUMMARY|Test unit written' "$log" || tail -n 40 "$log"
            echo "reproduce: $bin <the file named above>"
        } >"$work/$t.why"
    else
        printf '%-10s %12s executions  crashes: 0\n' "$t" "$execs" >"$work/$t.summary"
    fi
    if [ -n "${FUZZ_CORPUS_OUT:-}" ]; then
        mkdir -p "$FUZZ_CORPUS_OUT/$t"
        cp -n "$work/$t"/* "$FUZZ_CORPUS_OUT/$t/" 2>/dev/null || true
    fi
}

for t in "${targets[@]}"; do
    [ -x "$build/test/fuzz/fuzz_$t" ] || { echo "fuzz.sh: no target fuzz_$t" >&2; exit 1; }
done
# As many targets at once as there are cores (FUZZ_JOBS): each is one
# single-threaded process, so each still gets its FUZZ_SECONDS of a core.
jobs="${FUZZ_JOBS:-$(nproc)}"
for t in "${targets[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
    fuzz_one "$t" &
done
wait
failed=()
summary=()
for t in "${targets[@]}"; do
    summary+=("$(cat "$work/$t.summary" 2>/dev/null || echo "$t: no verdict (the runner died)")")
    if [ -f "$work/$t.why" ] || [ ! -f "$work/$t.summary" ]; then
        failed+=("$t")
        cat "$work/$t.why" >&2 2>/dev/null || true
    fi
done
echo "--- fuzz summary (${seconds} s per target)"
printf '%s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz.sh: failed: ${failed[*]}" >&2
    exit 1
fi
