#!/usr/bin/env bash
# Unmodified perftest in event mode (-e: the tools sleep in ibv_get_cq_event
# on a completion channel instead of polling) between guest a and guest b:
# ib_send_bw and ib_send_lat over the whole size range, ib_read_bw, and
# ib_send_bw over UD.
#
# ib_write_bw: perftest 4.5 (Debian 12) refuses -e for RDMA WRITE by itself
# ("Events feature not available on WRITE verb", before it opens a device)
# and has no --write_with_imm. When the installed perftest has
# --write_with_imm, `ib_write_bw -e --write_with_imm` is run; otherwise this
# test checks that the refusal is perftest's own, and RDMA write with
# immediate data waking a completion channel is checked by vrdma-verbs-tests
# (verbs_events_test.cpp, "[events][imm]").
source "$(dirname "$0")/lib.sh"
start_shim a b

if ib_write_bw --help 2>&1 | grep >/dev/null -- '--write_with_imm'; then
    imm=1
else
    imm=0
    note "this perftest has no --write_with_imm (see verbs_events_test.cpp)"
    out="$(ib_write_bw -d no-such-device -e 2>&1)" && fail "ib_write_bw -e was accepted: run it here"
    grep -q 'Events feature not available on WRITE verb' <<<"$out" ||
        fail "ib_write_bw -e failed for another reason: $out"
fi

port=21515
run() {
    local tool="$1"
    shift
    note "$tool $*"
    client_server 300 $port "$tool -d vrdma0 -p $port $*" "$tool -d vrdma0 -p $port $* 127.0.0.1"
    port=$((port + 1))
}
run ib_send_bw -e -a -n 200
if [ "$imm" -eq 1 ]; then run ib_write_bw -e --write_with_imm -a -n 200; fi
run ib_read_bw -e -a -n 200
run ib_send_lat -e -a -n 200
run ib_send_bw -e -c UD -a -n 200
echo "events_perftest: ok"
