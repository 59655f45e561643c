#!/usr/bin/env bash
# Usage: scripts/vm/selftest.sh [--help] [WORK]     (WORK default /tmp/vrdma-vm)
#
# End-to-end check of the two-VM Soft-RoCE harness: install-deps.sh,
# prepare.sh WORK, then run-pair.sh with scripts/vm/selftest-guest.sh in both
# VMs (rxe up, ibv_devices/ibv_devinfo in VM 1, ibv_rc_pingpong and
# ib_send_lat between the VMs), then prints the figures and the time of each
# step. Exit 0 iff everything passed. Env as for run-pair.sh (VM_PORT_BASE...).
set -euo pipefail

case "${1:-}" in -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;; esac
[ "$#" -le 1 ] || { echo "usage: $0 [WORK]" >&2; exit 2; }
here=$(dirname "$(realpath "$0")")
work=${1:-/tmp/vrdma-vm}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

t0=$(now)
"$here/install-deps.sh"
t=$(now)
"$here/prepare.sh" "$work"
echo "selftest: prepare took $(since "$t") s"
share=$work/share
rm -f "$share/selftest.probe"
t=$(now)
if ! "$here/run-pair.sh" --timeout 300 "$work" "$here/selftest-guest.sh" "$here/selftest-guest.sh"; then
    echo "selftest: FAILED (run-pair) after $(since "$t0") s" >&2
    exit 1
fi
echo "selftest: run-pair took $(since "$t") s"
grep -q '^vm1 ' "$share/selftest.probe" || { echo "selftest: FAILED: VM 1 wrote no probe to the share" >&2; exit 1; }

for i in 1 2; do
    log=$share/vm$i.log
    grep -h 'rxe-up:' "$log" | sed "s/^/selftest: vm$i /"
    grep -hE 'bytes in .* seconds|iters in .* seconds' "$log" | sed "s/^/selftest: vm$i ibv_rc_pingpong: /"
done
# ib_send_lat: the client prints the table (#bytes #iterations t_min ...)
awk '/t_min\[usec\]/ { getline; print "selftest: ib_send_lat 8 B (#bytes #iters t_min t_max t_typical t_avg t_stdev 99% 99.9%):" $0 }' \
    "$share/vm2.log"
echo "selftest: passed in $(since "$t0") s"
