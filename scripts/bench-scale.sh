#!/usr/bin/env bash
# The scale and fairness benchmark (issue 13; separate from the tests).
# Builds if needed, starts one shim with guests a, b, c, d and e, and
# measures in one run:
#   idle objects      vrdma-idle-qps: 8-byte RC ping-pong between a and b
#                     (each figure the median of 5 rounds)
#                     beside 0, 1000 and 10000 idle connected QPs in the
#                     pinging context, then beside 0 and 100 idle contexts
#                     (target: 10000 idle QPs cost at most 1.2 x none)
#   a hostile guest   ib_send_lat and ib_write_bw between a and b alone,
#                     then while vrdma-greedy-guest in c posts 2 GiB SENDs and
#                     floods small WRITEs; how long a new guest (d) takes to
#                     attach and answer ibv_devinfo meanwhile (targets: the
#                     pair keeps at least 0.4 of its bandwidth and at most 3 x
#                     its average latency; d within 50 ms); and the bytes
#                     the honest writer and the greedy guest moved while
#                     both had work (vrdmactl load; equal weights: their
#                     ratio within 0.8 to 1.25)
#   aggregate         ib_write_bw of one pair (a-b) and of two independent
#                     pairs at once (a-b, d-e), with one worker
#   event mode        ib_send_lat -e beside polling mode (target: at most 3 x)
#   the floor         ib_send_lat beside vrdma-baselines shm-relay, a
#                     three-process shared-memory relay (target: at most 1.5 x);
#                     both in ROUNDS (5) alternating rounds, by their medians
# then, with a second shim of two workers pinned to the two CPUs (a and b
# on worker 0 and their programs on CPU 0; c, d and e on worker 1 and CPU
# 1: a busy tenant given a worker and a core of its own):
#   two workers       ib_write_bw of the two pairs at once (a-b on one
#                     worker, d-e on the other) beside one pair alone;
#                     ib_send_lat and ib_write_bw across the workers (a-d)
#                     beside a pair on one worker (a-b); the honest pair
#                     (a-b) beside the greedy guest on the other worker
# and prints a markdown table (docs/performance.md, "Scale and fairness").
# It takes about two minutes. ITERS_LAT,
# ITERS_BW, IDLE_QPS (default 10000), GREEDY_SECONDS (30) and SHARE_SECONDS
# (5) change the amounts.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$src/build}"
[ -x "$build/src/shim/vrdma-shim" ] || BUILD_DIR="$build" "$src/scripts/build.sh"
ITERS_BW="${ITERS_BW:-5000}"
ITERS_LAT="${ITERS_LAT:-20000}"
IDLE_QPS="${IDLE_QPS:-10000}"
run="$build/tools/vrdma-run"

run_dir="$(mktemp -d /tmp/vrdma-bench-scale.XXXXXX)"
shim=""
greedy=""
# start_shim ARGS...: a shim serving guests a to e in $run_dir (the one
# before it stopped first).
start_shim() {
    stop_shim
    "$build/src/shim/vrdma-shim" --run-dir "$run_dir" "$@" >"$run_dir.log" 2>&1 &
    shim=$!
    for _ in $(seq 1 100); do [ -e "$run_dir/ready" ] && break; sleep 0.1; done
    [ -e "$run_dir/ready" ] || { cat "$run_dir.log" >&2; echo "bench-scale: the shim did not start" >&2; exit 1; }
}
stop_shim() {
    [ -n "$shim" ] || return 0
    kill -TERM "$shim" 2>/dev/null
    wait "$shim" 2>/dev/null
    shim=""
}
cleanup() {
    [ -n "$greedy" ] && kill "$greedy" 2>/dev/null
    stop_shim
    rm -rf "$run_dir" "$run_dir.log" "$run_dir.greedy"
}
trap cleanup EXIT
start_shim --workers 1 --guest a --guest b --guest c --guest d --guest e

port=20615
# The CPU each guest's programs are pinned to (none: not pinned).
declare -A cpu_of=()
# in_guest GUEST CMD...: runs CMD attached to GUEST, on its CPU if it has one.
in_guest() {
    local g="$1"
    shift
    if [ -n "${cpu_of[$g]:-}" ]; then
        taskset -c "${cpu_of[$g]}" "$run" --run-dir "$run_dir" --guest "$g" -- "$@"
    else
        "$run" --run-dir "$run_dir" --guest "$g" -- "$@"
    fi
}
# shellcheck source=lib/bench.sh
source "$src/scripts/lib/bench.sh"
lat_avg() { awk '{print $6}' <<<"$1"; }     # t_avg [usec]
lat_typ() { awk '{print $5}' <<<"$1"; }     # t_typical [usec]
bw_avg() { awk '{print $4}' <<<"$1"; }      # BW average [MB/sec]
verdict() {  # VALUE OP LIMIT: "met" or "not met"
    awk -v v="$1" -v l="$3" -v op="$2" 'BEGIN { ok = op == "<=" ? v <= l : v >= l; print ok ? "met" : "not met" }'
}
step() { echo "bench-scale: $*" >&2; }

step "idle QPs (0, 1000, $IDLE_QPS) and idle contexts (0, 100)"
idle_lines="$("$run" --run-dir "$run_dir" --guest a --guest b -- "$build/tools/vrdma-idle-qps" \
    --contexts 0,100 0 1000 "$IDLE_QPS")"
idle() { awk -v k="$1" -v n="$2" '$1 == k && $2 == n { print $3 }' <<<"$idle_lines"; }

step "the honest pair alone"
lat_alone="$(perftest a b ib_send_lat -s 8 -n "$ITERS_LAT")"
bw_alone="$(perftest a b ib_write_bw -s 65536 -n "$ITERS_BW")"

# two_pairs: ib_write_bw of a-b and d-e at once; prints their sum (MB/s).
two_pairs() {
    port=$((port + 1))  # the second pair's; perftest takes the next one
    local second_port=$port
    in_guest d ib_write_bw -d vrdma0 -p $second_port -s 65536 -n "$ITERS_BW" >/dev/null 2>&1 &
    local second_server=$!
    wait_listen "$second_port"
    local out="$run_dir.pair2"
    in_guest e ib_write_bw -d vrdma0 -p $second_port -s 65536 -n "$ITERS_BW" 127.0.0.1 >"$out" 2>&1 &
    local second_client=$!
    local first
    first="$(perftest a b ib_write_bw -s 65536 -n "$ITERS_BW")"
    wait "$second_client" "$second_server"
    awk -v a="$(bw_avg "$first")" -v b="$(awk '$1 ~ /^[0-9]+$/ && NF >= 5 { print $4; exit }' "$out")" \
        'BEGIN { printf "%.2f", a + b }'
    rm -f "$out"
}

step "two pairs at once"
bw_two="$(two_pairs)"
port=$((port + 2))  # two_pairs ran in a subshell: its ports are taken

step "event mode and the relay floor: ${ROUNDS:-5} alternating rounds"
latency_rounds "${ROUNDS:-5}" a b
lat_med="$(median "${lat_t[@]}")"
ev_med="$(median "${ev_t[@]}")"
relay_med="$(median "${relay[@]}")"

# load_field LOAD GUEST FIELD: the value of FIELD in GUEST's line of
# vrdmactl load.
load_field() {
    awk -v g="$2" -v f="$3" '$1 == "guest" && $2 == g { for (i = 3; i < NF; i += 2) if ($i == f) print $(i + 1) }' <<<"$1"
}

# beside_greedy: starts the greedy guest in c, measures how long a new
# guest (d) takes to answer ibv_devinfo, then the honest pair (a-b)'s
# ib_send_lat and ib_write_bw; sets attach_ms, lat_hostile, bw_hostile,
# busy_during and greedy_said.
beside_greedy() {
    # It runs for GREEDY_SECONDS (30; longer than the measurements beside
    # it) and then prints what it got.
    in_guest c "$build/test/integration/vrdma-greedy-guest" -S "${GREEDY_SECONDS:-30}" >"$run_dir.greedy" 2>&1 &
    greedy=$!
    sleep 2
    local start
    start=$(date +%s%N)
    in_guest d ibv_devinfo >/dev/null
    attach_ms="$(awk -v n="$(( $(date +%s%N) - start ))" 'BEGIN { printf "%.1f", n / 1e6 }')"
    lat_hostile="$(perftest a b ib_send_lat -s 8 -n "$ITERS_LAT")"
    bw_hostile="$(perftest a b ib_write_bw -s 65536 -n "$ITERS_BW")"
    # The bytes each guest moves while both have work: the honest writer
    # (b, ib_write_bw for SHARE_SECONDS) and the greedy guest (c), from
    # vrdmactl load read 1 s into the run and 1 s before its end.
    local load_before load_after server client seconds="${SHARE_SECONDS:-5}"
    port=$((port + 1))
    in_guest a ib_write_bw -d vrdma0 -p $port -s 65536 -D "$seconds" >/dev/null 2>&1 &
    server=$!
    wait_listen "$port"
    in_guest b ib_write_bw -d vrdma0 -p $port -s 65536 -D "$seconds" 127.0.0.1 >/dev/null 2>&1 &
    client=$!
    sleep 1
    load_before="$("$build/tools/vrdmactl" --run-dir "$run_dir" load)"
    sleep $((seconds - 2))
    load_after="$("$build/tools/vrdmactl" --run-dir "$run_dir" load)"
    wait "$client" "$server"
    share_b=$(( $(load_field "$load_after" b bytes) - $(load_field "$load_before" b bytes) ))
    share_c=$(( $(load_field "$load_after" c bytes) - $(load_field "$load_before" c bytes) ))
    busy_b="$(awk -v a="$(load_field "$load_after" b busy_s)" -v b="$(load_field "$load_before" b busy_s)" 'BEGIN { printf "%.3f", a - b }')"
    busy_c="$(awk -v a="$(load_field "$load_after" c busy_s)" -v b="$(load_field "$load_before" c busy_s)" 'BEGIN { printf "%.3f", a - b }')"
    busy_during="$(kill -0 "$greedy" 2>/dev/null && echo yes || echo "no: it ended before the measurements did")"
    wait "$greedy" || { cat "$run_dir.greedy" >&2; echo "bench-scale: the greedy guest failed" >&2; exit 1; }
    greedy=""
    greedy_said="$(sed -n 's/^greedy: //p' "$run_dir.greedy")"
}

step "the honest pair beside a greedy guest (c)"
beside_greedy
load="$("$build/tools/vrdmactl" --run-dir "$run_dir" load)"

step "two workers on CPUs 0 and 1: a and b on worker 0, c, d and e on worker 1"
start_shim --workers 2 --worker-cpus 0,1 --guest a:worker=0 --guest b:worker=0 --guest c:worker=1 \
    --guest d:worker=1 --guest e:worker=1
cpu_of=([a]=0 [b]=0 [c]=1 [d]=1 [e]=1)
lat_w1="$(perftest a b ib_send_lat -s 8 -n "$ITERS_LAT")"
bw_w1="$(perftest a b ib_write_bw -s 65536 -n "$ITERS_BW")"
lat_cross="$(perftest a d ib_send_lat -s 8 -n "$ITERS_LAT")"
bw_cross="$(perftest a d ib_write_bw -s 65536 -n "$ITERS_BW")"
bw_two_w="$(two_pairs)"
port=$((port + 2))
lat_hostile1="$lat_hostile" bw_hostile1="$bw_hostile" attach_ms1="$attach_ms" busy_during1="$busy_during"
share_b1="$share_b" share_c1="$share_c" busy_b1="$busy_b" busy_c1="$busy_c"
greedy_said1="$greedy_said"
beside_greedy
load2="$("$build/tools/vrdmactl" --run-dir "$run_dir" load)"
transports2="$("$build/tools/vrdmactl" --run-dir "$run_dir" transports)"

lat0="$(idle idle-qps 0)"
latN="$(idle idle-qps "$IDLE_QPS")"
r_idle="$(ratio "$latN" "$lat0")"
r_ctx="$(ratio "$(idle idle-contexts 100)" "$(idle idle-contexts 0)")"
r_lat_h="$(ratio "$(lat_avg "$lat_hostile1")" "$(lat_avg "$lat_alone")")"
r_bw_h="$(ratio "$(bw_avg "$bw_hostile1")" "$(bw_avg "$bw_alone")")"
r_lat_h2="$(ratio "$(lat_avg "$lat_hostile")" "$(lat_avg "$lat_w1")")"
r_bw_h2="$(ratio "$(bw_avg "$bw_hostile")" "$(bw_avg "$bw_w1")")"
r_share="$(ratio "$share_b1" "$share_c1")"
r_busy="$(ratio "$busy_b1" "$busy_c1")"
r_ev="$(ratio "$ev_med" "$lat_med")"
r_relay="$(ratio "$lat_med" "$relay_med")"

cat <<TABLE
| measurement | value | baseline | baseline value | ratio | target |
| --- | --- | --- | --- | --- | --- |
| RC ping-pong 8 B, one way, $IDLE_QPS idle QPs in the context (us) | $latN | same, no idle QP | $lat0 | $r_idle x | at most 1.2 x: $(verdict "$r_idle" "<=" 1.2) |
| same, 1000 idle QPs (us) | $(idle idle-qps 1000) | same, no idle QP | $lat0 | $(ratio "$(idle idle-qps 1000)" "$lat0") x | |
| RC ping-pong 8 B, one way, 100 idle contexts (us) | $(idle idle-contexts 100) | same, no idle context | $(idle idle-contexts 0) | $r_ctx x | |
| ib_send_lat 8 B beside the greedy guest, one worker (us, average) | $(lat_avg "$lat_hostile1") | alone | $(lat_avg "$lat_alone") | $r_lat_h x | at most 3 x: $(verdict "$r_lat_h" "<=" 3) |
| ib_write_bw 64 KiB beside the greedy guest, one worker (MB/s) | $(bw_avg "$bw_hostile1") | alone | $(bw_avg "$bw_alone") | $r_bw_h of alone | at least 0.4: $(verdict "$r_bw_h" ">=" 0.4) |
| bytes moved by the honest writer (b, ib_write_bw 64 KiB) beside the greedy guest (c) in the same $((${SHARE_SECONDS:-5} - 2)) s, one worker, equal weights | $share_b1 | bytes moved by c meanwhile | $share_c1 | $r_share | 0.8 to 1.25: $(awk -v r="$r_share" 'BEGIN { print ((r >= 0.8 && r <= 1.25) ? "met" : "not met") }') |
| the worker's time in the honest writer's turns (b) in the same $((${SHARE_SECONDS:-5} - 2)) s (s, vrdmactl load busy_s) | $busy_b1 | in the greedy guest's (c) | $busy_c1 | $r_busy | 0.8 to 1.25 (shares are of the shim's time): $(awk -v r="$r_busy" 'BEGIN { print ((r >= 0.8 && r <= 1.25) ? "met" : "not met") }') |
| a new guest attaches and answers ibv_devinfo beside the greedy guest, one worker (ms, whole program) | $attach_ms1 | | | | at most 50 ms: $(verdict "$attach_ms1" "<=" 50) |
| ib_send_lat 8 B beside the greedy guest on the other worker (us, average) | $(lat_avg "$lat_hostile") | alone, 2 workers | $(lat_avg "$lat_w1") | $r_lat_h2 x | at most 3 x: $(verdict "$r_lat_h2" "<=" 3) |
| ib_write_bw 64 KiB beside the greedy guest on the other worker (MB/s) | $(bw_avg "$bw_hostile") | alone, 2 workers | $(bw_avg "$bw_w1") | $r_bw_h2 of alone | at least 0.4: $(verdict "$r_bw_h2" ">=" 0.4) |
| a new guest attaches beside the greedy guest, on its worker (ms, whole program) | $attach_ms | | | | at most 50 ms: $(verdict "$attach_ms" "<=" 50) |
| ib_write_bw 64 KiB, two pairs at once, 1 worker (MB/s, sum) | $bw_two | one pair alone | $(bw_avg "$bw_alone") | $(ratio "$bw_two" "$(bw_avg "$bw_alone")") x | |
| ib_write_bw 64 KiB, two pairs at once, 2 workers (MB/s, sum) | $bw_two_w | one pair alone, 2 workers | $(bw_avg "$bw_w1") | $(ratio "$bw_two_w" "$(bw_avg "$bw_w1")") x | |
| ib_send_lat 8 B across two workers (us, typical) | $(lat_typ "$lat_cross") | both guests on one worker | $(lat_typ "$lat_w1") | $(ratio "$(lat_typ "$lat_cross")" "$(lat_typ "$lat_w1")") x | |
| ib_write_bw 64 KiB across two workers (MB/s) | $(bw_avg "$bw_cross") | both guests on one worker | $(bw_avg "$bw_w1") | $(ratio "$(bw_avg "$bw_cross")" "$(bw_avg "$bw_w1")") of it | |
| ib_send_lat -e 8 B, event mode (us, typical, median of ${ROUNDS:-5} rounds) | $ev_med | polling mode (median) | $lat_med | $r_ev x | at most 3 x: $(verdict "$r_ev" "<=" 3) |
| ib_send_lat 8 B (us, typical, median of ${ROUNDS:-5} rounds) | $lat_med | shared-memory relay, 3 processes (us, median) | $relay_med | $r_relay x | at most 1.5 x: $(verdict "$r_relay" "<=" 1.5) |

Greedy guest, one worker: $greedy_said1 (still running when the measurements beside it ended: $busy_during1); on the other worker: $greedy_said (still running: $busy_during). Machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg).

$(latency_rounds_table)

vrdmactl load after the greedy guest, one worker:
\`\`\`
$load
\`\`\`

With two workers:
\`\`\`
$load2
$transports2
\`\`\`
TABLE
