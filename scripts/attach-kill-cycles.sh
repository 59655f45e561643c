#!/usr/bin/env bash
# attach-kill-cycles.sh [N]: N times (default 1000), a real client
# (ibv_rc_pingpong's server: opens vrdma0, attaches, registers memory,
# creates a CQ and a QP, then waits on TCP) is started in a guest of a
# private shim and killed with SIGKILL: every other cycle once it is fully
# set up, otherwise after a random 0-150 ms (before, during or after its
# attach). Prints the shim's VmRSS and fd count before and after (and after
# a 10-cycle warm-up), then checks a checked pingpong still passes. Exits
# non-zero if the shim died, holds more fds than before, or (unsanitized
# builds) its VmRSS grew by more than RSS_SLACK_KB (default 4096) over the
# warm-up figure.
#   VRDMA_BUILD_DIR (default build/) names the build to use.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
export VRDMA_BUILD_DIR="${VRDMA_BUILD_DIR:-$src/build}"
n="${1:-1000}"
source "$src/test/integration/lib.sh"
start_shim a b

shim_fds() { ls "/proc/$SHIM_PID/fd" | wc -l; }
shim_rss() { awk '/^VmRSS:/ {print $2}' "/proc/$SHIM_PID/status"; }
settle() {  # the last detach reaches the shim shortly after the kill
    for _ in $(seq 1 50); do
        [ "$(shim_fds)" -le "$1" ] && return 0
        sleep 0.02
    done
}
sanitized=0
grep -q '^VRDMA_SANITIZE:BOOL=ON' "$VRDMA_BUILD_DIR/CMakeCache.txt" 2>/dev/null && sanitized=1

port=$((21000 + RANDOM % 2000))
cycle() {
    local i="$1"
    "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- ibv_rc_pingpong -d vrdma0 -g 0 -p "$port" >/dev/null 2>&1 &
    local pid=$!
    if [ $((i % 2)) -eq 0 ]; then
        # Fully set up: it listens once its device, MR, CQ and QP exist.
        for _ in $(seq 1 400); do
            ss -ltnH "sport = :$port" | grep -q . && break
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.01
        done
    else
        sleep "0.$(printf '%03d' $((RANDOM % 150)))"
    fi
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

fds_start="$(shim_fds)"
rss_start="$(shim_rss)"
for i in $(seq 1 10); do cycle "$i"; done
settle "$fds_start"
fds_warm="$(shim_fds)"
rss_warm="$(shim_rss)"
t0=$(date +%s)
for i in $(seq 1 "$n"); do
    cycle "$i"
    kill -0 "$SHIM_PID" 2>/dev/null || fail "the shim died at cycle $i"
    [ $((i % 100)) -eq 0 ] && echo "  cycle $i: shim fds $(shim_fds), VmRSS $(shim_rss) kB"
done
settle "$fds_start"
fds_end="$(shim_fds)"
rss_end="$(shim_rss)"
attached="$(grep -c ' attached (context' "$SHIM_LOG" || true)"
echo "attach/kill cycles: $n (+10 warm-up) in $(( $(date +%s) - t0 )) s, $attached attaches logged"
echo "shim fds:   start $fds_start, after warm-up $fds_warm, after $n cycles $fds_end"
echo "shim VmRSS: start $rss_start kB, after warm-up $rss_warm kB, after $n cycles $rss_end kB"
[ "$fds_end" -le "$fds_start" ] || fail "the shim holds $fds_end fds, $fds_start at start: leak"
if [ "$sanitized" -eq 0 ]; then
    [ "$rss_end" -le $((rss_warm + ${RSS_SLACK_KB:-4096})) ] ||
        fail "the shim's VmRSS grew by $((rss_end - rss_warm)) kB over $n cycles"
else
    echo "(VmRSS not compared: ASan keeps freed memory in quarantine)"
fi
client_server 60 $((port + 1)) "ibv_rc_pingpong -d vrdma0 -g 0 -c -p $((port + 1)) -n 100" \
    "ibv_rc_pingpong -d vrdma0 -g 0 -c -p $((port + 1)) -n 100 127.0.0.1" >/dev/null
echo "attach-kill-cycles: ok"
