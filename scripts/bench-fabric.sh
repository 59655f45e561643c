#!/usr/bin/env bash
# The fabric benchmark (separate from the tests). Builds if needed, sets up
# two simulated hosts exactly as the two-hosts integration tests do
# (test/integration/lib.sh: two network namespaces joined by a veth pair, one
# vrdma-shim in each, joined by the TCP fabric; guest a on host 1, guest b on
# host 2; the clients run in the root namespace) and measures in one run,
# across that link:
#   ib_write_bw at 64 KiB and 1 MiB    beside iperf3, one TCP stream, host 2
#                                      to host 1 (the link's TCP capacity)
#   ib_send_lat at 8 B                 beside a raw TCP ping-pong of 8 bytes
#                                      between the namespaces (TCP_NODELAY,
#                                      vrdma-baselines tcp-pingpong: blocking
#                                      reads, the issue's baseline; and
#                                      tcp-pingpong-spin: readers polling
#                                      their sockets as the shims do, the
#                                      stricter floor)
#   ib_write_bw -s 64, MsgRate         64-byte RDMA writes per second
#   MPI ping-pong 8 B to MAX_SIZE      openib BTL on vrdma0 (ranks in guests
#                                      a and b, so across the fabric) beside
#                                      btl tcp with one rank in each
#                                      namespace (mpirun in host 1's
#                                      namespace starts the other rank in
#                                      host 2's through a launch agent), over
#                                      the veth addresses
#   ib_write_bw 64 KiB, ib_send_lat 8 B again with --fabric-crypto
#                                      integrity (the shims restarted)
# and prints markdown tables with the ratios and the targets:
#   bandwidth >= 0.6 of iperf3 encrypted (the default), >= 0.8
#   with --fabric-crypto integrity; latency <= 1.3 x raw TCP (blocking) in
#   both modes and <= 1.2 x the polling TCP ping-pong (encrypted; on a
#   machine with a spare core per shim); >= 3 M writes/s; openib >= btl
#   tcp (bandwidth, i.e. no slower) at every size.
# Needs root (network namespaces) and iperf3 (scripts/install-deps.sh).
#
# Environment: BUILD_DIR (default build), ITERS_BW (20000 at 64 KiB; a tenth
# at 1 MiB), BW_ROUNDS (5: each bandwidth is measured that many times, each
# time right after its own iperf3, and the round with the median ratio is
# reported), ITERS_LAT (20000), ITERS_RATE (1000000), IPERF_SECONDS (5),
# BUDGET (MPI seconds per size, 0.25), MAX_SIZE (MPI, 4194304),
# BASELINES_ONLY=1 (only iperf3, TCP ping-pong and btl tcp: checks the
# namespaces without a fabric-capable shim).
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$src/build}"
[ -x "$build/src/shim/vrdma-shim" ] && [ -x "$build/tools/vrdma-baselines" ] ||
    BUILD_DIR="$build" "$src/scripts/build.sh"
[ "$(id -u)" -eq 0 ] || { echo "bench-fabric: needs root (network namespaces)" >&2; exit 3; }
command -v iperf3 >/dev/null || { echo "bench-fabric: no iperf3 (scripts/install-deps.sh)" >&2; exit 3; }
pingpong="$build/test/mpi/vrdma-mpi-pingpong"
ITERS_BW="${ITERS_BW:-20000}"
ITERS_LAT="${ITERS_LAT:-20000}"
ITERS_RATE="${ITERS_RATE:-1000000}"
IPERF_SECONDS="${IPERF_SECONDS:-5}"
BW_ROUNDS="${BW_ROUNDS:-5}"
BUDGET="${BUDGET:-0.25}"
MAX_SIZE="${MAX_SIZE:-4194304}"
BASELINES_ONLY="${BASELINES_ONLY:-0}"

export VRDMA_BUILD_DIR="$build" VRDMA_TOPOLOGY=two-hosts
# shellcheck source=../test/integration/lib.sh
source "$src/test/integration/lib.sh"   # its EXIT trap removes everything
if [ "$BASELINES_ONLY" = 1 ]; then
    # The namespaces and the link only, no shims.
    fabric_init
    fabric_host 1 "" 1
    fabric_host 2 "" 10
    fabric_link 1 2
else
    fabric_start "a" "b"
fi
ns1="${HOST_NS[1]}" ns2="${HOST_NS[2]}"
addr1="${HOST_ADDR[1]}" addr2="${HOST_ADDR[2]}"
base="$build/tools/vrdma-baselines"

# wait_listen NS PORT: until something listens on PORT in namespace NS.
wait_listen() {
    for _ in $(seq 1 200); do
        ip netns exec "$1" ss -ltnH "sport = :$2" | grep -q . && return 0
        sleep 0.05
    done
    fail "nothing listens on port $2 in $1"
}

port=22515
# perftest TOOL ARGS...: server in guest a (host 1), client in guest b
# (host 2); prints the client's result line.
perftest() {
    local tool="$1"
    shift
    port=$((port + 1))
    "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- "$tool" -d vrdma0 -p $port "$@" >/dev/null 2>&1 &
    local server=$!
    wait_port $port
    local line
    line="$("$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- "$tool" -d vrdma0 -p $port "$@" 127.0.0.1 |
        awk '$1 ~ /^[0-9]+$/ && NF >= 5 { print; exit }')"
    wait "$server" || fail "$tool $* (server) failed"
    [ -n "$line" ] || fail "$tool $*: no result"
    echo "$line"
}

# iperf_once: one iperf3 stream, host 2 -> host 1; prints MiB/s received,
# the unit of perftest's MB/sec.
iperf_once() {
    ip netns exec "$ns1" iperf3 -s -1 -B "$addr1" -p 5201 >/dev/null 2>&1 &
    local server=$! bw
    wait_listen "$ns1" 5201
    ip netns exec "$ns2" iperf3 -c "$addr1" -p 5201 -P 1 -t "$IPERF_SECONDS" -J >"$RUN_DIR.iperf.json"
    wait "$server" || true
    bw="$(awk '/"sum_received"/ { in_sum = 1 }
        in_sum && /"bits_per_second"/ { gsub(/[^0-9.e+]/, "", $2); printf "%.1f", $2 / 8 / 1048576; exit }' \
        "$RUN_DIR.iperf.json")"
    [ -n "$bw" ] || fail "no result in iperf3's output"
    echo "$bw"
}

# bw_rounds SIZE ITERS: BW_ROUNDS rounds of iperf3 then ib_write_bw SIZE;
# prints "VALUE BASELINE RATIO ROUNDS" for the round with the median ratio
# (ROUNDS: every round's ratio). Two cores shared by four busy processes
# make single runs of either differ by up to 1.5 x; a ratio taken from
# measurements seconds apart is steadier than either.
bw_rounds() {
    local size="$1" iters="$2" r ip v all=""
    for r in $(seq 1 "$BW_ROUNDS"); do
        ip="$(iperf_once)"
        v="$(perftest ib_write_bw -s "$size" -n "$iters" | awk '{print $4}')"
        all="$all$(awk -v a="$v" -v b="$ip" 'BEGIN { printf "%.4f %s %s", a / b, a, b }')"$'\n'
    done
    sort -n <<<"${all%$'\n'}" | awk -v n="$BW_ROUNDS" '
        { ratio[NR] = $1; line[NR] = $2 " " $3 " " sprintf("%.2f", $1) }
        END { s = ""; for (i = 1; i <= NR; i++) s = s (i > 1 ? "," : "") sprintf("%.2f", ratio[i]);
              print line[int((n + 1) / 2)], s }'
}

echo "measuring (a few minutes)..." >&2
echo "  iperf3, one stream, host 2 -> host 1" >&2
iperf_bw="$(iperf_once)"

# tcp_pingpong PORT [-spin]: one-way latency of 8 bytes between the
# namespaces (us); -spin: the readers poll their sockets (spin, then yield)
# as the shims do, instead of sleeping in read().
tcp_pingpong() {
    ip netns exec "$ns1" "$base" "tcp-pingpong${2:-}" --listen "$addr1:$1" &
    local server=$!
    ip netns exec "$ns2" "$base" "tcp-pingpong${2:-}" --connect "$addr1:$1" | awk '{print $3}'
    wait "$server" || fail "the TCP ping-pong listener failed"
}
# On a shared machine a single run can be unlucky: the ping-pong runs before
# and after the RDMA measurements and the faster one is the baseline (the
# harder one to meet).
echo "  TCP ping-pong between the namespaces" >&2
tcp_pp1="$(tcp_pingpong 5301)"
tcp_spin1="$(tcp_pingpong 5303 -spin)"

if [ "$BASELINES_ONLY" != 1 ]; then
    echo "  ib_write_bw 64 KiB and 1 MiB ($BW_ROUNDS rounds each, beside iperf3), 64 B; ib_send_lat 8 B" >&2
    read -r bw64k ip64k r64k rounds64k <<<"$(bw_rounds 65536 "$ITERS_BW")"   # BW average [MB/sec]
    read -r bw1m ip1m r1m rounds1m <<<"$(bw_rounds 1048576 $(( (ITERS_BW + 9) / 10 )))"
    rate_line="$(perftest ib_write_bw -s 64 -n "$ITERS_RATE")"
    lat_line="$(perftest ib_send_lat -s 8 -n "$ITERS_LAT")"
    rate="$(awk '{printf "%.2f", $5}' <<<"$rate_line")"      # MsgRate [Mpps]
    lat="$(awk '{print $5}' <<<"$lat_line")"        # t_typical [usec]
    lat_avg="$(awk '{print $6}' <<<"$lat_line")"    # t_avg [usec]
fi
echo "  TCP ping-pong between the namespaces, again" >&2
tcp_pp2="$(tcp_pingpong 5302)"
tcp_spin2="$(tcp_pingpong 5304 -spin)"
tcp_pp="$(awk -v a="$tcp_pp1" -v b="$tcp_pp2" 'BEGIN { print (a < b ? a : b) }')"
tcp_spin="$(awk -v a="$tcp_spin1" -v b="$tcp_spin2" 'BEGIN { print (a < b ? a : b) }')"

# MPI ping-pong, two ranks, pml ob1, yielding when idle (2 cores).
# Both MPI runs get the ranks' zeroed malloc that vrdma-mpirun adds for
# openib (docs/mpi.md "Known quirks"), so that they differ only in the BTL.
mpi_common=(--bind-to none --mca mpi_yield_when_idle 1 --mca pml ob1
    -x GLIBC_TUNABLES=glibc.malloc.tcache_count=0:glibc.malloc.perturb=255)
[ "$(id -u)" -eq 0 ] && mpi_common+=(--allow-run-as-root)
mpi_args=(--max "$MAX_SIZE" --budget "$BUDGET")
have_mpi=0
[ -x "$pingpong" ] && command -v mpirun >/dev/null && have_mpi=1
# mpi_data NAME: the "size lat bw" lines of a run's output.
mpi_data() { grep -v '^#' "$RUN_DIR.mpi.$1" | awk 'NF == 3' >"$RUN_DIR.mpi.$1.data"; }
if [ "$have_mpi" = 1 ]; then
    echo "  MPI ping-pong: btl tcp, one rank in each namespace" >&2
    # The launch agent: mpirun (in host 1's namespace) reaches "host" ADDR
    # by running the command in that address's namespace, as ssh would.
    agent="$RUN_DIR.mpi-agent"
    cat >"$agent" <<AGENT
#!/bin/sh
host="\$1"; shift
case "\$host" in
$addr1) ns=$ns1 ;;
$addr2) ns=$ns2 ;;
*) echo "mpi-agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
AGENT
    chmod +x "$agent"
    net="${FABRIC_NET}/30"
    if ! timeout 600 ip netns exec "$ns1" mpirun "${mpi_common[@]}" --mca plm_rsh_agent "$agent" \
        --mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include "$net" --host "$addr1,$addr2" -np 2 \
        --mca btl tcp,self --mca btl_tcp_if_include "$net" \
        "$pingpong" "${mpi_args[@]}" >"$RUN_DIR.mpi.tcp" 2>"$RUN_DIR.mpi.tcp.err"; then
        cat "$RUN_DIR.mpi.tcp.err" >&2
        fail "the btl tcp run failed"
    fi
    mpi_data tcp
    if [ "$BASELINES_ONLY" != 1 ]; then
        echo "  MPI ping-pong: openib on vrdma0, rank 0 in guest a, rank 1 in guest b" >&2
        if ! timeout 600 mpirun "${mpi_common[@]}" -np 2 --mca btl openib,self --mca btl_openib_allow_ib 1 \
            --mca btl_openib_warn_no_device_params_found 0 \
            "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest-by-rank a,b -- \
            "$pingpong" "${mpi_args[@]}" >"$RUN_DIR.mpi.openib" 2>"$RUN_DIR.mpi.openib.err"; then
            cat "$RUN_DIR.mpi.openib.err" >&2
            fail "the openib run failed"
        fi
        mpi_data openib
    fi
else
    echo "  (no MPI: install openmpi-bin libopenmpi-dev and rebuild)" >&2
fi

# The same shims restarted with --fabric-crypto integrity (after MPI, which
# measures the default).
if [ "$BASELINES_ONLY" != 1 ]; then
    echo "  --fabric-crypto integrity: ib_write_bw 64 KiB; ib_send_lat 8 B" >&2
    for h in 1 2; do fabric_kill "$h" TERM; done
    HOST_CRYPTO[1]=integrity HOST_CRYPTO[2]=integrity
    fabric_shim_start 1
    fabric_shim_start 2
    fabric_wait_up 1 2 >/dev/null
    read -r bw64k_i ip64k_i r64k_i rounds64k_i <<<"$(bw_rounds 65536 "$ITERS_BW")"
    lat_i_line="$(perftest ib_send_lat -s 8 -n "$ITERS_LAT")"
    lat_i="$(awk '{print $5}' <<<"$lat_i_line")"
    lat_i_avg="$(awk '{print $6}' <<<"$lat_i_line")"
fi

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
# verdict VALUE OP LIMIT: "met" or "MISSED".
verdict() { awk -v v="$1" -v l="$3" -v op="$2" 'BEGIN { ok = op == ">=" ? v >= l : v <= l; print ok ? "met" : "MISSED" }'; }

echo
if [ "$BASELINES_ONLY" = 1 ]; then
    cat <<TABLE
| baseline between the namespaces | value |
| --- | --- |
| iperf3, one TCP stream (MiB/s) | $iperf_bw |
| TCP ping-pong, 8 B, one way (us; the faster of $tcp_pp1 and $tcp_pp2) | $tcp_pp |
| TCP ping-pong, readers polling, 8 B, one way (us; the faster of $tcp_spin1 and $tcp_spin2) | $tcp_spin |
TABLE
else
    rlat="$(ratio "$lat" "$tcp_pp")"
    rspin="$(ratio "$lat" "$tcp_spin")"
    rlat_i="$(ratio "$lat_i" "$tcp_pp")"
    cat <<TABLE
| measurement (across the fabric) | value | baseline (between the same namespaces) | baseline value | ratio | target | |
| --- | ---: | --- | ---: | ---: | --- | --- |
| encrypt: ib_write_bw 64 KiB (MB/s, average; median round) | $bw64k | iperf3, one TCP stream, the same round (MiB/s) | $ip64k | $r64k | >= 0.6 | $(verdict "$r64k" ">=" 0.6) |
| encrypt: ib_write_bw 1 MiB (MB/s, average; median round) | $bw1m | iperf3, the same round (MiB/s) | $ip1m | $r1m | >= 0.6 | $(verdict "$r1m" ">=" 0.6) |
| integrity: ib_write_bw 64 KiB (MB/s, average; median round) | $bw64k_i | iperf3, the same round (MiB/s) | $ip64k_i | $r64k_i | >= 0.8 | $(verdict "$r64k_i" ">=" 0.8) |
| encrypt: ib_send_lat 8 B (us, typical) | $lat | TCP ping-pong 8 B, one way (us) | $tcp_pp | $rlat x | <= 1.3 x | $(verdict "$rlat" "<=" 1.3) |
| integrity: ib_send_lat 8 B (us, typical) | $lat_i | TCP ping-pong 8 B, one way (us) | $tcp_pp | $rlat_i x | <= 1.3 x | $(verdict "$rlat_i" "<=" 1.3) |
| encrypt: ib_send_lat 8 B (us, typical) | $lat | TCP ping-pong 8 B, readers polling (us) | $tcp_spin | $rspin x | <= 1.2 x (a spare core per shim) | $(verdict "$rspin" "<=" 1.2) |
| encrypt: ib_write_bw 64 B message rate (M writes/s) | $rate | | | | >= 3.0 | $(verdict "$rate" ">=" 3.0) |

Bandwidth ratios of every round, lowest first: encrypt 64 KiB $rounds64k; 1 MiB $rounds1m; integrity 64 KiB $rounds64k_i. ib_send_lat 8 B average: $lat_avg us encrypted, $lat_i_avg us integrity. TCP ping-pong before and after the RDMA runs: $tcp_pp1 and $tcp_pp2 us, readers polling $tcp_spin1 and $tcp_spin2 us (the faster is the baseline). perftest's MB is 2^20 bytes, as the MiB/s given for iperf3.
TABLE
fi

if [ "$have_mpi" = 1 ]; then
    echo
    if [ "$BASELINES_ONLY" = 1 ]; then
        echo "| size | btl tcp latency (us) | btl tcp bandwidth (MB/s) |"
        echo "| ---: | ---: | ---: |"
        awk '{ printf "| %s | %.2f | %.0f |\n", $1, $2, $3 }' "$RUN_DIR.mpi.tcp.data"
    else
        echo "| size | openib/vrdma latency (us) | tcp latency (us) | openib/vrdma bandwidth (MB/s) | tcp bandwidth (MB/s) | bandwidth openib/tcp |"
        echo "| ---: | ---: | ---: | ---: | ---: | ---: |"
        join "$RUN_DIR.mpi.openib.data" "$RUN_DIR.mpi.tcp.data" | awk '
function human(n) {
    if (n >= 1048576) return (n / 1048576) " MiB"
    if (n >= 1024) return (n / 1024) " KiB"
    return n " B"
}
{
    size = $1; olat = $2; obw = $3; tlat = $4; tbw = $5
    printf "| %s | %.2f | %.2f | %.0f | %.0f | %.2f |\n", human(size), olat, tlat, obw, tbw, obw / tbw
    if (obw < tbw) miss = miss " " human(size)
}
END {
    print ""
    if (miss == "") print "MPI target (openib >= btl tcp at every size): met."
    else print "MPI target (openib >= btl tcp at every size): MISSED at" miss "."
}'
    fi
fi
echo
echo "Two network namespaces joined by a veth pair (no delay, no loss); clients in the root namespace. Machine: $(nproc) cores, $(uname -r); iperf3 $(iperf3 --version | awk 'NR==1{print $2}'), Open MPI $(ompi_info --version 2>/dev/null | awk 'NR==1{print $NF}')."
