# The start both VM test commands share (scripts/test-hca.sh,
# scripts/test-vm.sh). After `set -euo pipefail`:
#   source "$(dirname "$0")/lib/vm_test.sh"
#   vm_test_start NAME "$0" "$@"
# answers --help with the calling script's header comment, refuses other
# arguments, sets `root`, `build` (VRDMA_BUILD_DIR, default build/) and
# `work` (VRDMA_VM_WORK, default /var/tmp/vrdma-vm), installs what is
# missing, builds if there is no build, and prepares the VMs' kernel and
# initramfs in $work (cached).
vm_test_start() {
    local name=$1 script=$2
    shift 2
    case "${1:-}" in
        -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$script"; exit 0 ;;
        "") ;;
        *) echo "$name: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    root=$(cd "$(dirname "$script")/.." && pwd)
    build=$(realpath -m "${VRDMA_BUILD_DIR:-$root/build}")
    work=$(realpath -m "${VRDMA_VM_WORK:-/var/tmp/vrdma-vm}")
    "$root/scripts/install-deps.sh"
    "$root/scripts/vm/install-deps.sh"
    [ -x "$build/src/shim/vrdma-shim" ] || BUILD_DIR="$build" "$root/scripts/build.sh"
    echo "$name: preparing the VM kernel and initramfs in $work"
    "$root/scripts/vm/prepare.sh" "$work"
}
