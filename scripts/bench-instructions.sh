#!/usr/bin/env bash
# Instructions and clock reads per message in the shims, counted by
# callgrind: the proxy for per-message work that needs neither a many-core
# machine nor hardware counters (docs/performance.md, "Per-message work").
# The shims run under `valgrind --tool=callgrind`, the clients natively, so
# only the shims' work is counted. Separate from the tests; needs valgrind,
# and root for the fabric part (network namespaces).
#
# Workloads:
#   same host  ib_send_lat -s 8 -n ITERS_LAT between guests a and b of one
#              shim: per message, ITERS_LAT each way
#   fabric     ib_write_bw -s 64 -n ITERS_RATE from guest b (host 2) to
#              guest a (host 1), two shims joined by the TCP fabric as in
#              scripts/bench-fabric.sh: per write, for each shim
#   fabric-lat ib_send_lat -s 8 -n ITERS_LAT between the same two guests:
#              per message, each shim sending ITERS_LAT and receiving
#              ITERS_LAT (a frame each, sealed by one shim, opened by the
#              other)
#   provider   the same-host workload with the shim native and the client
#              (guest b) under callgrind: the provider's side of a message,
#              in a table of its own (below)
#
# Columns, per message, from `callgrind_annotate --inclusive=yes`:
#   whole process  the worker thread (Worker::run): everything the shim did
#                  for the messages, idle passes included (under valgrind a
#                  shim runs many times slower, so it idles less than it
#                  would natively: compare builds, not machines)
#   loop passes    calls of Worker::pass a message: how often the loop went
#                  round, idle passes included. Whole-process counts of two
#                  runs compare only where this is close: a run in which
#                  the shim waited more for its clients made more passes
#                  (the latency parts are sensitive to it)
#   passes         Engine::poll_once: finding work and serving contexts
#   requester      requester_process: reading WQEs, starting requests and,
#                  on one host, the responder and the copy
#   fabric links   Fabric::read_links (poll_links before it): reading the
#                  links (frames, requests for this host's responder, ACKs
#                  for its requester)
#   sealing, opening  the fabric's AES-GCM frames (FrameCipher::seal or,
#                  before it, FrameChannel::seal; FrameChannel::open_frame)
#   clock reads    calls of clock_gettime
#
# The provider table, per call of the verb in the client's libvrdma
# (inclusive: what the application pays for the call):
#   post_send, post_recv  one work request each
#   poll_cq    a call of ibv_poll_cq; most find nothing (the client spins
#              on its CQ between messages), so this is close to the cost of
#              an empty poll
#   polls a round trip, and the provider a round trip: the calls of
#              ibv_poll_cq, and the three verbs' inclusive counts, over
#              the client's round trips (a message sent, one received),
#              spinning included
#
# Environment: BUILD_DIR (default build), ITERS_LAT (20000), ITERS_RATE
# (100000), PARTS ("same fabric fabric-lat provider"), KEEP (a directory to keep the callgrind
# files in, for callgrind_annotate).
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$src/build}"
ITERS_LAT="${ITERS_LAT:-20000}"
ITERS_RATE="${ITERS_RATE:-100000}"
PARTS="${PARTS:-same fabric fabric-lat provider}"

if [ "${1:-}" = --help ] || [ "${1:-}" = -h ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
fi

# per_message FILE N: one table's cells for callgrind file FILE over N
# messages.
per_message() {
    local f="$1" n="$2" incl calls
    incl="$(callgrind_annotate --inclusive=yes --threshold=100 "$f" 2>/dev/null)"
    # Calls of clock_gettime and of Worker::pass: the sums of their
    # callers' counts.
    calls="$(callgrind_annotate --tree=caller "$f" 2>/dev/null | awk '
        /^$/ { sum = 0; next }
        /< / { if (match($0, /\(([0-9,]+)x\)/)) { c = substr($0, RSTART + 1, RLENGTH - 3); gsub(",", "", c); sum += c } next }
        /\* .*clock_gettime/ { clock += sum; sum = 0 }
        /\* .*Worker::pass\(\) \[/ { passes += sum; sum = 0 }
        END { print clock + 0, passes + 0 }')"
    awk -v n="$n" -v clock_calls="${calls% *}" -v pass_calls="${calls#* }" '
        function take(pat,   v) { v = $1; gsub(",", "", v); if ($0 ~ pat && !(pat in seen)) { seen[pat] = 1; val[pat] = v } }
        { take(":vrdma::shim::Worker::run\\(\\) \\[")
          take(":vrdma::shim::Engine::poll_once\\(\\) \\[")
          take(":vrdma::shim::requester_process\\(.*\\) \\[")
          take("Fabric::(poll_links|read_links)\\(\\) \\[")
          take("Frame(Channel|Cipher)::seal\\(.*\\) \\[")
          take("FrameChannel::open_frame\\(\\) \\[") }
        function cell(pat) { return (pat in val) ? sprintf("%.0f", val[pat] / n) : "-" }
        END {
            printf "%s | %.1f | %s | %s | %s | %s | %s | %.1f |\n", cell(":vrdma::shim::Worker::run\\(\\) \\["), pass_calls / n,
                cell(":vrdma::shim::Engine::poll_once\\(\\) \\["), cell(":vrdma::shim::requester_process\\(.*\\) \\["),
                cell("Fabric::(poll_links|read_links)\\(\\) \\["),
                cell("Frame(Channel|Cipher)::seal\\(.*\\) \\["), cell("FrameChannel::open_frame\\(\\) \\["), clock_calls / n
        }' <<<"$incl"
}

# per_verb FILE N: the provider table's cells for the client's callgrind
# file FILE over N round trips.
per_verb() {
    # From a directory without sources: run in the checkout, callgrind_annotate
    # leaves out callers it has no source for (the client's code).
    (cd / && callgrind_annotate --tree=caller "$1" 2>/dev/null) | awk -v n="$2" '
        # The callers of a function ("<": the cost of their calls of it,
        # and how many) come before it ("*").
        /^$/ { cost = 0; calls = 0; next }
        /< / { v = $1; gsub(",", "", v); cost += v
               if (match($0, /\(([0-9,]+)x\)/)) { c = substr($0, RSTART + 1, RLENGTH - 3); gsub(",", "", c); calls += c }
               next }
        /\* .*vrdma::prov::(post_send|post_recv|poll_cq)\(ibv_/ {
            verb = $0; sub(/.*vrdma::prov::/, "", verb); sub(/\(.*/, "", verb)
            incl[verb] += cost; ncalls[verb] += calls; cost = 0; calls = 0 }
        function per_call(verb) { return ncalls[verb] ? sprintf("%.0f", incl[verb] / ncalls[verb]) : "-" }
        END {
            printf "%s | %s | %s | %.1f | %.0f |\n", per_call("post_send"), per_call("post_recv"), per_call("poll_cq"),
                ncalls["poll_cq"] / n, (incl["post_send"] + incl["post_recv"] + incl["poll_cq"]) / n
        }'
}

if [ -z "${BENCH_INSTR_PHASE:-}" ]; then
    if ! command -v valgrind >/dev/null || ! command -v callgrind_annotate >/dev/null; then
        echo "bench-instructions: no valgrind (apt-get install valgrind)" >&2
        exit 3
    fi
    case " $PARTS " in *" fabric"*) [ "$(id -u)" -eq 0 ] ||
        { echo "bench-instructions: the fabric part needs root (network namespaces); PARTS=same runs without" >&2; exit 3; } ;; esac
    [ -x "$build/src/shim/vrdma-shim" ] || BUILD_DIR="$build" "$src/scripts/build.sh"
    out="$(mktemp -d /tmp/vrdma-bench-instructions.XXXXXX)"
    trap 'rm -rf "$out"' EXIT
    echo "measuring (a few minutes: the shims run under callgrind)..." >&2
    if tr ' ' '\n' <<<"$PARTS" | grep -v '^provider$' | grep -q .; then
        echo "| workload | shim | messages | instructions a message: whole process | loop passes a message | passes | requester | fabric links | sealing | opening | clock reads a message |"
        echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    fi
    provider_rows=""
    for part in $PARTS; do
        case "$part" in same | fabric | fabric-lat | provider) ;;
            *) echo "bench-instructions: unknown part '$part' (same, fabric, fabric-lat, provider)" >&2; exit 2 ;;
        esac
        echo "  $part" >&2
        log="$out/$part.log"
        if ! BENCH_INSTR_PHASE="$part" BENCH_INSTR_OUT="$out/$part" "$0" >"$log" 2>&1; then
            cat "$log" >&2
            echo "bench-instructions: the $part part failed" >&2
            exit 1
        fi
        while IFS=$'\t' read -r file label n; do
            if [ "$part" = provider ]; then
                provider_rows+="| one host, ib_send_lat -s 8 | $label | $n | $(per_verb "$file" "$n")"$'\n'
                continue
            fi
            echo "| $(sed 's/^same$/one host, ib_send_lat -s 8/; s/^fabric$/fabric, ib_write_bw -s 64/; s/^fabric-lat$/fabric, ib_send_lat -s 8/' <<<"$part") | $label | $n | $(per_message "$file" "$n")"
        done <"$out/$part/files"
    done
    if [ -n "$provider_rows" ]; then
        echo
        echo "| workload | client | round trips | post_send a call | post_recv a call | poll_cq a call | polls a round trip | provider a round trip |"
        echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
        printf '%s' "$provider_rows"
    fi
    echo
    echo "Machine: $(nproc) cores, $(uname -r); build $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?')."
    if [ -n "${KEEP:-}" ]; then
        mkdir -p "$KEEP"
        cp "$out"/*/callgrind.* "$KEEP"/
        echo "callgrind files in $KEEP" >&2
    fi
    exit 0
fi

# One part, in its own process: its shims, under callgrind, and its clients.
mkdir -p "$BENCH_INSTR_OUT"
wrapper="$BENCH_INSTR_OUT/shim-under-callgrind"
cat >"$wrapper" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind --callgrind-out-file="$BENCH_INSTR_OUT/callgrind.%p" "$build/src/shim/vrdma-shim" "\$@"
EOF
chmod +x "$wrapper"
case "$BENCH_INSTR_PHASE" in
same | provider) export VRDMA_TOPOLOGY=one-host ;;
*) export VRDMA_TOPOLOGY=two-hosts ;;
esac
export VRDMA_BUILD_DIR="$build"
# shellcheck source=../test/integration/lib.sh
source "$src/test/integration/lib.sh"   # its EXIT trap stops the shims
# The shims under callgrind; for the provider part the client is, and the
# shim runs native.
if [ "$BENCH_INSTR_PHASE" != provider ]; then
    # shellcheck disable=SC2034  # read by lib.sh's start_shim and fabric_shim_cmd
    SHIM="$wrapper"
fi
start_shim a b
port=23101
if [ "$BENCH_INSTR_PHASE" = fabric ]; then
    client_server 600 $port "ib_write_bw -d vrdma0 -p $port -s 64 -n $ITERS_RATE" \
        "ib_write_bw -d vrdma0 -p $port -s 64 -n $ITERS_RATE 127.0.0.1"
    printf '%s\t%s\t%s\n' "$BENCH_INSTR_OUT/callgrind.${HOST_PID[1]}" "host 1 (guest a: the responder)" "$ITERS_RATE" \
        "$BENCH_INSTR_OUT/callgrind.${HOST_PID[2]}" "host 2 (guest b: it writes)" "$ITERS_RATE" >"$BENCH_INSTR_OUT/files"
elif [ "$BENCH_INSTR_PHASE" = fabric-lat ]; then
    client_server 600 $port "ib_send_lat -d vrdma0 -p $port -s 8 -n $ITERS_LAT" \
        "ib_send_lat -d vrdma0 -p $port -s 8 -n $ITERS_LAT 127.0.0.1"
    printf '%s\t%s\t%s\n' "$BENCH_INSTR_OUT/callgrind.${HOST_PID[1]}" "host 1 (guest a)" "$((2 * ITERS_LAT))" \
        "$BENCH_INSTR_OUT/callgrind.${HOST_PID[2]}" "host 2 (guest b)" "$((2 * ITERS_LAT))" >"$BENCH_INSTR_OUT/files"
elif [ "$BENCH_INSTR_PHASE" = provider ]; then
    client_server 600 $port "ib_send_lat -d vrdma0 -p $port -s 8 -n $ITERS_LAT" \
        "valgrind --tool=callgrind --callgrind-out-file=$BENCH_INSTR_OUT/callgrind.client ib_send_lat -d vrdma0 -p $port -s 8 -n $ITERS_LAT 127.0.0.1"
    printf '%s\t%s\t%s\n' "$BENCH_INSTR_OUT/callgrind.client" "guest b" "$ITERS_LAT" >"$BENCH_INSTR_OUT/files"
else
    client_server 600 $port "ib_send_lat -d vrdma0 -p $port -s 8 -n $ITERS_LAT" \
        "ib_send_lat -d vrdma0 -p $port -s 8 -n $ITERS_LAT 127.0.0.1"
    printf '%s\t%s\t%s\n' "$BENCH_INSTR_OUT/callgrind.$SHIM_PID" "the shim" "$((2 * ITERS_LAT))" >"$BENCH_INSTR_OUT/files"
fi
# The EXIT trap stops the shims; callgrind writes its files as they exit.
