#!/usr/bin/env bash
# Weights (vrdma-shim --guest NAME:weight=W, vrdmactl weight NAME W;
# docs/protocol.md "Work per turn"): two tenants that both keep their
# worker busy share it as their weights say. vrdma-greedy-guest runs in
# guest c (weight 3) and in guest d (weight 1), both on worker 0, for 6 s,
# each with two 64 MiB SENDs always in flight (-g 1) and no small writes
# (-f 0: a stream of small writes is limited by the guest itself in a slow,
# sanitized build, not by the shim). vrdmactl load must then show that c
# moved at least 2.4 times d's bytes (the weight counts within 20 %) and
# at most 6 times. Measured 3.19 to 3.30 plain on the machine where the
# test was written; on a later one (2026-12-06, slower copies) 3.20 to
# 3.70 with the build before that day's changes and 3.39 to 4.51 after:
# the guest of weight 1 pays each turn's fixed cost on a third of the
# bytes, so the bytes ratio lies above 3 by as much as that cost weighs
# against a 16 KiB copy (with equal weights the same script measures
# 1.0). Shares
# are of the worker's time, and under a sanitizer a turn's own
# instrumented work costs more than its 16 KiB copy: the guest of weight 1
# pays that cost per 16 KiB, the other per 48 KiB, so the bytes ratio
# lies between 3 and 9. Under ASan it measured 2.88 to 4.00 (4.00 in a
# CI run whose worker-time ratio was 2.81), once 2.38 with a worker-time
# ratio of 2.14 and once 1.91 with 1.54: on two cores the instrumented
# greedy guests poll beside the worker, a turn preempted is charged its
# wall time, and the heavier guest's three-times-longer turns are
# preempted more often (the weight still counts, and in the right
# direction; the plain build is where the 20 % is checked). So ASan runs
# are checked for 1.5 to 6. Under TSan the bytes ratio says little: it
# measured 5.9 to 7.6, once 11.57, once 1.37 (a build at -O1, the worker
# asleep 3 s of 10) and once 33.00 with the worker's time split 2.33 to 1
# (the instrumented guest of weight 1, starved of a core, left its turns
# with nothing to move: 3 of its 64 MiB messages in 6 s). So TSan runs
# check the share itself: the worker's busy time, c's over d's, at least
# 1.5, and the bytes only for their direction (more than 1). Every run
# checks both weights on the guests' lines and both greedy guests'
# completions all successful. Then the operator swaps the weights at run time
# (vrdmactl weight c 1, weight d 3) and the next 6 s go the other way.
# A bad weight is refused at start and at run time with a message that
# names it.
source "$(dirname "$0")/lib.sh"

note "a bad weight is refused at start"
for bad in 0 17 x; do
    if out="$("$SHIM" --run-dir "/tmp/vrdma-weights-bad.$$" --guest "c:weight=$bad" 2>&1)"; then
        fail "weight=$bad was accepted"
    fi
    grep -q "weight= wants a share of its worker, 1 to 16" <<<"$out" || fail "weight=$bad: unclear error: $out"
done
echo "  weight=0, 17 and x refused"

start_shim a c:weight=3:worker=0 d:worker=0

load=""
field() {  # GUEST FIELD: the value of FIELD on GUEST's line of $load
    awk -v g="$1" -v f="$2" '$1 == "guest" && $2 == g { for (i = 3; i < NF; i += 2) if ($i == f) print $(i + 1) }' <<<"$load"
}
# greedy_phase NAME: both greedy guests for 6 s; sets c_bytes and d_bytes
# to what each moved in the phase, c_busy and d_busy to the worker's
# seconds on each.
greedy_phase() {
    load="$("$VRDMACTL" --run-dir "$RUN_DIR" load)" || fail "vrdmactl load failed"
    local c0 d0 cb0 db0 pids=() p
    c0="$(field c bytes)" d0="$(field d bytes)" cb0="$(field c busy_s)" db0="$(field d busy_s)"
    for g in c d; do
        "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest "$g" -- "$VRDMA_BUILD_DIR/test/integration/vrdma-greedy-guest" \
            -S 6 -g 1 -f 0 >"$RUN_DIR.greedy.$g" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do
        wait "$p" || { cat "$RUN_DIR".greedy.* >&2; fail "$1: a greedy guest failed"; }
    done
    sed 's/^/  c| /' "$RUN_DIR.greedy.c"
    sed 's/^/  d| /' "$RUN_DIR.greedy.d"
    load="$("$VRDMACTL" --run-dir "$RUN_DIR" load)" || fail "vrdmactl load failed"
    echo "$load" | sed 's/^/  | /'
    c_bytes=$(($(field c bytes) - c0)) d_bytes=$(($(field d bytes) - d0))
    c_busy=$(awk -v a="$(field c busy_s)" -v b="$cb0" 'BEGIN { print a - b }')
    d_busy=$(awk -v a="$(field d busy_s)" -v b="$db0" 'BEGIN { print a - b }')
}
# ratio A B: A / B to two decimals (0 when B is 0).
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }'; }
# check_shares HEAVY LIGHT: the phase's weights on the guests' lines, and
# HEAVY (weight 3) moved about three times LIGHT's (weight 1) bytes; under
# TSan (busy_lo set), HEAVY had at least busy_lo times LIGHT's busy time
# and moved more bytes.
check_shares() {
    [ "$(field "$1" weight)" = 3 ] && [ "$(field "$2" weight)" = 1 ] ||
        fail "vrdmactl load does not show the weights ($1 3, $2 1)"
    local heavy=$c_bytes light=$d_bytes heavy_s=$c_busy light_s=$d_busy r rs
    [ "$1" = c ] || { heavy=$d_bytes light=$c_bytes heavy_s=$d_busy light_s=$c_busy; }
    r="$(ratio "$heavy" "$light")" rs="$(ratio "$heavy_s" "$light_s")"
    echo "  $1 over $2 (weights 3 and 1): bytes $r, the worker's busy time $rs"
    if [ -n "$busy_lo" ]; then
        awk -v r="$rs" -v lo="$busy_lo" 'BEGIN { exit !(r >= lo) }' ||
            fail "$1 (weight 3) had $rs times $2's share of the worker's busy time, not at least $busy_lo"
        awk -v r="$r" 'BEGIN { exit !(r > 1) }' || fail "$1 (weight 3) moved $r times $2's bytes, not more"
        return
    fi
    awk -v r="$r" -v lo="$lo" -v hi="$hi" 'BEGIN { exit !(r >= lo && r <= hi) }' ||
        fail "$1 (weight 3) moved $r times $2's bytes, not $lo to $hi"
}

lo=2.4 hi=6 busy_lo=
grep -q '^VRDMA_SANITIZE:BOOL=ON' "$VRDMA_BUILD_DIR/CMakeCache.txt" 2>/dev/null && lo=1.5 hi=6
grep -q '^VRDMA_TSAN:BOOL=ON' "$VRDMA_BUILD_DIR/CMakeCache.txt" 2>/dev/null && busy_lo=1.5

note "two greedy guests on one worker, c with weight 3, d with 1"
greedy_phase "weights 3 and 1"
[ "$(field a weight)" = 1 ] || fail "vrdmactl load does not show guest a's default weight, 1"
[ "$(field c worker)" = 0 ] && [ "$(field d worker)" = 0 ] || fail "c and d are not both on worker 0"
check_shares c d

note "vrdmactl weight: the operator swaps the weights at run time"
"$VRDMACTL" --run-dir "$RUN_DIR" weight c 1 || fail "vrdmactl weight c 1 failed"
"$VRDMACTL" --run-dir "$RUN_DIR" weight d 3 || fail "vrdmactl weight d 3 failed"
for bad in "nosuch 2:no guest named 'nosuch'" "c 0:weight must be 1 to 16" "c 17:weight must be 1 to 16"; do
    args="${bad%%:*}" want="${bad#*:}"
    # shellcheck disable=SC2086  # two words: GUEST W
    if out="$("$VRDMACTL" --run-dir "$RUN_DIR" weight $args 2>&1)"; then fail "vrdmactl weight $args was accepted"; fi
    grep -qF "$want" <<<"$out" || fail "vrdmactl weight $args: unclear error: $out"
done
echo "  vrdmactl weight nosuch 2, c 0 and c 17 refused"
greedy_phase "weights 1 and 3"
check_shares d c
echo "weights: ok"
