#!/usr/bin/env bash
# Tenants added at run time in a fabric, and the fabric's metrics: two
# shims on this host joined over loopback (TLS, one key). Shim 1 serves a
# in partition 0x0002; shim 2 serves b and has room for more LIDs. Guest d
# (partition 0x0002) is added to shim 2 at run time: shim 1 learns its
# partitions (a peer is trusted only for the partitions it announced), so a
# checked ping-pong between a and d passes, which without the announcement
# shim 1 drops (foreign_pkey). Shim 1's /metrics then shows the peer up, the
# bytes it carried, and the fabric's refusals by reason, and passes
# promtool check metrics.
source "$(dirname "$0")/lib.sh"
base="$(mktemp -d "/tmp/vrdma-$TEST_NAME.XXXXXX")"
chmod 755 "$base"
key="$base/fabric.key"
head -c 32 /dev/urandom | base64 >"$key"
chmod 600 "$key"
p1=27610 p2=27611 mport=19466
pids=()
cleanup() {
    local rc=$?
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
    [ "$rc" -ne 0 ] && tail -n 20 "$base"/shim*.log >&2
    rm -rf "$base"
    exit "$rc"
}
trap cleanup EXIT
start() {  # start N ARGS...
    local n="$1"
    shift
    "$SHIM" --run-dir "$base/run$n" --fabric-key "$key" "$@" >"$base/shim$n.log" 2>&1 &
    pids+=($!)
}
start 1 --guest a:pkeys=0x8002 --lid-base 1 --fabric-listen 127.0.0.1:$p1 --fabric-peer 127.0.0.1:$p2 \
    --metrics-listen 127.0.0.1:$mport
start 2 --guest b --lid-base 10 --lid-count 4 --fabric-listen 127.0.0.1:$p2 --fabric-peer 127.0.0.1:$p1
up() { "$VRDMACTL" --run-dir "$base/run$1" peers 2>/dev/null | grep -q "^peer 127.0.0.1:$2 state up "; }
for _ in $(seq 1 100); do up 1 $p2 && up 2 $p1 && break; sleep 0.1; done
up 1 $p2 && up 2 $p1 || fail "the two shims did not come up as peers"
"$VRDMACTL" --run-dir "$base/run1" peers | sed 's/^/  shim 1| /'

note "guest d (partition 0x0002) added to shim 2 at run time"
out="$("$VRDMACTL" --run-dir "$base/run2" guest add d:pkeys=0x8002)" || fail "guest add d: $out"
echo "  $out"
[[ "$out" =~ ^guest\ d\ lid\ 11\  ]] || fail "d did not get LID 11, the next of shim 2's range"
"$VRDMA_RUN" --run-dir "$base/run1" --guest a -- ibv_rc_pingpong -d vrdma0 -g 0 -c -p 27612 -n 200 \
    >"$base/a.out" 2>&1 &
server=$!
wait_port 27612
timeout 60 "$VRDMA_RUN" --run-dir "$base/run2" --guest d -- ibv_rc_pingpong -d vrdma0 -g 0 -c -p 27612 -n 200 \
    127.0.0.1 >"$base/d.out" 2>&1 || { cat "$base/d.out" "$base/a.out"; fail "a ping-pong between a and d failed"; }
wait "$server" || { cat "$base/a.out"; fail "a's ping-pong server failed"; }
echo "  a <-> d across the fabric: $(grep -m1 'bytes in' "$base/d.out")"

note "shim 1's metrics"
/usr/bin/python3 - "http://127.0.0.1:$mport/metrics" "127.0.0.1:$p2" <<'PY' || fail "the fabric's metrics are wrong (above)"
import sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
url, peer = sys.argv[1:3]
text = urllib.request.urlopen(url, timeout=10).read().decode()
s = {}
for f in text_string_to_metric_families(text):
    for x in f.samples:
        s[(x.name, tuple(sorted(x.labels.items())))] = x.value
# Summed over the links to the peer (one per worker of each side).
link = lambda name: sum(v for (n, ls), v in s.items() if n == name and dict(ls).get('peer') == peer)
print('  peer %s: up %s, tx %s bytes, rx %s bytes, foreign_pkey %s' % (peer, link('vrdma_fabric_peer_up'),
      link('vrdma_fabric_peer_tx_bytes_total'), link('vrdma_fabric_peer_rx_bytes_total'),
      link('vrdma_fabric_peer_foreign_pkey_total')))
assert link('vrdma_fabric_peer_up') >= 1
assert link('vrdma_fabric_peer_rx_bytes_total') > 200 * 4096
assert link('vrdma_fabric_peer_foreign_pkey_total') == 0
assert sum(v for (n, ls), v in s.items() if n == 'vrdma_fabric_refusals_total' and dict(ls).get('reason') == 'tampered') == 0
PY
promtool="$(command -v promtool || echo /var/cache/vrdma/bin/promtool)"
if [ -x "$promtool" ]; then
    /usr/bin/python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$mport/metrics').read().decode(), end='')" |
        "$promtool" check metrics || fail "promtool check metrics refused the fabric's exposition"
    echo "  promtool check metrics: ok"
fi
"$VRDMACTL" --run-dir "$base/run2" guest remove d || fail "guest remove d"
echo "guest_runtime_fabric: ok"
