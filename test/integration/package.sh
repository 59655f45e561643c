#!/usr/bin/env bash
# The operator's install: the Debian package (cpack -G DEB in the build
# directory) and the systemd service in it.
#   1. The package holds the shim, the tools, the provider where libibverbs
#      loads providers with its .driver file, the unit and the example
#      configuration (a conffile), and depends on libibverbs1 and libssl3.
#   2. The unit passes systemd-analyze verify (where systemd is there).
#   3. The packaged binaries work from the unpacked package: its shim runs
#      the packaged configuration (run directory moved by the command line)
#      under a stand-in service manager that reads $NOTIFY_SOCKET, which
#      gets READY=1 once the guest is published, RELOADING=1 then READY=1
#      on SIGHUP (as systemctl reload sends), STOPPING=1 on SIGTERM; and
#      ibv_devinfo through the packaged provider sees vrdma0 active.
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

note "1. cpack -G DEB"
(cd "$VRDMA_BUILD_DIR" && cpack -G DEB -B "$work/out" >"$work/cpack.log" 2>&1) ||
    { cat "$work/cpack.log"; fail "cpack failed"; }
deb="$(ls "$work"/out/vrdma_*_amd64.deb)"
echo "  $(basename "$deb"): $(du -k "$deb" | cut -f1) KiB"
dpkg-deb -c "$deb" | awk '{print $6}' >"$work/files"
libdir="$(dirname "$(grep -m1 'libvrdma-rdmav34.so$' "$work/files")")"
libdir="${libdir#.}"  # /usr/lib/ARCH/libibverbs
for f in ./usr/bin/vrdma-shim ./usr/bin/vrdma-run ./usr/bin/vrdmactl ./usr/bin/vrdma-mpirun \
    ".$libdir/libvrdma-rdmav34.so" ./etc/libibverbs.d/vrdma.driver ./usr/lib/systemd/system/vrdma-shim.service \
    ./etc/vrdma/shim.toml; do
    grep -qxF "$f" "$work/files" || fail "the package has no $f"
done
case "$libdir" in /usr/lib/*/libibverbs) ;; *) fail "the provider is in $libdir, not libibverbs' directory" ;; esac
depends="$(dpkg-deb -f "$deb" Depends)"
echo "  Depends: $depends"
grep -q 'libibverbs1' <<<"$depends" && grep -q 'libssl3' <<<"$depends" || fail "the package's dependencies miss libibverbs1 or libssl3"
dpkg-deb -e "$deb" "$work/control"
grep -qx /etc/vrdma/shim.toml "$work/control/conffiles" || fail "/etc/vrdma/shim.toml is not a conffile"
root="$work/root"
dpkg-deb -x "$deb" "$root"

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
NOTIFY_SOCKET="$notify" "$root/usr/bin/vrdma-shim" --config "$root/etc/vrdma/shim.toml" --run-dir "$work/run" \
    >"$work/shim.log" 2>&1 &
shim_pid=$!
wait_notified() {  # PATTERN
    for _ in $(seq 1 100); do grep -q "$1" "$work/notified" && return 0; sleep 0.1; done
    cat "$work/notified" "$work/shim.log" >&2
    fail "the service manager was not told '$1'"
}
wait_notified '^READY=1 STATUS=serving 1 guest'
[ -S "$work/run/default/vrdma.sock" ] || fail "READY=1 came before the guest was published"
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
echo "package: ok"
