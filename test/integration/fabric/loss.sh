#!/usr/bin/env bash
# 1% packet loss on the link between the hosts (two-hosts fabric only), task
# (d): every packet crossing the veth pair, in both directions, is dropped
# with probability 0.01 (tc netem when the kernel has it, else an iptables
# `statistic` DROP rule at each end's INPUT). RC streams of RDMA writes and
# sends between guest a (host 1) and guest b (host 2) at 4 KiB and 1 MiB, and
# ibv_rc_pingpong -c, complete with every byte verified and no error
# completion; the drop counters show that packets were really lost.
export VRDMA_TOPOLOGY=two-hosts
source "$(dirname "$0")/../lib.sh"
fabric_start "a" "b"

# loss_on H: drop 1% of host H's incoming packets on its link.
LOSS_KIND=""
loss_on() {
    local ns="${HOST_NS[$1]}" ifc="${HOST_IF[$1]}"
    if ip netns exec "$ns" tc qdisc add dev "$ifc" root netem loss 1% 2>/dev/null; then
        LOSS_KIND=netem
    else
        command -v iptables >/dev/null || fail "neither tc netem nor iptables (apt-get install iptables) can drop packets here"
        ip netns exec "$ns" iptables -w -A INPUT -i "$ifc" -m statistic --mode random --probability 0.01 -j DROP ||
            fail "iptables statistic DROP rule refused"
        LOSS_KIND=iptables
    fi
}
# dropped H: packets dropped on host H so far.
dropped() {
    local ns="${HOST_NS[$1]}" ifc="${HOST_IF[$1]}"
    if [ "$LOSS_KIND" = netem ]; then
        ip netns exec "$ns" tc -s qdisc show dev "$ifc" | sed -n 's/.*dropped \([0-9]*\).*/\1/p' | head -n1
    else
        ip netns exec "$ns" iptables -w -L INPUT -v -x -n | awk '$3 == "DROP" {print $1; exit}'
    fi
}
loss_on 1
loss_on 2
note "1% loss each way ($LOSS_KIND)"

stream_run small a b 28515 -s 4096 -n 3000
stream_run large b a 28516 -s 1048576 -n 200
client_server 120 28517 "ibv_rc_pingpong -d vrdma0 -g 0 -c -p 28517 -s 65536 -n 500" \
    "ibv_rc_pingpong -d vrdma0 -g 0 -c -p 28517 -s 65536 -n 500 127.0.0.1"
d1="$(dropped 1)" d2="$(dropped 2)"
echo "  packets dropped: host 1 ${d1:-?}, host 2 ${d2:-?}"
[ "$(( ${d1:-0} + ${d2:-0} ))" -gt 0 ] || fail "no packet was dropped: the loss was not applied"
echo "loss: ok"
