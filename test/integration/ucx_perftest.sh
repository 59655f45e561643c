#!/usr/bin/env bash
# ucx_perftest (Debian's ucx-utils, UCX 1.13) between guest a and guest b on
# vrdma0 (issue 10): UCT put latency and bandwidth on rc_verbs (short puts
# and zero-copy 64 KiB puts, which UCX registers and vrdma reads by rkey),
# and UCP tag matching, bandwidth (eager and rendezvous) and latency, with
# UCX limited to vrdma0's verbs transports (rc_verbs carries the data;
# ud_verbs is there because UCP wires endpoints up through it). Each run must
# finish with its Final line, the UCP endpoints must have chosen rc_verbs on
# vrdma0:1 (UCX names the lane at log level info), and UCX must print no
# warning or error (it warns when it cannot free what it created: a busy
# completion channel once did).
source "$(dirname "$0")/lib.sh"
command -v ucx_perftest >/dev/null ||
    fail "ucx_perftest not found: apt-get install ucx-utils (scripts/install-deps.sh)"
start_shim a b

UCP_ENV="env UCX_NET_DEVICES=vrdma0:1 UCX_TLS=rc_verbs,ud_verbs UCX_LOG_LEVEL=info"
port=19620
# run ENV ITERATIONS ARGS...: ENV prefixes both ends ("" for UCT tests,
# which name the device and transport themselves).
run() {
    local envp="$1" n="$2"
    shift 2
    local out="$RUN_DIR.ucx.$port"
    note "ucx_perftest $* -n $n"
    client_server 120 $port "$envp ucx_perftest -p $port" \
        "$envp ucx_perftest 127.0.0.1 -p $port $* -n $n -w 100" >"$out"
    cat "$out"
    grep -Eq "client\| Final: +$n " "$out" || fail "ucx_perftest $*: no Final line for $n iterations"
    if grep -E "UCX +(WARN|ERROR)" "$out"; then fail "ucx_perftest $*: UCX warned (above)"; fi
    if [ -n "$envp" ]; then
        for side in server client; do
            grep -Eq "$side\| .*ep_cfg\[[0-9]+\]: tag\(rc_verbs/vrdma0:1\)" "$out" ||
                fail "ucx_perftest $*: the $side's endpoint did not use rc_verbs on vrdma0:1"
        done
    fi
    rm -f "$out"
    port=$((port + 1))
}
run "" 5000 -t put_lat -d vrdma0:1 -x rc_verbs -s 8
run "" 5000 -t put_bw -d vrdma0:1 -x rc_verbs -s 8
run "" 2000 -t put_bw -d vrdma0:1 -x rc_verbs -D zcopy -s 65536
run "$UCP_ENV" 2000 -t tag_bw -s 8
run "$UCP_ENV" 500 -t tag_bw -s 1048576
run "$UCP_ENV" 5000 -t tag_lat -s 8
echo "ucx_perftest: ok"
