#!/usr/bin/env bash
# Configures and builds vrdma into BUILD_DIR (default: build/ in the source
# tree). Extra arguments go to cmake's configure step.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$src/build}"
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build "$build" -j"$(nproc)"
