#!/usr/bin/env bash
# The fabric with several workers (separate from the tests): two simulated
# hosts as in the two-hosts integration tests (test/integration/lib.sh), each
# shim serving two guests (a0 a1 on host 1, b0 b1 on host 2), measured in one
# run with the shims at --workers 1 and then at --workers N:
#   one pair     ib_write_bw 64 KiB, a0 -> b0 (worker 0 of each side)
#   two pairs    the same, a0 -> b0 and a1 -> b1 at once (with N workers,
#                a1 and b1 are on worker 1: each pair has its own workers
#                and its own connection), the sum of the two
# beside iperf3 with one and with two TCP streams between the namespaces.
# Prints the medians of ROUNDS rounds and the ratio the issue asks for: two
# pairs on N workers against one pair on one worker (target >= 1).
# Needs root (network namespaces) and iperf3.
#
# Environment: BUILD_DIR (default build), WORKERS (2), ROUNDS (3), ITERS
# (20000 writes of 64 KiB per pair), IPERF_SECONDS (3).
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$src/build}"
[ -x "$build/src/shim/vrdma-shim" ] || BUILD_DIR="$build" "$src/scripts/build.sh"
[ "$(id -u)" -eq 0 ] || { echo "bench-fabric-workers: needs root (network namespaces)" >&2; exit 3; }
command -v iperf3 >/dev/null || { echo "bench-fabric-workers: no iperf3 (scripts/install-deps.sh)" >&2; exit 3; }
WORKERS="${WORKERS:-2}"
ROUNDS="${ROUNDS:-3}"
ITERS="${ITERS:-20000}"
IPERF_SECONDS="${IPERF_SECONDS:-3}"

export VRDMA_BUILD_DIR="$build" VRDMA_TOPOLOGY=two-hosts
# shellcheck source=../test/integration/lib.sh
source "$src/test/integration/lib.sh"   # its EXIT trap removes everything
# shellcheck source=lib/bench.sh
source "$src/scripts/lib/bench.sh"

fabric_init
fabric_host 1 "a0 a1" 1
fabric_host 2 "b0 b1" 10
fabric_link 1 2
fabric_peer 1 2
fabric_peer 2 1
run_dir="$RUN_DIR"

# shims W: both shims (re)started with --workers W; waits for the W x W
# links of each side.
shims() {
    local w="$1" h
    for h in 1 2; do
        [ -z "${HOST_PID[$h]}" ] || fabric_kill "$h" TERM
        HOST_ARGS[$h]="--workers $w"
        fabric_shim_start "$h"
    done
    local deadline=$(( $(date +%s) + 30 ))
    for h in 1 2; do
        until [ "$(host_ctl "$h" peers | grep -c ' state up ' || true)" -ge $(( w * w )) ]; do
            [ "$(date +%s)" -lt "$deadline" ] || fail "host $h: not $(( w * w )) links up after 30 s"
            sleep 0.1
        done
    done
}

# iperf P: iperf3 with P streams, host 2 -> host 1 (MiB/s received).
iperf() {
    ip netns exec "${HOST_NS[1]}" iperf3 -s -1 -B "${HOST_ADDR[1]}" -p 5201 >/dev/null 2>&1 &
    local server=$!
    for _ in $(seq 1 200); do
        ip netns exec "${HOST_NS[1]}" ss -ltnH "sport = :5201" | grep -q . && break
        sleep 0.05
    done
    ip netns exec "${HOST_NS[2]}" iperf3 -c "${HOST_ADDR[1]}" -p 5201 -P "$1" -t "$IPERF_SECONDS" -J \
        >"$RUN_DIR.iperf.json"
    wait "$server" || true
    python3 -c 'import json,sys; print("%.1f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 8 / 1048576))' \
        "$RUN_DIR.iperf.json"
}

one_pair() { perftest a0 b0 ib_write_bw -s 65536 -n "$ITERS" | awk '{print $4}'; }
two_pairs() {
    port=24100
    perftest a0 b0 ib_write_bw -s 65536 -n "$ITERS" >"$RUN_DIR.p0" &
    local p0=$!
    port=24200
    perftest a1 b1 ib_write_bw -s 65536 -n "$ITERS" >"$RUN_DIR.p1" &
    local p1=$!
    wait "$p0" && wait "$p1" || fail "a pair's ib_write_bw failed"
    awk '{ s += $4 } END { printf "%.1f", s }' "$RUN_DIR.p0" "$RUN_DIR.p1"
}

declare -A one=() two=()
ip1=() ip2=()
echo "measuring ($ROUNDS rounds; --workers 1, then --workers $WORKERS)..." >&2
for w in 1 "$WORKERS"; do
    shims "$w"
    o=() t=()
    for r in $(seq 1 "$ROUNDS"); do
        port=23515
        ip1+=("$(iperf 1)")
        o+=("$(one_pair)")
        ip2+=("$(iperf 2)")
        t+=("$(two_pairs)")
        echo "  --workers $w round $r: one pair ${o[-1]} MB/s, two pairs ${t[-1]} MB/s;" \
            "iperf3 ${ip1[-1]} and ${ip2[-1]} MiB/s (1 and 2 streams)" >&2
    done
    one[$w]="$(median "${o[@]}")"
    two[$w]="$(median "${t[@]}")"
done
r="$(ratio "${two[$WORKERS]}" "${one[1]}")"

cat <<TABLE

| across the fabric, ib_write_bw 64 KiB (MB/s, median of $ROUNDS) | --workers 1 | --workers $WORKERS |
| --- | ---: | ---: |
| one pair (a0 -> b0) | ${one[1]} | ${one[$WORKERS]} |
| two pairs at once (a0 -> b0, a1 -> b1), together | ${two[1]} | ${two[$WORKERS]} |
| two pairs against one pair on one worker | $(ratio "${two[1]}" "${one[1]}") | $r |

iperf3 between the namespaces (MiB/s, median): one stream $(median "${ip1[@]}"), two streams $(median "${ip2[@]}").
Target (issue: two pairs on their own workers at least one pair on one worker): $r, $(awk -v r="$r" 'BEGIN { print (r >= 1 ? "met" : "MISSED") }').
Machine: $(nproc) cores, $(uname -r). perftest's MB is 2^20 bytes.
TABLE
