#!/usr/bin/env bash
# Guest ownership (docs/reliability.md "What a tenant can do to another"):
# a local user who does not own a guest cannot use it, and vrdma-run says
# so (exit 4); the owner still can. A second user is created for the test
# and removed afterwards. Guests: a (default owner: the shim's user, root
# here), b (owner: the new user), c (owner root, but its socket's mode
# opened by hand, so that only the shim's SO_PEERCRED check stands: the
# user's 300 connections are refused at accept and never charged to c, so
# c's owner still attaches). Needs root (useradd); exits 77 otherwise.
source "$(dirname "$0")/lib.sh"
[ "$(id -u)" -eq 0 ] || { echo "needs root (useradd)"; exit 77; }
command -v useradd >/dev/null || { echo "no useradd"; exit 77; }

user="vrdmat$$"
useradd --system --no-create-home --shell /usr/sbin/nologin "$user" || fail "useradd $user"
cleanup_user() { userdel "$user" 2>/dev/null || true; }
start_shim a "b:owner=$user" c
trap 'rc=$?; cleanup_user; (exit $rc); stop_shim' EXIT
chmod 755 "$RUN_DIR"  # mktemp made it private; the guests' own modes are what is tested
as_user() { runuser -u "$user" -- "$@"; }

note "guest a belongs to root: $user is refused, with the reason and exit status 4"
rc=0
as_user "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- ibv_devinfo >"$RUN_DIR.out" 2>&1 || rc=$?
cat "$RUN_DIR.out"
[ "$rc" -eq 4 ] || fail "vrdma-run as $user in guest a exited $rc, not 4"
grep -q "access to guest 'a' refused" "$RUN_DIR.out" || fail "vrdma-run did not say why"
stat -c '%a %U' "$RUN_DIR/a" "$RUN_DIR/a/vrdma.sock"
[ "$(stat -c '%a' "$RUN_DIR/a/vrdma.sock")" = 600 ] || fail "guest a's socket is not mode 0600"
as_user python3 -c "
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    s.connect('$RUN_DIR/a/vrdma.sock')
except PermissionError:
    sys.exit(0)
sys.exit('connected to a guest it does not own')
" || fail "$user reached guest a's socket"

note "the owner (root) still uses guest a"
in_guest a ibv_devinfo | grep -q PORT_ACTIVE || fail "root cannot use guest a"

note "guest b belongs to $user: it uses it"
as_user "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- ibv_devinfo | grep -q PORT_ACTIVE ||
    fail "$user cannot use its own guest b"
[ "$(stat -c '%U' "$RUN_DIR/b/vrdma.sock")" = "$user" ] || fail "guest b's socket does not belong to $user"

note "guest c's socket opened to everyone by hand: the shim's SO_PEERCRED check refuses $user at accept"
chmod 755 "$RUN_DIR/c"
chmod 666 "$RUN_DIR/c/vrdma.sock"
as_user python3 -c "
import socket, struct, sys, time
socks = []
for i in range(300):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect('$RUN_DIR/c/vrdma.sock')
    socks.append(s)
s = socks[0]
s.settimeout(5)
reply = s.recv(512)
magic, status = struct.unpack_from('<Ii', reply)
print('first reply: status %d, %s' % (status, reply[16:].split(b'\0')[0].decode(errors='replace')))
sys.exit(0 if status == 13 else 'not refused with EACCES')
" >"$RUN_DIR.out" 2>&1 &
flood=$!
sleep 1
note "while $user holds 300 connections to c, its owner attaches"
in_guest c ibv_devinfo | grep -q PORT_ACTIVE || fail "root cannot use guest c during the flood"
wait "$flood" || { cat "$RUN_DIR.out"; fail "the shim did not refuse $user's connections with EACCES"; }
cat "$RUN_DIR.out"
grep -m1 "refused: only" "$SHIM_LOG" || fail "no refusal in the shim's log"
n="$(grep -c 'refused: only' "$SHIM_LOG")"
echo "refusal warnings in the log: $n (rate-limited: 300 refusals)"
[ "$n" -lt 20 ] || fail "refusals not rate-limited in the log ($n lines)"
for _ in $(seq 1 20); do  # the last connections may still wait in the listen backlog
    "$VRDMACTL" --run-dir "$RUN_DIR" counters >"$RUN_DIR.out"
    grep -qE "^guest c .*refused_connections 300 throttled_requests 0( |$)" "$RUN_DIR.out" && break
    sleep 0.1
done
cat "$RUN_DIR.out"
grep -qE "^guest c .*refused_connections 300 throttled_requests 0( |$)" "$RUN_DIR.out" || fail "vrdmactl counters does not show c's 300 refusals"
rm -f "$RUN_DIR.out"
echo "tenant_access: ok"
