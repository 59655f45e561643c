#!/usr/bin/env bash
# Usage: scripts/vm/prepare.sh [--help] [--refresh] WORK
#
# Prepares WORK (created if missing; any directory) for scripts/vm/run-pair.sh:
#   WORK/root/        Debian's guest kernel package, dpkg -x'd and depmod'ed
#                     (the VMs insmod rdma_rxe & co. from WORK/root/lib/modules)
#   WORK/vmlinuz      the guest kernel image (bzImage)
#   WORK/vmlinux      the same, decompressed (ELF, booted via PVH: ~5 s faster
#                     per boot under TCG; made when the kernel has CONFIG_PVH)
#   WORK/initrd.gz    initramfs: static busybox, /dev/console + /dev/null, the
#                     virtio/9p/overlay modules and the /init described below
#   WORK/kver         the guest kernel version (e.g. 6.1.0-56-amd64)
#   WORK/share/       the writable 9p share (results and logs come back here)
# Cached: with all of this in place and up to date, a run does nothing (well
# under 1 s). The kernel is the package named by VM_KERNEL_PKG (e.g.
# linux-image-6.1.0-56-amd64) if set, else the one already in WORK/kver, else
# (first run, or --refresh) the one linux-image-amd64 depends on (apt-cache,
# which takes ~1.3 s here, hence the cache). Needs root (mknod).
#
# The guest /init (kernel command line words, all key=value):
#   vmid=N          VM number (1, 2, ...)
#   vmwork=WORK     the host WORK dir; the share is mounted at WORK/share
#   gscript=PATH    guest script: an absolute host path, run chrooted in the
#                   host's root (executed if executable, else with bash)
#   gargs=WORD      optional single word, passed as $1 and as VM_GARGS
#   wdt=S           guest watchdog: power off after S seconds (default 600)
# It loads the modules, mounts the host's / read-only over 9p at /mnt
# (cache=loose: a host file changed during a run may look stale), mounts proc,
# sys, devtmpfs, devpts, tmpfs on /run and /dev/shm and a writable /tmp (an
# overlay of the host's /tmp with a tmpfs on top, plain tmpfs if that fails)
# inside it, the share at WORK/share, chroots and runs the guest script with
# env VMID, VM_SHARE, VM_WORK, VM_GARGS, PATH, HOME=/tmp, stdin /dev/null,
# stdout+stderr to WORK/share/vmN.log, its exit code to WORK/share/vmN.rc,
# then powers off.
set -euo pipefail

usage() { sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; }

refresh=0
while [ "$#" -gt 0 ]; do
    case "$1" in
        -h | --help) usage; exit 0 ;;
        --refresh) refresh=1; shift ;;
        -*) usage >&2; exit 2 ;;
        *) break ;;
    esac
done
[ "$#" -eq 1 ] || { usage >&2; exit 2; }

mkdir -p "$1"
work=$(cd "$1" && pwd -P)
mkdir -p "$work/share"
self_sha=$(sha256sum <"$0" | cut -d' ' -f1)

# --- kernel -----------------------------------------------------------------
kpkg=${VM_KERNEL_PKG:-}
if [ -z "$kpkg" ] && [ "$refresh" = 0 ] && [ -s "$work/kver" ]; then
    kpkg=linux-image-$(cat "$work/kver")
fi
if [ -z "$kpkg" ]; then
    kpkg_of_meta() { apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }'; }
    kpkg=$(kpkg_of_meta)
    if [ -z "$kpkg" ]; then
        apt-get update -qq
        kpkg=$(kpkg_of_meta)
    fi
    [ -n "$kpkg" ] || { echo "vm/prepare: cannot find the kernel package linux-image-amd64 depends on" >&2; exit 1; }
fi
kver=${kpkg#linux-image-}

if [ ! -f "$work/root/boot/vmlinuz-$kver" ] || [ ! -f "$work/root/lib/modules/$kver/modules.dep" ]; then
    echo "vm/prepare: fetching $kpkg"
    mkdir -p "$work/dl"
    rm -f "$work/dl/${kpkg}_"*.deb
    (cd "$work/dl" && apt-get download -qq -o APT::Sandbox::User=root "$kpkg")
    deb=$(ls "$work/dl/${kpkg}_"*.deb)
    dpkg -x "$deb" "$work/root"
    depmod -b "$work/root" "$kver"
    rm -f "$deb"
fi
if ! cmp -s "$work/root/boot/vmlinuz-$kver" "$work/vmlinuz" 2>/dev/null; then
    cp "$work/root/boot/vmlinuz-$kver" "$work/vmlinuz"
fi
[ "$(cat "$work/kver" 2>/dev/null)" = "$kver" ] || echo "$kver" >"$work/kver"

# WORK/vmlinux: the kernel decompressed once here, booted by QEMU through its
# PVH entry. Under TCG the kernel's own xz decompression costs ~5.5 s per boot.
is_elf() { [ "$(head -c 4 "$1" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; }
if grep -qx 'CONFIG_PVH=y' "$work/root/boot/config-$kver" 2>/dev/null &&
    { [ ! -s "$work/vmlinux" ] || [ "$work/vmlinuz" -nt "$work/vmlinux" ]; }; then
    rm -f "$work/vmlinux"
    for fmt in 'xz:\xfd7zXZ\x00' 'zstd:\x28\xb5\x2f\xfd' 'gzip:\x1f\x8b\x08\x00'; do
        for off in $(LC_ALL=C grep -obUaP "${fmt#*:}" "$work/vmlinuz" | cut -d: -f1 || true); do
            # trailing data after the stream makes the decompressor complain: ignore, check the ELF
            tail -c +$((off + 1)) "$work/vmlinuz" | "${fmt%%:*}" -dc >"$work/vmlinux.tmp" 2>/dev/null || true
            if [ -s "$work/vmlinux.tmp" ] && is_elf "$work/vmlinux.tmp"; then
                mv "$work/vmlinux.tmp" "$work/vmlinux"
                break 2
            fi
        done
    done
    rm -f "$work/vmlinux.tmp"
    [ -s "$work/vmlinux" ] || echo "vm/prepare: could not decompress $work/vmlinuz; the VMs will boot it as is (slower)" >&2
fi

# --- initramfs --------------------------------------------------------------
busybox=/bin/busybox
if [ ! -x "$busybox" ] || ! "$busybox" --list | grep -x insmod >/dev/null; then
    echo "vm/prepare: a static $busybox (busybox-static) is missing: run scripts/vm/install-deps.sh" >&2
    exit 1
fi
stamp="$kver $self_sha $(sha256sum <"$busybox" | cut -d' ' -f1)"
if [ -f "$work/initrd.gz" ] && [ "$(cat "$work/initrd.stamp" 2>/dev/null)" = "$stamp" ]; then
    exit 0
fi
echo "vm/prepare: building $work/initrd.gz for $kver"

modules=(virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci
    netfs fscache 9pnet 9pnet_virtio 9p overlay)
stage="$work/initrd.d"
rm -rf "$stage"
mkdir -p "$stage"/{bin,dev,proc,sys,mnt,ovl,modules}
cp "$busybox" "$stage/bin/busybox"
mknod -m 600 "$stage/dev/console" c 5 1
mknod -m 666 "$stage/dev/null" c 1 3
moddir="$work/root/lib/modules/$kver"
for m in "${modules[@]}"; do
    rel=$(grep -m1 -E "(^|/)$m\.ko(\.[a-z]+)?:" "$moddir/modules.dep" | cut -d: -f1) ||
        { echo "vm/prepare: module $m not found in $moddir" >&2; exit 1; }
    case "$rel" in
        *.ko) cp "$moddir/$rel" "$stage/modules/$m.ko" ;;
        *.ko.xz) xz -dc "$moddir/$rel" >"$stage/modules/$m.ko" ;;
        *.ko.zst) zstd -qdc "$moddir/$rel" >"$stage/modules/$m.ko" ;;
        *) echo "vm/prepare: cannot unpack $rel" >&2; exit 1 ;;
    esac
    echo "$m" >>"$stage/modules/order"
done

cat >"$stage/init" <<'INIT'
#!/bin/busybox sh
# vrdma VM /init (written by scripts/vm/prepare.sh)
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
say() { echo "[$(cut -d' ' -f1 /proc/uptime)] init: $*" >/dev/console; }
die() { say "$*"; poweroff -f; sleep 10; }
for m in $(cat /modules/order); do
    insmod "/modules/$m.ko" || say "insmod $m failed"
done

vmid=0 vmwork= gscript= gargs= wdt=600
for w in $(cat /proc/cmdline); do
    case "$w" in
        vmid=*) vmid=${w#vmid=} ;;
        vmwork=*) vmwork=${w#vmwork=} ;;
        gscript=*) gscript=${w#gscript=} ;;
        gargs=*) gargs=${w#gargs=} ;;
        wdt=*) wdt=${w#wdt=} ;;
    esac
done
(sleep "$wdt"; say "watchdog: ${wdt}s passed, powering off"; echo o >/proc/sysrq-trigger) &
say "vm$vmid: modules loaded"
hostname "vm$vmid"
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up

m=/mnt
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144,cache=loose hostroot $m ||
    die "cannot mount the host root"
mount -t proc proc $m/proc
mount -t sysfs sysfs $m/sys
mount -t devtmpfs devtmpfs $m/dev
mkdir -p $m/dev/pts $m/dev/shm
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts $m/dev/pts
mount -t tmpfs -o mode=1777 tmpfs $m/dev/shm
mount -t tmpfs -o mode=755 tmpfs $m/run
ln -sf /proc/self/fd $m/dev/fd
ln -sf /proc/self/fd/0 $m/dev/stdin
ln -sf /proc/self/fd/1 $m/dev/stdout
ln -sf /proc/self/fd/2 $m/dev/stderr
[ -e $m/dev/ptmx ] || ln -sf pts/ptmx $m/dev/ptmx
# /tmp: the host's /tmp seen through a tmpfs overlay (so build trees and WORK
# under /tmp stay visible), or a bare tmpfs if overlayfs refuses the 9p lower.
mount -t tmpfs -o mode=755 tmpfs /ovl && mkdir -p /ovl/upper /ovl/work && chmod 1777 /ovl/upper
mount -t overlay -o lowerdir=$m/tmp,upperdir=/ovl/upper,workdir=/ovl/work overlay $m/tmp ||
    { say "overlay on /tmp failed: plain tmpfs"; mount -t tmpfs -o mode=1777 tmpfs $m/tmp; }

[ -n "$vmwork" ] || die "no vmwork= on the kernel command line"
share=$vmwork/share
[ -d $m$share ] || mkdir -p $m$share
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share $m$share || die "cannot mount the share at $share"
log=$m$share/vm$vmid.log
rcf=$m$share/vm$vmid.rc

if [ -z "$gscript" ] || [ ! -e "$m$gscript" ]; then
    echo "init: guest script '$gscript' not found in the VM" >"$log"
    rc=127
else
    run=
    [ -x "$m$gscript" ] || run=/bin/bash
    say "vm$vmid: running $gscript $gargs"
    chroot $m /usr/bin/env -i \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        HOME=/tmp TERM=dumb LANG=C.UTF-8 \
        VMID="$vmid" VM_SHARE="$share" VM_WORK="$vmwork" VM_GARGS="$gargs" \
        $run "$gscript" ${gargs:+"$gargs"} </dev/null >"$log" 2>&1
    rc=$?
fi
echo "$rc" >"$rcf"
say "vm$vmid: guest script exited $rc"
sync
umount $m$share 2>/dev/null
poweroff -f
INIT
chmod 755 "$stage/init"

(cd "$stage" && find . -print0 | cpio --null -o -H newc --owner=0:0 --quiet) | gzip -6 >"$work/initrd.gz.tmp"
mv "$work/initrd.gz.tmp" "$work/initrd.gz"
rm -rf "$stage"
echo "$stamp" >"$work/initrd.stamp"
