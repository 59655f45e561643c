#!/usr/bin/env bash
# A host lost and back (two-hosts fabric only), tasks (a) and (b):
#
#  (a) The shim of host 1 is killed with SIGKILL in the middle of an RC
#      stream from guest b (host 2) to guest a (host 1). The client's QP
#      (local ACK timeout 17: 4.096 us x 2^17 = 0.54 s, retry_cnt 3) must
#      fail with IBV_WC_RETRY_EXC_ERR within timeout x (retry_cnt + 1) =
#      2.15 s plus 3 s of slack, not hang and not report another status;
#      meanwhile a bystander stream between guests c and d, both on the
#      surviving host 2, keeps going and ends with every byte verified, and
#      host 2's `vrdmactl peers` no longer shows host 1 up.
#  (b) The killed shim started again with the same command line rejoins
#      (`state up` on both sides) and a new stream b -> a, and
#      ibv_rc_pingpong between a and b, work.
export VRDMA_TOPOLOGY=two-hosts
source "$(dirname "$0")/../lib.sh"
fabric_start "a" "b c d"
peer1="${HOST_ADDR[1]}:$FABRIC_PORT"

TIMEOUT=17 RETRY=3
bound_ms=$(( 4096 * (1 << TIMEOUT) / 1000000 * (RETRY + 1) ))
limit_ms=$(( bound_ms + 3000 ))

note "(a) streams b -> a (across the fabric) and d -> c (host 2 only); SIGKILL of host 1's shim"
stream_start victim a b 26515 -s 65536 -t $TIMEOUT -r $RETRY -S 300
stream_start bystander c d 26516 -s 65536 -S 8
wait_line "$RUN_DIR.victim.client" '^progress [1-9]'
wait_line "$RUN_DIR.bystander.client" '^progress [1-9]'
t0=$(now_ms)
fabric_kill 1 KILL
# The client must end by itself; give it twice the bound before calling it a hang.
pc="${STREAM_CPID[victim]}"
while kill -0 "$pc" 2>/dev/null && [ $(( $(now_ms) - t0 )) -lt $(( 2 * limit_ms + 5000 )) ]; do sleep 0.02; done
elapsed=$(( $(now_ms) - t0 ))
if kill -0 "$pc" 2>/dev/null; then
    stream_show victim
    fail "the client still runs ${elapsed} ms after the remote shim was killed"
fi
crc=0
wait "$pc" || crc=$?
# The server's shim is gone: it fails or hangs; either way it is done.
kill "${STREAM_SPID[victim]}" 2>/dev/null || true
wait "${STREAM_SPID[victim]}" 2>/dev/null || true
stream_show victim
echo "  the client ended ${elapsed} ms after SIGKILL (bound: timeout x (retry_cnt+1) = ${bound_ms} ms, limit ${limit_ms} ms), exit $crc"
grep -q '^client: completion error IBV_WC_RETRY_EXC_ERR ' "$RUN_DIR.victim.client" ||
    fail "the client's first failed completion is not IBV_WC_RETRY_EXC_ERR"
[ "$crc" -eq 1 ] || fail "the client exited $crc, not 1 (failed completion)"
[ "$elapsed" -le "$limit_ms" ] || fail "RETRY_EXC_ERR came after ${elapsed} ms, more than ${limit_ms} ms"

at_kill="$(grep '^progress ' "$RUN_DIR.bystander.client" | tail -n1 | awk '{print $2}')"
stream_wait bystander
final="$(sed -n 's/^client: done \([0-9]*\) messages.*/\1/p' "$RUN_DIR.bystander.client")"
echo "  bystander: $at_kill messages credited before the kill, $final in all"
[ "$final" -gt "${at_kill:-0}" ] || fail "the bystander made no progress after the kill"
fabric_wait_state 2 "$peer1" 'down|connecting' 20 | sed 's/^/  host 2| /'

note "(b) host 1's shim again, same command line"
fabric_shim_start 1
fabric_wait_up 1 2
stream_run after a b 26517 -s 65536 -n 500
client_server 60 26518 "ibv_rc_pingpong -d vrdma0 -g 0 -c -p 26518 -s 65536 -n 200" \
    "ibv_rc_pingpong -d vrdma0 -g 0 -c -p 26518 -s 65536 -n 200 127.0.0.1"
echo "shim_kill: ok"
