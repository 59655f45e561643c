#!/usr/bin/env bash
# Work per turn (docs/protocol.md): a tenant that asks for all the work the
# verbs allow (vrdma-greedy-guest in guest c: 2 GiB SENDs, the largest
# message the port allows, two in flight, and 1024 small RDMA WRITEs in
# flight, all on this shim) must not starve the others. While it runs:
#   - a checked ibv_rc_pingpong (-c, 4 KiB, 500 iterations) between guests a
#     and b must finish within 30 s (alone it takes well under a second; a
#     shim that copied each 2 GiB message in one go would hold every other
#     guest for a fraction of a second at each of them);
#   - a new guest must attach and answer ibv_devinfo within 5 s;
#   - the greedy guest's own completions must all succeed, and both of its
#     streams must make progress (a bulk transfer does not starve its own
#     context's small writes, nor the other way round);
#   - vrdmactl load shows the operator who used the shim: guest c, by far
#     the most bytes and shim time, a and b some, d none.
# The pingpong times, alone and beside the greedy guest, are printed.
source "$(dirname "$0")/lib.sh"
start_shim a b c d

pingpong() {
    client_server 30 "$1" "ibv_rc_pingpong -d vrdma0 -g 0 -c -p $1 -s 4096 -n 500" \
        "ibv_rc_pingpong -d vrdma0 -g 0 -c -p $1 -s 4096 -n 500 127.0.0.1" | grep -E 'client\|.*usec/iter'
}

note "ibv_rc_pingpong between a and b, alone"
pingpong 18740

note "the greedy guest in c"
"$VRDMA_RUN" --run-dir "$RUN_DIR" --guest c -- "$VRDMA_BUILD_DIR/test/integration/vrdma-greedy-guest" -S 15 \
    >"$RUN_DIR.greedy" 2>&1 &
greedy=$!
sleep 2  # its first 2 GiB messages are under way
kill -0 "$greedy" 2>/dev/null || { cat "$RUN_DIR.greedy" >&2; fail "the greedy guest ended early"; }

note "ibv_rc_pingpong between a and b, beside the greedy guest"
pingpong 18741
note "a new guest (d) attaches beside the greedy guest"
start=$(date +%s.%N)
timeout 5 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest d -- ibv_devinfo | grep >/dev/null PORT_ACTIVE ||
    fail "ibv_devinfo in guest d did not answer within 5 s"
echo "  ibv_devinfo in d: $(echo "$(date +%s.%N) - $start" | bc) s"
kill -0 "$greedy" 2>/dev/null || { cat "$RUN_DIR.greedy" >&2; fail "the greedy guest ended before the victims"; }

greedy_rc=0
wait "$greedy" || greedy_rc=$?
sed 's/^/  greedy| /' "$RUN_DIR.greedy"
bulk_messages="$(sed -nE 's/^greedy: ([0-9]+) bulk messages.*/\1/p' "$RUN_DIR.greedy")"
[ "$greedy_rc" -eq 0 ] || fail "the greedy guest failed (exit $greedy_rc)"
grep -qE 'greedy: [1-9][0-9]* bulk messages .*, [1-9][0-9]* small writes' "$RUN_DIR.greedy" ||
    fail "one of the greedy guest's streams made no progress"
rm -f "$RUN_DIR.greedy"

note "vrdmactl load: who used the shim"
load="$("$VRDMACTL" --run-dir "$RUN_DIR" load)" || fail "vrdmactl load failed"
echo "$load" | sed 's/^/  | /'
field() {  # GUEST FIELD: the value of FIELD on GUEST's line
    awk -v g="$1" -v f="$2" '$1 == "guest" && $2 == g { for (i = 3; i < NF; i += 2) if ($i == f) print $(i + 1) }' <<<"$load"
}
grep -qE '^worker 0 guests [1-4] contexts [0-9]+ passes [1-9]' <<<"$load" || fail "no worker line"
[ "$(field c bytes)" -ge $((${bulk_messages:-0} * 2 * 1024 * 1024 * 1024)) ] ||
    fail "guest c's bytes are not all counted (it completed $bulk_messages messages of 2 GiB)"
[ "$(field a bytes)" -ge $((500 * 4096)) ] || fail "guest a's pingpong bytes are not counted"
[ "$(field d messages)" -eq 0 ] || fail "guest d sent nothing, but its line says otherwise"
awk -v c="$(field c busy_s)" -v a="$(field a busy_s)" 'BEGIN { exit !(c > a) }' ||
    fail "guest c took less of the shim's time than guest a"
echo "fairness: ok"
