#!/usr/bin/env bash
# The link between the hosts down for 2 s in the middle of a transfer
# (two-hosts fabric only), task (c): an RC stream from guest b (host 2) to
# guest a (host 1) with local ACK timeout 20 (4.096 us x 2^20 = 4.3 s) and
# retry_cnt 7 while host 1's end of the veth pair goes down and, 2 s later,
# up again. The stream must complete with every byte verified (no error
# completion), the fabric must report both peers up afterwards, and a new
# ibv_rc_pingpong must work.
export VRDMA_TOPOLOGY=two-hosts
source "$(dirname "$0")/../lib.sh"
fabric_start "a" "b"

note "stream b -> a (timeout 20, retry_cnt 7) for 10 s; host 1's link down for 2 s in the middle"
stream_start flap a b 27515 -s 65536 -t 20 -r 7 -S 10
wait_line "$RUN_DIR.flap.client" '^progress [1-9]'
before="$(grep '^progress ' "$RUN_DIR.flap.client" | tail -n1 | awk '{print $2}')"
ip -n "${HOST_NS[1]}" link set "${HOST_IF[1]}" down
t0=$(now_ms)
sleep 2  # the fault itself: the link stays down this long
ip -n "${HOST_NS[1]}" link set "${HOST_IF[1]}" up
echo "  link down for $(( $(now_ms) - t0 )) ms; $before messages credited before"
stream_wait flap
grep '^progress ' "$RUN_DIR.flap.client" | awk '{printf "%s%s", sep, $2; sep=" "} END {print ""}' |
    sed 's/^/  progress every 0.5 s: /'
fabric_wait_up 1 2
client_server 60 27516 "ibv_rc_pingpong -d vrdma0 -g 0 -c -p 27516 -s 4096 -n 200" \
    "ibv_rc_pingpong -d vrdma0 -g 0 -c -p 27516 -s 4096 -n 200 127.0.0.1"
echo "link_flap: ok"
