#!/usr/bin/env bash
# Usage: scripts/vm/run-pair.sh [--help] [--timeout S] [--gargs WORD] WORK SCRIPT1 SCRIPT2
#
# Boots two QEMU VMs (TCG, 1 vCPU, 1024 MiB each) from WORK (made by
# scripts/vm/prepare.sh WORK): VM 1 runs SCRIPT1, VM 2 runs SCRIPT2, each
# chrooted in the host's root (read-only; /tmp, /run, /dev/shm writable),
# as root, with env VMID=1|2, VM_SHARE=WORK/share, VM_WORK=WORK,
# VM_GARGS=WORD (also passed as $1 when --gargs is given). The VMs' eth0 are
# one wire (unicast UDP socket netdev between the two QEMUs on 127.0.0.1);
# bring Soft-RoCE up on it with scripts/vm/rxe-up.sh (10.10.0.VMID/24, rxe0).
# SCRIPTn: absolute or relative host paths, no whitespace; not under /run,
# /dev/shm, /proc or /sys (hidden in the VM). Host files are cached in the VM:
# do not change them during a run. WORK/share is the uncached, writable
# exchange directory (same absolute path in the VMs).
#
# Waits for both QEMUs to exit. The guests power off after --timeout S
# (default 600) by their watchdog; the host kills QEMU after S+60. Once one VM
# has exited without writing 0 to its rc file, the other gets VM_PEER_GRACE
# seconds (default 30) before it is killed too.
# Results: WORK/share/vmN.log (guest script stdout+stderr), WORK/share/vmN.rc
# (its exit code), WORK/vmN.serial (console), WORK/vmN.qemu.err (QEMU's own
# messages). All are cleared before boot.
# Exit 0 iff both vmN.rc exist and contain 0; else prints the tail of each
# failing VM's log and serial file and exits 1 (2 on usage errors).
#
# Env: VM_PORT_BASE  UDP ports BASE (VM 1) and BASE+1 (VM 2) on 127.0.0.1
#                    (default: derived from the PID, skipping ports in use)
#      VM_MEM        MiB per VM (1024)
#      VM_SMP        vCPUs per VM (1)
#      VM_PEER_GRACE seconds, see above (30)
#      VM_QEMU_ARGS1, VM_QEMU_ARGS2
#                    more QEMU arguments for VM 1 and VM 2 (split on spaces;
#                    e.g. a VM guest's ivshmem-doorbell device)
# Only one run-pair at a time per WORK (flock on WORK/.run-pair.lock).
set -euo pipefail

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

timeout=600 gargs=
while [ "$#" -gt 0 ]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --timeout) timeout=${2:?--timeout needs seconds}; shift 2 ;;
        --timeout=*) timeout=${1#*=}; shift ;;
        --gargs) gargs=${2?--gargs needs a word}; shift 2 ;;
        --gargs=*) gargs=${1#*=}; shift ;;
        --) shift; break ;;
        -*) echo "run-pair: unknown option $1" >&2; usage >&2; exit 2 ;;
        *) break ;;
    esac
done
[ "$#" -eq 3 ] || { usage >&2; exit 2; }
[[ "$timeout" =~ ^[0-9]+$ ]] || { echo "run-pair: --timeout wants whole seconds" >&2; exit 2; }
[[ "$gargs" =~ ^[^[:space:]\"]*$ ]] || { echo "run-pair: --gargs must be one word" >&2; exit 2; }

work=$(cd "$1" && pwd -P) || exit 2
for f in vmlinuz initrd.gz kver; do
    [ -s "$work/$f" ] || { echo "run-pair: $work/$f missing: run scripts/vm/prepare.sh $work" >&2; exit 2; }
done
scripts=()
for s in "$2" "$3"; do
    [ -f "$s" ] || { echo "run-pair: no such guest script: $s" >&2; exit 2; }
    s=$(realpath "$s")
    case "$s" in
        *[[:space:]]*) echo "run-pair: guest script path has whitespace: $s" >&2; exit 2 ;;
        /run/* | /dev/* | /proc/* | /sys/*) echo "run-pair: $s is hidden in the VM" >&2; exit 2 ;;
    esac
    scripts+=("$s")
done
case "$work" in
    *[[:space:]]*) echo "run-pair: WORK path has whitespace: $work" >&2; exit 2 ;;
    /run/* | /dev/* | /proc/* | /sys/*) echo "run-pair: WORK $work is hidden in the VM" >&2; exit 2 ;;
esac
# the decompressed kernel (PVH entry) when prepare.sh made one: boots ~5 s faster
kernel=$work/vmlinuz
[ -s "$work/vmlinux" ] && kernel=$work/vmlinux
command -v qemu-system-x86_64 >/dev/null || { echo "run-pair: no qemu-system-x86_64: run scripts/vm/install-deps.sh" >&2; exit 2; }

share=$work/share
mkdir -p "$share"
exec 9>"$work/.run-pair.lock"
flock -n 9 || { echo "run-pair: another run-pair is using $work" >&2; exit 2; }

# UDP ports: VM_PORT_BASE or one derived from our PID, skipping bound ones.
port_busy() { ss -Huan 2>/dev/null | awk '{ print $4 }' | grep -E ":($1|$2)\$" >/dev/null; }
if [ -n "${VM_PORT_BASE:-}" ]; then
    base=$VM_PORT_BASE
else
    base=$((20000 + ($$ % 10000) * 2))
    for _ in $(seq 50); do
        port_busy "$base" "$((base + 1))" || break
        base=$((base + 2 > 39998 ? 20000 : base + 2))
    done
fi
ports=("$base" "$((base + 1))")

declare -A pid=()
# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
    local i
    for i in "${!pid[@]}"; do kill "${pid[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

start=$(date +%s)
for i in 1 2; do
    rm -f "$share/vm$i.rc" "$share/vm$i.log" "$work/vm$i.serial" "$work/vm$i.qemu.err"
done
for i in 1 2; do
    me=${ports[$((i - 1))]} peer=${ports[$((2 - i))]}
    append="console=ttyS0 panic=-1 loglevel=4 vmid=$i vmwork=$work gscript=${scripts[$((i - 1))]} wdt=$timeout"
    [ -z "$gargs" ] || append+=" gargs=$gargs"
    extra_var=VM_QEMU_ARGS$i
    read -r -a extra <<<"${!extra_var:-}"
    qemu-system-x86_64 -accel tcg -cpu max -m "${VM_MEM:-1024}" -smp "${VM_SMP:-1}" -display none -monitor none \
        -serial "file:$work/vm$i.serial" -no-reboot -kernel "$kernel" -initrd "$work/initrd.gz" \
        -append "$append" \
        -virtfs local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap \
        -virtfs "local,path=$share,mount_tag=share,security_model=passthrough,multidevs=remap" \
        -netdev "socket,id=w,udp=127.0.0.1:$peer,localaddr=127.0.0.1:$me" \
        -device "virtio-net-pci,netdev=w,mac=52:54:00:00:00:0$i" \
        "${extra[@]}" \
        </dev/null >"$work/vm$i.qemu.err" 2>&1 9>&- &
    pid[$i]=$!
done
echo "run-pair: vm1 (pid ${pid[1]}) runs ${scripts[0]}, vm2 (pid ${pid[2]}) runs ${scripts[1]}, wire 127.0.0.1:${ports[0]}<->${ports[1]}"

rc_ok() { [ "$(cat "$share/vm$1.rc" 2>/dev/null)" = 0 ]; }
deadline=$((start + timeout + 60))
grace_end=
while :; do
    alive=()
    for i in 1 2; do
        if [ -n "${pid[$i]:-}" ] && kill -0 "${pid[$i]}" 2>/dev/null; then
            alive+=("$i")
        elif [ -n "${pid[$i]:-}" ]; then
            wait "${pid[$i]}" 2>/dev/null || true
            unset "pid[$i]"
            if ! rc_ok "$i" && [ -z "$grace_end" ]; then
                grace_end=$(($(date +%s) + ${VM_PEER_GRACE:-30}))
            fi
        fi
    done
    [ "${#alive[@]}" -gt 0 ] || break
    now=$(date +%s)
    if [ "$now" -ge "$deadline" ] || { [ -n "$grace_end" ] && [ "$now" -ge "$grace_end" ]; }; then
        for i in "${alive[@]}"; do
            echo "run-pair: killing vm$i (QEMU pid ${pid[$i]}) after $((now - start)) s" >&2
            kill "${pid[$i]}" 2>/dev/null || true
        done
        sleep 1
        for i in "${alive[@]}"; do kill -9 "${pid[$i]}" 2>/dev/null || true; done
    fi
    sleep 0.5
done
trap - EXIT

status=0
for i in 1 2; do
    rc=$(cat "$share/vm$i.rc" 2>/dev/null || echo none)
    echo "run-pair: vm$i rc=$rc log $share/vm$i.log serial $work/vm$i.serial"
done
for i in 1 2; do
    rc_ok "$i" && continue
    status=1
    echo "---- vm$i: tail of $share/vm$i.log" >&2
    tail -n 30 "$share/vm$i.log" >&2 2>/dev/null || echo "(no log)" >&2
    echo "---- vm$i: tail of $work/vm$i.serial" >&2
    tail -n 20 "$work/vm$i.serial" >&2 2>/dev/null || echo "(no serial)" >&2
    if [ -s "$work/vm$i.qemu.err" ]; then
        echo "---- vm$i: QEMU said" >&2
        tail -n 10 "$work/vm$i.qemu.err" >&2
    fi
done
echo "run-pair: $([ "$status" = 0 ] && echo passed || echo FAILED) in $(($(date +%s) - start)) s"
exit "$status"
