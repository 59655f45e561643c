#!/usr/bin/env bash
# Unmodified perftest between guest a and guest b over the whole size range
# (-a: 2 B to 8 MiB), bandwidth and latency, RC; and ib_send_bw over UD.
source "$(dirname "$0")/lib.sh"
start_shim a b

port=19515
run() {
    local tool="$1"
    shift
    note "$tool $*"
    client_server 300 $port "$tool -d vrdma0 -p $port $*" "$tool -d vrdma0 -p $port $* 127.0.0.1"
    port=$((port + 1))
}
run ib_send_bw -a -n 100
run ib_write_bw -a -n 100
run ib_read_bw -a -n 100
run ib_send_lat -a -n 100
run ib_write_lat -a -n 100
run ib_read_lat -a -n 100
run ib_send_bw -c UD -a -n 100
echo "perftest: ok"
