#!/usr/bin/env bash
# The operator's install: the Debian package (cpack -G DEB in the build
# directory) and the systemd service in it.
#   1. The package holds the shim, the tools, the provider where libibverbs
#      loads providers with its .driver file, the unit and the example
#      configuration (a conffile), and depends on libibverbs1, libssl3 and
#      libnettle8.
#   2. The unit passes systemd-analyze verify (where systemd is there).
#   3. The packaged binaries work from the unpacked package: its shim runs
#      the packaged configuration (run directory moved by the command line)
#      under a stand-in service manager that reads $NOTIFY_SOCKET, which
#      gets READY=1 once the guest is published, RELOADING=1 then READY=1
#      on SIGHUP (as systemctl reload sends), STOPPING=1 on SIGTERM; and
#      ibv_devinfo through the packaged provider sees vrdma0 active. It runs
#      with no new privileges and only the unit's capability bounding set
#      (setpriv), giving a guest's socket to another user.
#   4. The packages install with dpkg -i into a chroot of this machine's
#      root (an overlay in a mount namespace); the demo's steps run from the
#      installed paths (ibv_devinfo in a guest, ib_write_bw between two);
#      dpkg --purge leaves nothing of them behind.
# The plain build only (a sanitized build packages sanitized binaries).
source "$(dirname "$0")/lib.sh"
grep -qE '^VRDMA_(SANITIZE|TSAN):BOOL=ON' "$VRDMA_BUILD_DIR/CMakeCache.txt" &&
    { echo "a sanitized build: the plain build's run packages"; exit 77; }
command -v cpack >/dev/null && command -v dpkg-deb >/dev/null || { echo "no cpack or dpkg-deb"; exit 77; }
work="$(mktemp -d "/tmp/vrdma-$TEST_NAME.XXXXXX")"
chmod 755 "$work"
shim_pid=""
cleanup() {
    [ -n "$shim_pid" ] && kill -KILL "$shim_pid" 2>/dev/null
    [ -n "${listener:-}" ] && kill "$listener" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

note "1. cpack: three packages"
(cd "$VRDMA_BUILD_DIR" && cpack -B "$work/out" >"$work/cpack.log" 2>&1) || { cat "$work/cpack.log"; fail "cpack failed"; }
debs=("$work"/out/*.deb)
for d in "${debs[@]}"; do echo "  $(basename "$d"): $(du -k "$d" | cut -f1) KiB, Depends: $(dpkg-deb -f "$d" Depends)"; done
[ "${#debs[@]}" -eq 3 ] || fail "cpack made ${#debs[@]} packages, not 3"
shim_deb="$(ls "$work"/out/vrdma-shim_*.deb)"
provider_deb="$(ls "$work"/out/ibverbs-providers-vrdma_*.deb)"
utils_deb="$(ls "$work"/out/vrdma-utils_*.deb)"
listing() { dpkg-deb -c "$1" | awk '{print $6}' | grep -v '/$'; }
libdir="$(dirname "$(listing "$provider_deb" | grep -m1 'libvrdma-rdmav34.so$')")"
libdir="${libdir#.}"  # /usr/lib/ARCH/libibverbs
case "$libdir" in /usr/lib/*/libibverbs) ;; *) fail "the provider is in $libdir, not libibverbs' directory" ;; esac
expect() {  # DEB FILE...
    local deb="$1" f
    shift
    for f in "$@"; do listing "$deb" | grep -qxF ".$f" || fail "$(basename "$deb") has no $f"; done
}
expect "$shim_deb" /usr/bin/vrdma-shim /usr/bin/vrdmactl /usr/lib/systemd/system/vrdma-shim.service /etc/vrdma/shim.toml
expect "$provider_deb" "$libdir/libvrdma-rdmav34.so" /etc/libibverbs.d/vrdma.driver
expect "$utils_deb" /usr/bin/vrdma-run /usr/bin/vrdma-mpirun
dpkg-deb -f "$shim_deb" Depends | grep -q libssl3 || fail "vrdma-shim does not depend on libssl3"
dpkg-deb -f "$shim_deb" Depends | grep -q libnettle8 || fail "vrdma-shim does not depend on libnettle8"
dpkg-deb -f "$provider_deb" Depends | grep -q 'libibverbs1 (>= 44)' || fail "the provider does not depend on libibverbs1 44"
dpkg-deb -f "$utils_deb" Depends | grep -q 'ibverbs-providers-vrdma' || fail "vrdma-utils does not depend on the provider"
for pair in "$shim_deb /etc/vrdma/shim.toml" "$provider_deb /etc/libibverbs.d/vrdma.driver"; do
    set -- $pair
    rm -rf "$work/control" && dpkg-deb -e "$1" "$work/control"
    grep -qx "$2" "$work/control/conffiles" || fail "$2 is not a conffile of $(basename "$1")"
done
if command -v lintian >/dev/null; then
    # Errors fail; warnings are shown (no manual pages: --help is the manual).
    lintian --fail-on error "${debs[@]}" 2>&1 | grep -v 'root privileges' | sed 's/^/  lintian| /' || true
    lintian --fail-on error "${debs[@]}" >/dev/null 2>&1 || fail "lintian found errors"
    echo "  lintian: no errors"
fi
root="$work/root"
for d in "${debs[@]}"; do dpkg-deb -x "$d" "$root"; done

note "2. the unit"
unit="$root/usr/lib/systemd/system/vrdma-shim.service"
grep -E '^(Type|ExecStart|ExecReload)=' "$unit" | sed 's/^/  /'
grep -qx 'Type=notify' "$unit" && grep -qx 'ExecStart=/usr/bin/vrdma-shim --config /etc/vrdma/shim.toml' "$unit" ||
    fail "the unit does not start the packaged shim with the packaged configuration as Type=notify"
if command -v systemd-analyze >/dev/null; then
    # The shim is not installed here: verify the unit against the unpacked one.
    sed "s|/usr/bin/vrdma-shim|$root/usr/bin/vrdma-shim|" "$unit" >"$work/vrdma-shim.service"
    systemd-analyze verify --man=no "$work/vrdma-shim.service" || fail "systemd-analyze verify refused the unit"
    echo "  systemd-analyze verify: ok"
fi

note "3. the packaged shim under a stand-in service manager"
notify="$work/notify.sock"
/usr/bin/python3 -c "
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind('$notify')
out = open('$work/notified', 'a', buffering=1)
print('listening', file=out)
while True:
    print(s.recv(4096).decode().replace('\n', ' '), file=out)
" &
listener=$!
for _ in $(seq 1 50); do grep -q listening "$work/notified" 2>/dev/null && break; sleep 0.1; done
# Within the unit's hardening that a process can be given outside systemd:
# no new privileges, and only the capabilities of its bounding set (the
# guest given to another user needs CAP_CHOWN).
caps="$(sed -n 's/^CapabilityBoundingSet=//p' "$unit" | tr 'A-Z' 'a-z' | sed 's/cap_/+/g; s/ /,/g')"
echo "  the unit's capabilities: $caps"
jail=()
command -v setpriv >/dev/null && jail=(setpriv --no-new-privs --bounding-set "-all,$caps" --inh-caps "-all")
NOTIFY_SOCKET="$notify" "${jail[@]}" "$root/usr/bin/vrdma-shim" --config "$root/etc/vrdma/shim.toml" \
    --run-dir "$work/run" --guest other:owner=nobody >"$work/shim.log" 2>&1 &
shim_pid=$!
wait_notified() {  # PATTERN
    for _ in $(seq 1 100); do grep -q "$1" "$work/notified" && return 0; sleep 0.1; done
    cat "$work/notified" "$work/shim.log" >&2
    fail "the service manager was not told '$1'"
}
wait_notified '^READY=1 STATUS=serving 2 guest'
[ -S "$work/run/default/vrdma.sock" ] || fail "READY=1 came before the guest was published"
[ "$(stat -c %U "$work/run/other/vrdma.sock")" = nobody ] || fail "guest other's socket was not given to nobody"
grep -q 'NoNewPrivs:.*1' "/proc/$shim_pid/status" 2>/dev/null || [ "${#jail[@]}" -eq 0 ] ||
    fail "the shim does not run with no new privileges"
SYSFS_PATH="$work/run/default/sys" LD_PRELOAD="$root$libdir/libvrdma-rdmav34.so" \
    RDMAV_DRIVERS="$root$libdir/libvrdma" ibv_devinfo >"$work/devinfo" 2>&1 || true
grep -q 'hca_id:.*vrdma0' "$work/devinfo" && grep -q PORT_ACTIVE "$work/devinfo" ||
    { cat "$work/devinfo"; fail "ibv_devinfo through the packaged provider does not see vrdma0 active"; }
echo "  ibv_devinfo through the packaged provider: vrdma0, PORT_ACTIVE"
kill -HUP "$shim_pid"
wait_notified '^RELOADING=1'
wait_notified '^READY=1 STATUS=reloaded'
kill -TERM "$shim_pid"
wait "$shim_pid" || fail "the packaged shim exited $? on SIGTERM"
shim_pid=""
wait_notified '^STOPPING=1'
sed 's/^/  notified| /' "$work/notified"
kill "$listener" 2>/dev/null
listener=""

note "4. dpkg -i into a chroot of this machine's root, the demo's steps from the installed paths, dpkg --purge"
# The chroot: this machine's root under an overlay whose changes go to a
# tmpfs, in a mount namespace of its own; /run, /tmp and /dev/infiniband
# start empty there.
cp "${debs[@]}" "$work/"
cat >"$work/in-chroot.sh" <<'CHROOT'
set -euo pipefail
cd /
dpkg -i /debs/*.deb >/debs/dpkg-i.log 2>&1 || { cat /debs/dpkg-i.log; exit 1; }
dpkg -L vrdma-shim ibverbs-providers-vrdma vrdma-utils | sort -u >/debs/installed
vrdma-shim --guest a --guest b >/debs/shim.log 2>&1 &
shim=$!
for _ in $(seq 1 100); do [ -e /run/vrdma/ready ] && break; sleep 0.1; done
[ -e /run/vrdma/ready ] || { cat /debs/shim.log; exit 1; }
vrdma-run --guest a -- ibv_devinfo | grep -E 'hca_id|state' | sed 's/^/  devinfo| /'
vrdma-run --guest a -- ibv_devinfo | grep -q PORT_ACTIVE
vrdma-run --guest a -- ib_write_bw -d vrdma0 -s 65536 -n 200 -p 29715 >/debs/bw.server 2>&1 &
server=$!
for _ in $(seq 1 100); do ss -ltnH 'sport = :29715' | grep -q . && break; sleep 0.05; done
vrdma-run --guest b -- ib_write_bw -d vrdma0 -s 65536 -n 200 -p 29715 127.0.0.1 >/debs/bw.client 2>&1
wait $server
grep -E '^ *65536' /debs/bw.client | sed 's/^/  ib_write_bw| /'
kill -TERM $shim
wait $shim
dpkg --purge vrdma-utils vrdma-shim ibverbs-providers-vrdma >/debs/dpkg-purge.log 2>&1 || { cat /debs/dpkg-purge.log; exit 1; }
left=0
while read -r f; do
    [ "$f" = / ] && continue
    if [ -f "$f" ] || [ -L "$f" ]; then echo "  left behind: $f"; left=1; fi
done </debs/installed
[ ! -e /etc/vrdma ] || { echo "  left behind: /etc/vrdma"; left=1; }
[ -z "$(ls /run/vrdma 2>/dev/null)" ] || { echo "  left behind in /run/vrdma: $(ls /run/vrdma)"; left=1; }
dpkg -s vrdma-shim >/dev/null 2>&1 && { echo "  vrdma-shim is still known to dpkg"; left=1; }
exit $left
CHROOT
unshare --mount --propagation private -- bash -c "
set -e
mkdir -p '$work/ovl' '$root.merged'
mount -t tmpfs tmpfs '$work/ovl'
mkdir -p '$work/ovl/upper' '$work/ovl/work'
mount -t overlay overlay -o lowerdir=/,upperdir='$work/ovl/upper',workdir='$work/ovl/work' '$root.merged'
mount -t proc proc '$root.merged/proc'
mount --bind /sys '$root.merged/sys'
mount --bind /dev '$root.merged/dev'
mount -t tmpfs -o mode=755 tmpfs '$root.merged/dev/infiniband' 2>/dev/null ||
    { mkdir -p '$root.merged/dev/infiniband'; mount -t tmpfs -o mode=755 tmpfs '$root.merged/dev/infiniband'; }
mount -t tmpfs -o mode=755 tmpfs '$root.merged/run'
mount -t tmpfs -o mode=1777 tmpfs '$root.merged/tmp'
mkdir -p '$root.merged/debs'
cp '$work'/*.deb '$work/in-chroot.sh' '$root.merged/debs/'
chroot '$root.merged' bash /debs/in-chroot.sh
" || fail "installing, using or purging the packages in the chroot failed (above)"
echo "  installed, served a and b, ib_write_bw passed, purged: nothing left behind"
echo "package: ok"
