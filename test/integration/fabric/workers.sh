#!/usr/bin/env bash
# Two shims of two workers each in a fabric (two-hosts only): every worker
# has a connection of its own to each worker of the other shim, and each
# guest's traffic crosses on its worker's.
#
#  (a) Each shim shows four links up (worker 0 and 1 to the peer's workers
#      0 and 1), and no more.
#  (b) Four pairs of guests, one on each shim, run at once: worker 0 with
#      worker 0, 1 with 1, 0 with 1 and 1 with 0. Each pair runs the verbs
#      tests' RC sends with several SGEs and immediate data, RDMA writes
#      (with immediate) and reads, both atomics, and UD, every byte
#      checked by the test program.
#  (c) Every link carried traffic (its tx_msgs), so no pair went through
#      another worker's connection, none went down, all four are up.
# scripts/test-tsan.sh runs it under ThreadSanitizer: links are handed from
# the worker that accepted them to the worker they are for.
export VRDMA_TOPOLOGY=two-hosts
source "$(dirname "$0")/../lib.sh"
# Both shims with --workers 2, which deals the guests in turn: a0 a2 on
# worker 0, a1 a3 on worker 1 (b0 b2, b1 b3 likewise).
VRDMA_SHIM_ARGS="--workers 2" fabric_start "a0 a1 a2 a3" "b0 b1 b2 b3"

note "(a) four links on each side"
links_up() { host_ctl "$1" peers | grep -c ' state up ' || true; }
deadline=$(( $(date +%s) + 30 ))
while [ "$(links_up 1)" -lt 4 ] || [ "$(links_up 2)" -lt 4 ]; do
    [ "$(date +%s)" -lt "$deadline" ] || { host_ctl 1 peers >&2; host_ctl 2 peers >&2; fail "not four links up on each side after 30 s"; }
    sleep 0.2
done
for h in 1 2; do
    host_ctl "$h" peers | sed "s/^/  host $h| /"
    [ "$(host_ctl "$h" peers | grep -c '^peer ')" -eq 4 ] || fail "host $h shows other than four links"
    for w in 0 1; do
        for pw in 0 1; do
            host_ctl "$h" peers | grep -q " state up .* worker $w peer_worker $pw\$" ||
                fail "host $h: no link up from its worker $w to the peer's worker $pw"
        done
    done
done

downs() { grep -c 'fabric: peer .* down' "$(host_log "$1")" || true; }
downs1="$(downs 1)" downs2="$(downs 2)"

note "(b) four pairs at once: workers 0-0, 1-1, 0-1, 1-0"
prog="$VRDMA_BUILD_DIR/test/integration/vrdma-verbs-tests"
spec='RC send with several SGEs*,RDMA write*,atomics fetch-and-add*,[ud]'
pairs=("a0 b0" "a1 b1" "a2 b3" "a3 b2")
pids=()
for i in "${!pairs[@]}"; do
    set -- ${pairs[$i]}
    timeout 600 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest "$1" --guest "$2" -- "$prog" "$spec" \
        >"$RUN_DIR.pair$i.out" 2>&1 &
    pids+=($!)
done
rc=0
for i in "${!pairs[@]}"; do
    prc=0
    wait "${pids[$i]}" || prc=$?
    echo "  pair ${pairs[$i]}: $(tail -n 2 "$RUN_DIR.pair$i.out" | tr -s '\n' ' ')"
    if [ "$prc" -ne 0 ]; then
        sed "s/^/  pair ${pairs[$i]}| /" "$RUN_DIR.pair$i.out"
        rc=1
    fi
done
[ "$rc" -eq 0 ] || fail "a pair's verbs tests failed (above)"

note "(c) every link carried its pair's traffic; none went down"
# (Counted from (a) on: while the shims start, both may dial worker 0 of
# the other, and the connection the rule of docs/protocol.md "Fabric" drops
# is logged as down by the side that did not drop it. The other pairs of
# workers are dialed by one side only: "Workers".)
[ "$(downs 1)" -eq "$downs1" ] || fail "host 1 lost a fabric connection: $(grep 'fabric: peer .* down' "$(host_log 1)" | tail -n1)"
[ "$(downs 2)" -eq "$downs2" ] || fail "host 2 lost a fabric connection: $(grep 'fabric: peer .* down' "$(host_log 2)" | tail -n1)"
for h in 1 2; do
    host_ctl "$h" peers | grep '^peer ' | sed "s/^/  host $h| /"
    [ "$(links_up "$h")" -eq 4 ] || fail "host $h: not four links up after the traffic"
    idle="$(host_ctl "$h" peers | grep '^peer ' | grep ' tx_msgs 0 ' || true)"
    [ -z "$idle" ] || fail "host $h: a link carried nothing: $idle"
done
echo "workers: ok"
