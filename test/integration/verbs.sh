#!/usr/bin/env bash
# The verbs semantics test program (Catch2, real libibverbs; the RC, UD, API
# and events suites) attached to two guests at once: every connection it
# makes has one end on vrdma0 and the other on vrdma1 (verbs_fixture.h), so
# each crosses between guests. A second instance runs at the same time with
# the guests in the other order.
source "$(dirname "$0")/lib.sh"
start_shim a b
prog="$VRDMA_BUILD_DIR/test/integration/vrdma-verbs-tests"
timeout 300 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b --guest a -- "$prog" >"$RUN_DIR.ba.out" 2>&1 &
bpid=$!
rc=0
timeout 300 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a --guest b -- "$prog" || rc=$?
brc=0
wait "$bpid" || brc=$?
sed 's/^/  guests b,a| /' "$RUN_DIR.ba.out"
rm -f "$RUN_DIR.ba.out"
[ "$rc" -eq 0 ] || fail "verbs tests in guests a,b exited $rc"
[ "$brc" -eq 0 ] || fail "verbs tests in guests b,a exited $brc"
if [ "${VRDMA_TOPOLOGY:-}" = two-hosts ]; then
    # Nothing a guest does (truncating a registered file under a transfer
    # among it) may cost the connection between the shims.
    for h in "${FABRIC_HOSTS[@]}"; do
        down="$(grep -m1 'fabric: peer .* down' "$(host_log "$h")" || true)"
        [ -z "$down" ] || fail "host $h lost its fabric connection during the verbs tests: $down"
    done
fi
echo "verbs: ok"
