#!/usr/bin/env bash
# Partitions (P_Keys; docs/reliability.md "What a tenant can do to
# another"): guests a and c in partition 0x0001, b in 0x0002 (all full
# members). The port's P_Key table shows them; ibv_rc_pingpong and
# ibv_ud_pingpong (pkey_index 0) work within a partition and fail between
# partitions (RC: the requester's retries run out; UD: the datagrams are
# dropped, so the UD client waits until `timeout` ends it); the shim
# counts the dropped traffic (vrdmactl counters). Then an adversary in b
# that knows the address and qkey of a running UD pair of a and c (as a
# peer of an exchange would) sends it datagrams: only the partition stands
# between them; the pair's checked run must pass and the shim must count
# every datagram as a P_Key violation. The count is the evidence:
# ibv_ud_pingpong -c does not notice stray datagrams, and sent from guest c
# (a's partition) the same 200 datagrams arrive, nothing is counted and this
# test fails. Across shims, partitions are checked by the unit test
# "RC and UD between guests of different partitions fail across shims".
source "$(dirname "$0")/lib.sh"
[ "$VRDMA_TOPOLOGY" = one-host ] || { echo "partitions are checked on one shim only"; exit 77; }
start_shim a:pkeys=0x8001 b:pkeys=0x8002 c:pkeys=0x8001,0x8002

note "the P_Key tables"
for g in a b c; do
    echo "$g: $(cat "$RUN_DIR/$g/sys/class/infiniband/vrdma0/ports/1/pkeys/"* | tr '\n' ' ')"
done
[ "$(cat "$RUN_DIR/a/sys/class/infiniband/vrdma0/ports/1/pkeys/0")" = 0x8001 ] || fail "a's pkeys/0 is not 0x8001"
[ "$(cat "$RUN_DIR/c/sys/class/infiniband/vrdma0/ports/1/pkeys/1")" = 0x8002 ] || fail "c's pkeys/1 is not 0x8002"

# pair SERVER_GUEST CLIENT_GUEST PORT PROGRAM: 0 if both ends passed.
pair() {
    local sg="$1" cg="$2" port="$3" prog="$4" src=0 crc=0
    timeout 4 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest "$sg" -- $prog -d vrdma0 -g 0 -p "$port" -n 20 \
        >"$RUN_DIR.s" 2>&1 &
    local spid=$!
    wait_port "$port"
    timeout 3 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest "$cg" -- $prog -d vrdma0 -g 0 -p "$port" -n 20 \
        127.0.0.1 >"$RUN_DIR.c" 2>&1 || crc=$?
    wait "$spid" || src=$?  # a server whose client never reached it ends by its timeout
    echo "  $prog $sg <- $cg: server $src, client $crc; client: $(grep -m1 -iE 'failed|iters' "$RUN_DIR.c" || true)"
    [ "$src" -eq 0 ] && [ "$crc" -eq 0 ]
}

note "RC and UD within partition 0x0001 (a, c): pass"
pair a c 18720 ibv_rc_pingpong || fail "RC between a and c (same partition) failed"
pair a c 18721 ibv_ud_pingpong || fail "UD between a and c (same partition) failed"
note "RC and UD between partitions (a in 0x0001, b in 0x0002): fail"
pair a b 18722 ibv_rc_pingpong && fail "RC between a and b (different partitions) passed"
pair a b 18723 ibv_ud_pingpong && fail "UD between a and b (different partitions) passed"
"$VRDMACTL" --run-dir "$RUN_DIR" counters | tee "$RUN_DIR.s"
grep -qE "^guest (a|b) .*pkey_violations [1-9]" "$RUN_DIR.s" || fail "no P_Key violation counted"

note "an adversary in b (0x8002) injects datagrams into a running UD pair of a and c (0x8001)"
before="$(guest_counter a pkey_violations)"
ud_pair_start a c 18724 2
qpn="$(sed -nE 's/.*local address: +LID 0x0*1, QPN (0x[0-9a-f]+).*/\1/p' "$RUN_DIR.s")"
[ -n "$qpn" ] || { cat "$RUN_DIR.s" >&2; fail "no address from a's ibv_ud_pingpong"; }
"$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- "$VRDMA_BUILD_DIR/test/integration/adversarial_guest" \
    --ud-inject "1:$qpn:0x11111111" 200 | sed 's/^/  adversary| /'
pair_outlasted "$UD_SPID" "$UD_CPID" "the adversary" "set UD_PAIR_ITERS higher"
after="$(guest_counter a pkey_violations)"
echo "  pkey_violations of a: $before before, $after after"
[ $((after - before)) -ge 200 ] || fail "the adversary's 200 datagrams were not all stopped at the partition"
rm -f "$RUN_DIR.s" "$RUN_DIR.c"
echo "partitions: ok"
