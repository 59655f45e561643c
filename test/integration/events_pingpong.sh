#!/usr/bin/env bash
# The unmodified ibv_*_pingpong examples in event mode (-e: every completion
# is waited for with ibv_req_notify_cq + ibv_get_cq_event on a completion
# channel) pass between guest a and guest b, checking data (-c), at several
# sizes.
source "$(dirname "$0")/lib.sh"
start_shim a b

port=20515
for size in 1 4096 65536 1048576; do
    note "ibv_rc_pingpong -e size $size"
    client_server 60 $port "ibv_rc_pingpong -d vrdma0 -g 0 -e -c -p $port -s $size -n 500" \
        "ibv_rc_pingpong -d vrdma0 -g 0 -e -c -p $port -s $size -n 500 127.0.0.1"
    port=$((port + 1))
done
for size in 1 2048 4096; do
    note "ibv_ud_pingpong -e size $size"
    client_server 60 $port "ibv_ud_pingpong -d vrdma0 -g 0 -e -c -p $port -s $size -n 500" \
        "ibv_ud_pingpong -d vrdma0 -g 0 -e -c -p $port -s $size -n 500 127.0.0.1"
    port=$((port + 1))
done
for size in 1 4096 65536; do
    note "ibv_srq_pingpong -e size $size"
    client_server 60 $port "ibv_srq_pingpong -d vrdma0 -g 0 -e -c -p $port -s $size -n 500" \
        "ibv_srq_pingpong -d vrdma0 -g 0 -e -c -p $port -s $size -n 500 127.0.0.1"
    port=$((port + 1))
done
echo "events_pingpong: ok"
