#!/usr/bin/env bash
# A hostile guest (adversarial_guest.cpp: malformed messages and fds, bad
# indices, nasty sizes, guessed handles/keys/QPNs, fd abuse, destroy races)
# runs in guest c while guests a and b run checked ibv_rc_pingpong and
# ib_send_bw. Both must pass; afterwards the shim must be alive and answer
# ibv_devinfo. Then c guesses the qkey of a UD QP of a for 1 s while a and b
# run a checked ibv_ud_pingpong: the pair must pass, and vrdmactl counters
# must show the guesses counted and throttled to 32 a second. At the end the
# shim must hold no more fds (and, unsanitized, about the same memory) than
# before. ADVERSARY_SECONDS (default 20) sets the timed cases.
source "$(dirname "$0")/lib.sh"
start_shim a b c

shim_fds() { ls "/proc/$SHIM_PID/fd" | wc -l; }
shim_rss() { awk '/^VmRSS:/ {print $2}' "/proc/$SHIM_PID/status"; }
sanitized=0
grep -qE '^VRDMA_(SANITIZE|TSAN):BOOL=ON' "$VRDMA_BUILD_DIR/CMakeCache.txt" 2>/dev/null && sanitized=1
in_guest a ibv_devinfo >/dev/null || fail "ibv_devinfo failed before the adversary ran"
fds_before="$(shim_fds)"
rss_before="$(shim_rss)"

seed="${ADVERSARY_SEED:-$RANDOM$RANDOM}"
note "adversarial guest in c (seed $seed)"
# The hostile guest races on its own shared memory on purpose (threads
# rewriting what others post): under ThreadSanitizer (scripts/test-tsan.sh)
# only the shim is under test, so the guest does not report its own races.
TSAN_OPTIONS="${TSAN_OPTIONS:+$TSAN_OPTIONS:}report_bugs=0" \
    "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest c -- "$VRDMA_BUILD_DIR/test/integration/adversarial_guest" \
    --seconds "${ADVERSARY_SECONDS:-20}" --seed "$seed" >"$RUN_DIR.adv" 2>&1 &
adv=$!

port=18700
rounds=0
while [ "$rounds" -eq 0 ] || kill -0 "$adv" 2>/dev/null; do
    note "victims, round $((rounds + 1)): ibv_rc_pingpong -c and ib_send_bw between a and b"
    client_server 120 $port "ibv_rc_pingpong -d vrdma0 -g 0 -c -p $port -s 4096 -n 500" \
        "ibv_rc_pingpong -d vrdma0 -g 0 -c -p $port -s 4096 -n 500 127.0.0.1"
    port=$((port + 1))
    client_server 120 $port "ib_send_bw -d vrdma0 -p $port -s 65536 -n 2000" \
        "ib_send_bw -d vrdma0 -p $port -s 65536 -n 2000 127.0.0.1" | tail -n 4
    port=$((port + 1))
    rounds=$((rounds + 1))
    [ "$rounds" -lt 100 ] || break
done
adv_rc=0
timeout 300 tail --pid="$adv" -f /dev/null || true
wait "$adv" || adv_rc=$?
sed 's/^/  adversary| /' "$RUN_DIR.adv"
rm -f "$RUN_DIR.adv"
[ "$adv_rc" -eq 0 ] || fail "the adversarial guest reported a failure (exit $adv_rc)"
kill -0 "$SHIM_PID" || fail "the shim died"
note "victims passed $rounds rounds; the shim still answers a new guest"
in_guest a ibv_devinfo | grep >/dev/null 'PORT_ACTIVE' || fail "ibv_devinfo in guest a failed after the adversary"

# Quiet brute force: c guesses the qkey of a's UD QP, in a running
# ibv_ud_pingpong of a and b, as fast as it can for 1 s. The shim counts
# every guess it examines (qkey_violations of a) and examines at most
# --qkey-guess-limit (32) at once, then 32 a second; the rest are dropped
# unexamined (throttled_datagrams). b's datagrams to a are not throttled:
# one lost would stall the checked pingpong until its timeout.
note "qkey guessing: c against a's UD QP while a and b run ibv_ud_pingpong -c"
a_lid="$(cat "$RUN_DIR/a/sys/class/infiniband/vrdma0/ports/1/lid")"
# The pair is sized to last about 8 s; should a loaded machine have made it
# end before the guesser, the round proved nothing and runs again with four
# times as many round trips.
for attempt in 1 2 3; do
    examined_before="$(guest_counter a qkey_violations)"
    throttled_before="$(guest_counter a throttled_datagrams)"
    ud_pair_start a b "$port" 8
    qpn="$(sed -nE 's/.*local address: +LID 0x[0-9a-f]+, QPN (0x[0-9a-f]+).*/\1/p' "$RUN_DIR.s")"
    [ -n "$qpn" ] || { cat "$RUN_DIR.s" >&2; fail "no address from a's ibv_ud_pingpong"; }
    t0="$(date +%s%N)"
    "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest c -- "$VRDMA_BUILD_DIR/test/integration/adversarial_guest" \
        --qkey-guess "$a_lid:$qpn" 1 | tee "$RUN_DIR.g" | sed 's/^/  adversary| /'
    ms=$((($(date +%s%N) - t0) / 1000000))
    [ "$attempt" -lt 3 ] && ! kill -0 "$UD_CPID" 2>/dev/null && {
        pair_outlasted "$UD_SPID" "$UD_CPID" "the qkey guesser" "" 2>/dev/null || true
        echo "  the pair ended before the guesser: again, with more round trips"
        export UD_PAIR_ITERS=$((UD_ITERS * 4))
        sleep 2  # the guesser's throttle refills
        continue
    }
    pair_outlasted "$UD_SPID" "$UD_CPID" "the qkey guesser" "the round trips were too few three times"
    break
done
unset UD_PAIR_ITERS
sent="$(sed -nE 's/^qkey guess: ([0-9]+) datagrams.*/\1/p' "$RUN_DIR.g")"
examined=$(($(guest_counter a qkey_violations) - examined_before))
throttled=$(($(guest_counter a throttled_datagrams) - throttled_before))
most=$((32 + 32 * (ms + 999) / 1000))
echo "  $sent guesses sent in $ms ms: $examined examined (qkey_violations; at most $most), $throttled dropped unexamined (throttled_datagrams)"
warnings="$(grep -cE 'guest a: .*(wrong qkey|guessing qkeys)' "$SHIM_LOG" || true)"
echo "  the shim's warnings about them: $warnings (at most one a second of each kind)"
[ -n "$sent" ] || fail "the qkey guesser did not report"
[ $((examined + throttled)) -eq "$sent" ] || fail "of $sent guesses, $((examined + throttled)) were counted"
[ "$examined" -ge 1 ] || fail "no qkey violation counted for a: the guesses never reached its QP"
[ "$examined" -le "$most" ] || fail "$examined guesses examined in $ms ms: not throttled to 32 a second"
[ "$throttled" -ge 1 ] || fail "no guess was dropped unexamined: the guesser was never throttled"
[ "$warnings" -le $((2 * (ms / 1000 + 2))) ] || fail "$warnings warnings about the guesses in $ms ms: not rate-limited"
rm -f "$RUN_DIR.s" "$RUN_DIR.c" "$RUN_DIR.g"

# Detaches reach the shim shortly after the processes exit.
for _ in $(seq 1 50); do
    [ "$(shim_fds)" -le "$fds_before" ] && break
    sleep 0.1
done
fds_after="$(shim_fds)"
rss_after="$(shim_rss)"
echo "shim fds before: $fds_before, after: $fds_after; VmRSS before: $rss_before kB, after: $rss_after kB"
[ "$fds_after" -le "$fds_before" ] || fail "the shim holds $fds_after fds, $fds_before before: leak"
if [ "$sanitized" -eq 0 ]; then
    # The heap keeps some of what 65536 PDs and 20000 MRs took (glibc does not
    # return every freed page): allow 16 MiB.
    [ "$rss_after" -le $((rss_before + 16384)) ] || fail "the shim's VmRSS grew by $((rss_after - rss_before)) kB"
else
    echo "(VmRSS not compared: ASan keeps freed memory in quarantine)"
fi
grep -q 'blocked the shim' "$SHIM_LOG" && echo "shim: $(grep -c 'blocked the shim' "$SHIM_LOG") context(s) detached for blocking fds"
echo "adversarial: ok"
