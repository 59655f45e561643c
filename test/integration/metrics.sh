#!/usr/bin/env bash
# Prometheus metrics (vrdma-shim --metrics-listen): after a checked
# ping-pong of 1000 messages of 4 KiB each way between guests a and b,
# GET /metrics parses with the Prometheus client library's own parser
# (python3-prometheus-client) and passes promtool check metrics, counts at least those messages and bytes for
# each guest, agrees with vrdmactl load, and carries every counter of
# vrdmactl counters; other paths get 404, other methods 405, what is not
# HTTP 400 (asked with Python: no curl or nc needed).
source "$(dirname "$0")/lib.sh"
/usr/bin/python3 -c 'import prometheus_client' 2>/dev/null ||
    { echo "no python3-prometheus-client"; exit 77; }
port=19465
VRDMA_SHIM_ARGS="--metrics-listen 127.0.0.1:$port"
start_shim a b
url="http://127.0.0.1:$port/metrics"
client_server 60 28515 "ibv_rc_pingpong -d vrdma0 -g 0 -c -p 28515 -s 4096 -n 1000" \
    "ibv_rc_pingpong -d vrdma0 -g 0 -c -p 28515 -s 4096 -n 1000 127.0.0.1" | grep 'bytes in' | sed 's/^/  /'
/usr/bin/python3 - "$url" "$RUN_DIR" "$VRDMACTL" <<'PY' || fail "the metrics are wrong (above)"
import subprocess, sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
url, run_dir, vrdmactl = sys.argv[1:4]
with urllib.request.urlopen(url, timeout=10) as r:
    assert r.status == 200, r.status
    ctype = r.headers['Content-Type']
    text = r.read().decode()
assert ctype.startswith('text/plain; version=0.0.4'), ctype
fams = {f.name: f for f in text_string_to_metric_families(text)}
print('  %d families, %d samples, content type %s' % (len(fams), sum(len(f.samples) for f in fams.values()), ctype))
def value(name, guest):
    for f in fams.values():
        for s in f.samples:
            if s.name == name and s.labels.get('guest') == guest:
                return s.value
    raise SystemExit('no sample %s{guest="%s"}' % (name, guest))
assert fams['vrdma_up'].samples[0].value == 1
load = subprocess.run([vrdmactl, '--run-dir', run_dir, 'load'], capture_output=True, text=True, check=True).stdout
counters = subprocess.run([vrdmactl, '--run-dir', run_dir, 'counters'], capture_output=True, text=True, check=True).stdout
for g in ('a', 'b'):
    msgs, nbytes = value('vrdma_guest_messages_total', g), value('vrdma_guest_bytes_total', g)
    print('  guest %s: messages %d bytes %d' % (g, msgs, nbytes))
    assert msgs >= 1000 and nbytes >= 1000 * 4096, 'guest %s sent more than that' % g
    words = next(l for l in load.splitlines() if l.startswith('guest %s ' % g)).split()
    assert int(words[words.index('messages') + 1]) == msgs, 'vrdmactl load says otherwise: ' + load
    assert value('vrdma_guest_quota_refusals_total', g) == 0
    assert any(s.labels.get('kind') == 'qp' for s in fams['vrdma_guest_resources'].samples)
    words = next(l for l in counters.splitlines() if l.startswith('guest %s ' % g)).split()
    for k in range(2, len(words), 2):  # every counter of vrdmactl counters, with the same value
        assert value('vrdma_guest_%s_total' % words[k], g) == int(words[k + 1]), words[k]
PY
/usr/bin/python3 - "$port" <<'PY' || fail "a request that is not GET /metrics was not refused as due"
import socket, sys
port = int(sys.argv[1])
def ask(raw):
    s = socket.create_connection(('127.0.0.1', port), timeout=5)
    s.sendall(raw)
    reply = b''
    while True:
        chunk = s.recv(4096)
        if not chunk: break
        reply += chunk
    return reply.split(b'\r\n', 1)[0].decode()
for raw, want in ((b'GET /other HTTP/1.0\r\n\r\n', '404'), (b'GET / HTTP/1.1\r\nHost: x\r\n\r\n', '404'),
                  (b'POST /metrics HTTP/1.0\r\n\r\n', '405'), (b'hello\r\n\r\n', '400')):
    line = ask(raw)
    assert line.split()[1] == want, (raw, line)
PY
echo "  404, 405 and 400 where due"
# Prometheus' own checker, on a scrape taken after the traffic above.
promtool="$(command -v promtool || echo /var/cache/vrdma/bin/promtool)"
if [ -x "$promtool" ]; then
    /usr/bin/python3 -c "import urllib.request; print(urllib.request.urlopen('$url').read().decode(), end='')" \
        >"$RUN_DIR.scrape"
    "$promtool" check metrics <"$RUN_DIR.scrape" >"$RUN_DIR.promtool" 2>&1 ||
        { cat "$RUN_DIR.promtool"; fail "promtool check metrics refused the exposition"; }
    echo "  promtool check metrics: $(cat "$RUN_DIR.promtool" | head -3 | tr '\n' ' ')ok"
    rm -f "$RUN_DIR.scrape" "$RUN_DIR.promtool"
else
    echo "  (no promtool: scripts/install-deps.sh unpacks it from Debian's prometheus package)"
fi
echo "metrics: ok"
