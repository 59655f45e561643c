#!/usr/bin/env bash
# Weights (vrdma-shim --guest NAME:weight=W, docs/protocol.md "Work per
# turn"): two tenants that both keep their worker busy share it as their
# weights say. vrdma-greedy-guest runs in guest c (weight 3) and in guest d
# (weight 1), both on worker 0, for 8 s, each with two 64 MiB SENDs always
# in flight (-g 1) and no small writes (-f 0: a stream of small writes is
# limited by the guest itself in a slow, sanitized build, not by the
# shim). vrdmactl load must then show that c moved about three times d's
# bytes (at least 1.8 times: measured 3.3 plain and 2.8 under ASan;
# with equal weights the same script measures 1.0), both weights on the
# guests' lines, and both greedy guests' completions all successful.
# A bad weight is refused at start with a message that names it.
source "$(dirname "$0")/lib.sh"

note "a bad weight is refused"
for bad in 0 17 x; do
    if out="$("$SHIM" --run-dir "/tmp/vrdma-weights-bad.$$" --guest "c:weight=$bad" 2>&1)"; then
        fail "weight=$bad was accepted"
    fi
    grep -q "weight= wants a share of its worker, 1 to 16" <<<"$out" || fail "weight=$bad: unclear error: $out"
done
echo "  weight=0, 17 and x refused"

start_shim a c:weight=3:worker=0 d:worker=0

note "two greedy guests on one worker, c with weight 3, d with 1"
pids=()
for g in c d; do
    "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest "$g" -- "$VRDMA_BUILD_DIR/test/integration/vrdma-greedy-guest" -S 8 -g 1 -f 0 \
        >"$RUN_DIR.greedy.$g" 2>&1 &
    pids+=($!)
done
for p in "${pids[@]}"; do
    wait "$p" || { cat "$RUN_DIR".greedy.* >&2; fail "a greedy guest failed"; }
done
sed 's/^/  c| /' "$RUN_DIR.greedy.c"
sed 's/^/  d| /' "$RUN_DIR.greedy.d"

load="$("$VRDMACTL" --run-dir "$RUN_DIR" load)" || fail "vrdmactl load failed"
echo "$load" | sed 's/^/  | /'
field() {  # GUEST FIELD: the value of FIELD on GUEST's line
    awk -v g="$1" -v f="$2" '$1 == "guest" && $2 == g { for (i = 3; i < NF; i += 2) if ($i == f) print $(i + 1) }' <<<"$load"
}
[ "$(field c weight)" = 3 ] && [ "$(field d weight)" = 1 ] && [ "$(field a weight)" = 1 ] ||
    fail "vrdmactl load does not show the weights (c 3, d 1, a 1)"
[ "$(field c worker)" = 0 ] && [ "$(field d worker)" = 0 ] || fail "c and d are not both on worker 0"
ratio() {  # FIELD: c's over d's
    awk -v c="$(field c "$1")" -v d="$(field d "$1")" 'BEGIN { printf "%.2f", (d > 0 ? c / d : 0) }'
}
bytes="$(ratio bytes)"
busy="$(ratio busy_s)"
echo "  c over d (weights 3 and 1): bytes $bytes, busy_s $busy"
awk -v r="$bytes" 'BEGIN { exit !(r >= 1.8 && r <= 6) }' ||
    fail "c (weight 3) moved $bytes times d's bytes, not about 3"
echo "weights: ok"
