#!/usr/bin/env bash
# The unmodified ibv_*_pingpong examples pass between guest a and guest b,
# checking data (-c), at several sizes.
source "$(dirname "$0")/lib.sh"
start_shim a b

port=18515
for size in 1 64 4096 65536 1048576; do
    note "ibv_rc_pingpong size $size"
    client_server 60 $port "ibv_rc_pingpong -d vrdma0 -g 0 -c -p $port -s $size -n 200" \
        "ibv_rc_pingpong -d vrdma0 -g 0 -c -p $port -s $size -n 200 127.0.0.1"
    port=$((port + 1))
done
for size in 1 1024 2048 4096; do
    note "ibv_ud_pingpong size $size"
    client_server 60 $port "ibv_ud_pingpong -d vrdma0 -g 0 -c -p $port -s $size -n 200" \
        "ibv_ud_pingpong -d vrdma0 -g 0 -c -p $port -s $size -n 200 127.0.0.1"
    port=$((port + 1))
done
for size in 1 4096 65536; do
    note "ibv_srq_pingpong size $size"
    client_server 60 $port "ibv_srq_pingpong -d vrdma0 -g 0 -c -p $port -s $size -n 200" \
        "ibv_srq_pingpong -d vrdma0 -g 0 -c -p $port -s $size -n 200 127.0.0.1"
    port=$((port + 1))
done
echo "pingpong: ok"
