#!/usr/bin/env bash
# 100 attach/SIGKILL cycles of a real client (scripts/attach-kill-cycles.sh):
# the shim survives, its fds and memory come back to where they started.
# (docs/reliability.md has the figures of 1000.)
set -euo pipefail
exec bash "$(dirname "$0")/../../scripts/attach-kill-cycles.sh" 100
