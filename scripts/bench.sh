#!/usr/bin/env bash
# The benchmark command (separate from the tests). Builds if needed, starts a
# shim with guests a and b, and measures in one run:
#   ib_write_bw at 64 KiB      beside a single-thread memcpy of 64 KiB
#   ib_send_lat at 8 B         beside a cross-process shared-memory ping-pong,
#                              a three-process shared-memory relay (the shape
#                              of sender -> shim -> receiver) and a TCP
#                              loopback ping-pong
#   ib_send_lat -e at 8 B      event mode (completion channels: the tools
#                              sleep in ibv_get_cq_event) beside polling mode
#   RC ping-pong beside idle   vrdma-idle-qps: 8-byte RC ping-pong between
#   QPs                        guests a and b with 0, 1000 and 4000 idle
#                              connected QPs in one context (the cost of
#                              finding work must not grow with them)
# and prints a markdown table with the ratios (the table in
# docs/performance.md comes from here).
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$src/build}"
[ -x "$build/src/shim/vrdma-shim" ] || BUILD_DIR="$build" "$src/scripts/build.sh"
ITERS_BW="${ITERS_BW:-5000}"
ITERS_LAT="${ITERS_LAT:-20000}"

run_dir="$(mktemp -d /tmp/vrdma-bench.XXXXXX)"
"$build/src/shim/vrdma-shim" --run-dir "$run_dir" --guest a --guest b >"$run_dir.log" 2>&1 &
shim=$!
cleanup() { kill -TERM "$shim" 2>/dev/null; wait "$shim" 2>/dev/null; rm -rf "$run_dir" "$run_dir.log"; }
trap cleanup EXIT
for _ in $(seq 1 100); do [ -e "$run_dir/ready" ] && break; sleep 0.1; done

port=20515
# perftest TOOL ARGS...: server in guest a, client in guest b; prints the
# client's result line for the size measured.
perftest() {
    local tool="$1"
    shift
    port=$((port + 1))
    "$build/tools/vrdma-run" --run-dir "$run_dir" --guest a -- "$tool" -d vrdma0 -p $port "$@" >/dev/null 2>&1 &
    local server=$!
    for _ in $(seq 1 200); do ss -ltnH "sport = :$port" | grep -q . && break; sleep 0.05; done
    "$build/tools/vrdma-run" --run-dir "$run_dir" --guest b -- "$tool" -d vrdma0 -p $port "$@" 127.0.0.1 |
        awk '$1 ~ /^[0-9]+$/ && NF >= 5 { print; exit }'
    wait "$server"
}

echo "measuring (this takes about a minute)..." >&2
bw_line="$(perftest ib_write_bw -s 65536 -n "$ITERS_BW")"
lat_line="$(perftest ib_send_lat -s 8 -n "$ITERS_LAT")"
ev_lat_line="$(perftest ib_send_lat -e -s 8 -n "$ITERS_LAT")"
base="$build/tools/vrdma-baselines"
memcpy_bw="$("$base" memcpy 65536 | awk '{print $3}')"
shm_pp="$("$base" shm-pingpong | awk '{print $3}')"
shm_relay="$("$base" shm-relay | awk '{print $3}')"
tcp_pp="$("$base" tcp-pingpong | awk '{print $3}')"
idle_lines="$("$build/tools/vrdma-run" --run-dir "$run_dir" --guest a --guest b -- "$build/tools/vrdma-idle-qps" 0 1000 4000)"
idle() { awk -v n="$1" '$2 == n { print $3 }' <<<"$idle_lines"; }

write_bw="$(echo "$bw_line" | awk '{print $4}')"      # BW average [MB/sec]
send_lat="$(echo "$lat_line" | awk '{print $5}')"     # t_typical [usec]
send_lat_avg="$(echo "$lat_line" | awk '{print $6}')" # t_avg [usec]
ev_lat="$(echo "$ev_lat_line" | awk '{print $5}')"
ev_lat_avg="$(echo "$ev_lat_line" | awk '{print $6}')"
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

cat <<TABLE
| measurement | value | baseline | baseline value | ratio |
| --- | --- | --- | --- | --- |
| ib_write_bw 64 KiB (MB/s, average) | $write_bw | memcpy 64 KiB, one thread (MiB/s) | $memcpy_bw | $(ratio "$write_bw" "$memcpy_bw") of memcpy |
| ib_send_lat 8 B (us, typical) | $send_lat | shared-memory ping-pong, 2 processes (us) | $shm_pp | $(ratio "$send_lat" "$shm_pp") x |
| ib_send_lat 8 B (us, typical) | $send_lat | shared-memory relay, 3 processes (us) | $shm_relay | $(ratio "$send_lat" "$shm_relay") x |
| ib_send_lat 8 B (us, typical) | $send_lat | TCP loopback ping-pong (us) | $tcp_pp | $(ratio "$send_lat" "$tcp_pp") x |
| ib_send_lat -e 8 B, event mode (us, typical) | $ev_lat | ib_send_lat 8 B, polling mode (us) | $send_lat | $(ratio "$ev_lat" "$send_lat") x |
| ib_send_lat -e 8 B, event mode (us, typical) | $ev_lat | TCP loopback ping-pong (us) | $tcp_pp | $(ratio "$ev_lat" "$tcp_pp") x |

ib_send_lat 8 B average: $send_lat_avg us (polling), $ev_lat_avg us (event mode). Machine: $(nproc) cores, $(uname -r).

| RC ping-pong 8 B, one way (us, average; vrdma-idle-qps) | 0 idle QPs | 1000 idle QPs | 4000 idle QPs | 4000 against 0 |
| --- | --- | --- | --- | --- |
| one context holds the idle QPs (connected, RTS) | $(idle 0) | $(idle 1000) | $(idle 4000) | $(ratio "$(idle 4000)" "$(idle 0)") x |
TABLE
