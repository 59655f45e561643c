#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds, runs the unit tests
# and the integration tests (real shim, real libibverbs clients, perftest).
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
"$src/scripts/install-deps.sh"
BUILD_DIR="${BUILD_DIR:-$src/build}" "$src/scripts/build.sh"
ctest --test-dir "${BUILD_DIR:-$src/build}" --output-on-failure "$@"
