#!/usr/bin/env bash
# The host's files (docs/reliability.md "The host's files"): each attack of
# a hostile local user on the run directory, run as that user (made with
# useradd, removed afterwards), with the victim checked afterwards.
#   1. A guest's owner cannot rename, replace or add anything in its guest's
#      published tree (only its socket is its own), so `vrdmactl port` can
#      only write where the shim means to; a root-only victim directory
#      stays untouched.
#   2. A stale run directory of the old layout, whose guest directory the
#      owner could fill with links to the victim, is cleaned at start-up
#      without following one.
#   3. A run directory pre-created by another user under /tmp, with a forged
#      guest directory and a listener of that user's: the shim refuses to
#      serve it (naming the directory and the owner), and neither vrdma-run
#      nor the provider (a forged SYSFS_PATH) hands the listener anything:
#      it records every message and fd it receives.
#   4. A run directory under a directory others may write without the
#      sticky bit is refused, naming it and its mode.
# Needs root (useradd); exits 77 otherwise.
source "$(dirname "$0")/lib.sh"
[ "$(id -u)" -eq 0 ] || { echo "needs root (useradd)"; exit 77; }
command -v useradd >/dev/null || { echo "no useradd"; exit 77; }

user="vrdmah$$"
useradd --system --no-create-home --shell /usr/sbin/nologin "$user" || fail "useradd $user"
scratch="$(mktemp -d /tmp/vrdma-host_files-scratch.XXXXXX)"
chmod 755 "$scratch"
forged="/tmp/vrdma-forged.$$"
listener_pid=""
cleanup() {
    [ -n "$listener_pid" ] && kill "$listener_pid" 2>/dev/null
    pkill -KILL -u "$user" 2>/dev/null  # the forged listener under runuser
    userdel "$user" 2>/dev/null || true
    rm -rf "$scratch" "$forged"
}
start_shim a "b:owner=$user"
trap 'rc=$?; cleanup; (exit $rc); stop_shim' EXIT
chmod 755 "$RUN_DIR"
as_user() { runuser -u "$user" -- "$@"; }
victim="$scratch/victim"  # root-only, as /root or /etc would be
mkdir -m 700 "$victim"
echo precious >"$victim/keep"
check_victim() {
    [ "$(cat "$victim/keep")" = precious ] || fail "the victim file changed"
    local n
    n="$(find "$victim" -mindepth 1 | wc -l)"
    [ "$n" -eq 1 ] || { find "$victim" -ls; fail "files appeared in the victim directory ($1)"; }
}

note "1. guest b's owner cannot touch its published tree; vrdmactl port writes only where it should"
ls -ld "$RUN_DIR/b" "$RUN_DIR/b/sys" "$RUN_DIR/b/vrdma.sock" | sed 's/^/  /'
[ "$(stat -c '%U %a' "$RUN_DIR/b")" = "root 755" ] || fail "guest b's directory is not root's, mode 0755"
[ "$(stat -c '%U %a' "$RUN_DIR/b/vrdma.sock")" = "$user 600" ] || fail "guest b's socket is not $user's, mode 0600"
port="$RUN_DIR/b/sys/class/infiniband/vrdma0/ports/1"
for attempt in "mv $RUN_DIR/b/sys $RUN_DIR/b/sys.old" \
    "ln -s $victim $RUN_DIR/b/sys2" \
    "mv $port $port.old" \
    "ln -sfn $victim $RUN_DIR/b/sys/class/infiniband/vrdma0/ports" \
    "rm -f $RUN_DIR/b/vrdma.sock" \
    "chmod 777 $RUN_DIR/b"; do
    # shellcheck disable=SC2086
    if as_user $attempt 2>/dev/null; then fail "$user could: $attempt"; fi
done
echo "  six attempts to rename, replace or add refused"
"$VRDMACTL" --run-dir "$RUN_DIR" port b down
grep -q DOWN "$port/state" || fail "port b's state is not DOWN"
"$VRDMACTL" --run-dir "$RUN_DIR" port b up
grep -q ACTIVE "$port/state" || fail "port b's state is not ACTIVE again"
check_victim "after vrdmactl port"
as_user "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- ibv_devinfo | grep -q PORT_ACTIVE ||
    fail "$user cannot use its own guest b"

note "2. a stale run directory whose guest directory holds links to the victim is cleaned without following them"
stale="$scratch/stale"
mkdir -p "$stale/b/sys/class/infiniband"
ln -s "$victim" "$stale/b/sys/class/infiniband/vrdma0"
ln -s "$victim" "$stale/b/link"
ln -s "$victim/keep" "$stale/b/keep"
chown -R "$user" "$stale/b"
chmod 700 "$stale/b"
"$SHIM" --run-dir "$stale" --guest "b:owner=$user" >"$scratch/stale.log" 2>&1 &
stale_pid=$!
for _ in $(seq 1 100); do [ -e "$stale/ready" ] && break; sleep 0.1; done
[ -e "$stale/ready" ] || { cat "$scratch/stale.log"; fail "the shim did not start on the stale run directory"; }
[ "$(stat -c '%U' "$stale/b")" = root ] || fail "the stale guest directory was not replaced"
[ -L "$stale/b/link" ] && fail "the stale link is still there"
kill -TERM "$stale_pid"
wait "$stale_pid" || fail "the shim on the stale run directory exited $?"
[ -e "$stale/b" ] && fail "the shim left $stale/b behind"
check_victim "after the stale cleanup"

note "3. a run directory pre-created by $user under /tmp, with a forged guest a"
as_user mkdir -m 755 "$forged"
as_user mkdir -m 755 "$forged/a"
received="$scratch/received"
touch "$received"
chown "$user" "$received"
# The forged shim: accepts and records each message and each fd it gets.
as_user python3 -c "
import array, os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind('$forged/a/vrdma.sock'); os.chmod('$forged/a/vrdma.sock', 0o666); s.listen(8)
out = open('$received', 'a', buffering=1)
print('listening', file=out)
while True:
    c, _ = s.accept()
    print('accepted', file=out)
    c.settimeout(2)
    try:
        while True:
            msg, anc, _, _ = c.recvmsg(4096, socket.CMSG_SPACE(16 * 4))
            if not msg and not anc: break
            fds = sum(len(d) // 4 for l, t, d in anc if t == socket.SCM_RIGHTS)
            print('message %d bytes %d fds' % (len(msg), fds), file=out)
    except Exception:
        pass
    c.close()
" &
listener_pid=$!
for _ in $(seq 1 50); do grep -q listening "$received" && break; sleep 0.1; done
rc=0
"$SHIM" --run-dir "$forged" --guest a >"$scratch/forged-shim.log" 2>&1 || rc=$?
sed 's/^/  shim| /' "$scratch/forged-shim.log"
[ "$rc" -ne 0 ] || fail "the shim served a run directory $user owns"
grep -q "refusing run directory $forged: $forged belongs to uid $(id -u "$user") ($user)" "$scratch/forged-shim.log" ||
    fail "the shim did not name the directory and its owner"
rc=0
"$VRDMA_RUN" --run-dir "$forged" --guest a -- ibv_devinfo >"$scratch/run.out" 2>&1 || rc=$?
sed 's/^/  vrdma-run| /' "$scratch/run.out"
[ "$rc" -eq 5 ] || fail "vrdma-run into the forged run directory exited $rc, not 5"
grep -q "not attaching to guest 'a': $forged/a belongs to uid $(id -u "$user")" "$scratch/run.out" ||
    fail "vrdma-run did not say why"
# The provider on its own: guest a's real environment, but a forged device
# tree whose socket attribute leads to the forged listener.
as_user cp -r "$RUN_DIR/a/sys" "$forged/a/sys"
as_user sh -c "echo $forged/a/vrdma.sock > $forged/a/sys/class/infiniband/vrdma0/vrdma_socket"
rc=0
(eval "$("$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a --print-env)" && SYSFS_PATH="$forged/a/sys" ibv_devinfo) \
    >"$scratch/provider.out" 2>&1 || rc=$?
sed 's/^/  ibv_devinfo| /' "$scratch/provider.out"
grep -q "libvrdma: error: not attaching to $forged/a/vrdma.sock: $forged/a belongs to uid $(id -u "$user")" \
    "$scratch/provider.out" || fail "the provider did not refuse the forged socket with the reason"
grep -q PORT_ACTIVE "$scratch/provider.out" && fail "the provider opened the forged device"
# VRDMA_LOG_LEVEL=none silences the provider's messages, not its refusal.
(eval "$("$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a --print-env)" &&
    VRDMA_LOG_LEVEL=none SYSFS_PATH="$forged/a/sys" ibv_devinfo) >"$scratch/provider-quiet.out" 2>&1 || true
grep -q "libvrdma" "$scratch/provider-quiet.out" && fail "VRDMA_LOG_LEVEL=none: the provider still printed"
grep -q PORT_ACTIVE "$scratch/provider-quiet.out" && fail "the provider opened the forged device (quiet)"
sed 's/^/  forged listener| /' "$received"
grep -q "accepted\|message" "$received" && fail "the forged listener got a connection or a message"

note "4. a run directory under a directory others may write, without the sticky bit"
loose="$scratch/loose"
mkdir -m 777 "$loose"
rc=0
"$SHIM" --run-dir "$loose/run" --guest a >"$scratch/loose.log" 2>&1 || rc=$?
sed 's/^/  shim| /' "$scratch/loose.log"
[ "$rc" -ne 0 ] || fail "the shim served a run directory under a directory others may write"
grep -q "$loose has mode 0777" "$scratch/loose.log" || fail "the shim did not name the directory and its mode"
[ -e "$loose/run" ] && fail "the shim created $loose/run before refusing"
check_victim "at the end"
echo "host_files: ok"
