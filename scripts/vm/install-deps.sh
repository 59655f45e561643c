#!/usr/bin/env bash
# Usage: scripts/vm/install-deps.sh
#
# Installs, from Debian's archive, the host packages the two-VM Soft-RoCE
# harness (scripts/vm/) needs: QEMU (TCG) with its BIOS and option ROMs
# (seabios, ipxe-qemu: Recommends that --no-install-recommends would skip),
# a static busybox and cpio for the initramfs, kmod for depmod, xz-utils to
# decompress the kernel, and the verbs tools the guests run from the
# host's root (rdma-core, ibverbs-utils, perftest; iproute2 for `ip` and
# `rdma`; gdb for the backtraces test-vm takes of a program that hung).
# Only what is missing is installed; prints nothing when all is
# there. Needs root to install.
set -euo pipefail

case "${1:-}" in -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;; esac

packages=(
    qemu-system-x86 seabios ipxe-qemu busybox-static kmod cpio gzip xz-utils
    rdma-core ibverbs-utils perftest iproute2 gdb
)

# shellcheck source=../lib/packages.sh
source "$(dirname "$0")/../lib/packages.sh"
install_missing vm/install-deps "${packages[@]}"
