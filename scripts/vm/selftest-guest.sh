#!/usr/bin/env bash
# Usage: guest script for scripts/vm/run-pair.sh (see scripts/vm/selftest.sh):
#   run-pair.sh WORK scripts/vm/selftest-guest.sh scripts/vm/selftest-guest.sh
#
# The role comes from VMID. Both VMs bring rxe0 up (rxe-up.sh). VM 1 checks
# that ibv_devices lists rxe0, that host programs run (ibv_devinfo shows
# PORT_ACTIVE) and that /tmp and the share are writable, then serves
# `ibv_rc_pingpong -g IDX -n 200` and `ib_send_lat -x IDX -n 200 -s 8`;
# VM 2 runs the clients against 10.10.0.1, retrying until the server listens.
# Exits non-zero on the first failure.
set -euo pipefail

case "${1:-}" in -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;; esac

vmid=${VMID:?run by scripts/vm/run-pair.sh, which sets VMID}
here=$(dirname "$(realpath "$0")")
up() { local u; read -r u _ </proc/uptime; echo "$u"; }
say() { echo "selftest[vm$vmid $(up)s]: $*"; }

# shellcheck source=scripts/vm/rxe-up.sh
source "$here/rxe-up.sh"
idx=$RXE_GID_INDEX
say "rxe up, GID index $idx"

# retry N CMD...: run CMD until it succeeds, at most N times, 1 s apart
retry() {
    local n=$1 i
    shift
    for ((i = 1; i <= n; i++)); do
        "$@" && return 0
        say "attempt $i of $* failed, retrying"
        sleep 1
    done
    return 1
}

case "$vmid" in
    1)
        out=$(ibv_devices)
        echo "$out"
        grep -qw rxe0 <<<"$out" || { say "ibv_devices does not list rxe0"; exit 1; }
        out=$(ibv_devinfo -d rxe0)
        grep -q PORT_ACTIVE <<<"$out" || { say "ibv_devinfo: rxe0 not PORT_ACTIVE: $out"; exit 1; }
        echo ok >/tmp/selftest.probe
        [ "$(cat /tmp/selftest.probe)" = ok ] || { say "/tmp not writable"; exit 1; }
        echo "vm1 $(uname -r)" >"$VM_SHARE/selftest.probe"
        say "host programs run (kernel $(uname -r)), /tmp and share writable"
        say "ibv_rc_pingpong server"
        ibv_rc_pingpong -d rxe0 -g "$idx" -n 200
        say "ib_send_lat server"
        ib_send_lat -d rxe0 -x "$idx" -n 200 -s 8
        ;;
    2)
        say "ibv_rc_pingpong client"
        retry 60 ibv_rc_pingpong -d rxe0 -g "$idx" -n 200 10.10.0.1
        say "ib_send_lat client"
        retry 60 ib_send_lat -d rxe0 -x "$idx" -n 200 -s 8 10.10.0.1
        ;;
    *) say "no role for VMID=$vmid"; exit 2 ;;
esac
say "done"
