#!/usr/bin/env bash
# The verbs semantics test program (Catch2, real libibverbs) in guest a, and a
# second instance in guest b at the same time.
source "$(dirname "$0")/lib.sh"
start_shim a b
prog="$VRDMA_BUILD_DIR/test/integration/vrdma-verbs-tests"
timeout 300 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- "$prog" >"$RUN_DIR.b.out" 2>&1 &
bpid=$!
rc=0
timeout 300 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- "$prog" || rc=$?
brc=0
wait "$bpid" || brc=$?
sed 's/^/  guest b| /' "$RUN_DIR.b.out"
rm -f "$RUN_DIR.b.out"
[ "$rc" -eq 0 ] || fail "verbs tests in guest a exited $rc"
[ "$brc" -eq 0 ] || fail "verbs tests in guest b exited $brc"
echo "verbs: ok"
