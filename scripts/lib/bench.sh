# Helpers of the same-host benchmarks (scripts/bench.sh, bench-scale.sh).
# Source it, then set: build (the build directory), run_dir (the shim's run
# directory) and port (a free TCP port; each perftest pair takes the next).
# shellcheck shell=bash

# ratio A B: A / B with two decimals ("-" when either is missing or B is 0).
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a / b }'; }

# median V...: the median of the numbers.
median() {
    printf '%s\n' "$@" | sort -g |
        awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# wait_listen PORT: until something listens on TCP PORT (10 s at most).
wait_listen() {
    local _
    for _ in $(seq 1 200); do ss -ltnH "sport = :$1" | grep -q . && return 0; sleep 0.05; done
    return 1
}

# in_guest GUEST CMD...: CMD attached to GUEST's device (a script may
# define its own, to pin guests to CPUs, before it calls the helpers).
if ! declare -F in_guest >/dev/null; then
    in_guest() {
        local g="$1"
        shift
        "$build/tools/vrdma-run" --run-dir "$run_dir" --guest "$g" -- "$@"
    }
fi

# perftest SERVER_GUEST CLIENT_GUEST TOOL ARGS...: the server in one guest,
# the client in the other; prints the client's result line.
perftest() {
    local sg="$1" cg="$2" tool="$3"
    shift 3
    port=$((port + 1))
    in_guest "$sg" "$tool" -d vrdma0 -p $port "$@" >/dev/null 2>&1 &
    local server=$!
    wait_listen "$port"
    in_guest "$cg" "$tool" -d vrdma0 -p $port "$@" 127.0.0.1 | awk '$1 ~ /^[0-9]+$/ && NF >= 5 { print; exit }'
    wait "$server"
}

# latency_rounds ROUNDS SERVER_GUEST CLIENT_GUEST: ROUNDS alternating rounds
# of ib_send_lat (8 B, ITERS_LAT), vrdma-baselines shm-relay, ib_send_lat -e
# and shm-pingpong. Sets the arrays lat_t and lat_a (t_typical and t_avg
# of ib_send_lat), ev_t and ev_a (of -e), relay and pp (us); prints each
# round on standard error. On two cores shared by three polling processes
# a single run of any of them swings by a factor of two with scheduling:
# compare medians.
latency_rounds() {
    local rounds="$1" sg="$2" cg="$3" r line
    local base="$build/tools/vrdma-baselines"
    lat_t=() lat_a=() ev_t=() ev_a=() relay=() pp=()
    for r in $(seq 1 "$rounds"); do
        line="$(perftest "$sg" "$cg" ib_send_lat -s 8 -n "${ITERS_LAT:-20000}")"
        lat_t+=("$(awk '{print $5}' <<<"$line")") lat_a+=("$(awk '{print $6}' <<<"$line")")
        relay+=("$("$base" shm-relay | awk '{print $3}')")
        line="$(perftest "$sg" "$cg" ib_send_lat -e -s 8 -n "${ITERS_LAT:-20000}")"
        ev_t+=("$(awk '{print $5}' <<<"$line")") ev_a+=("$(awk '{print $6}' <<<"$line")")
        pp+=("$("$base" shm-pingpong | awk '{print $3}')")
        echo "round $r/$rounds: ib_send_lat ${lat_t[-1]} us, relay ${relay[-1]} us, -e ${ev_t[-1]} us," \
            "ping-pong ${pp[-1]} us" >&2
    done
}

# latency_rounds_table: the rounds of the last latency_rounds, as a table.
latency_rounds_table() {
    local i
    echo "| round | ib_send_lat (us, typical) | relay (us) | ratio | ib_send_lat -e (us, typical) | against polling |"
    echo "| --- | --- | --- | --- | --- | --- |"
    for i in "${!lat_t[@]}"; do
        echo "| $((i + 1)) | ${lat_t[$i]} | ${relay[$i]} | $(ratio "${lat_t[$i]}" "${relay[$i]}") x |" \
            "${ev_t[$i]} | $(ratio "${ev_t[$i]}" "${lat_t[$i]}") x |"
    done
}
