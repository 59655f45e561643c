#!/usr/bin/env bash
# The configuration file (vrdma-shim --config FILE) and its reload
# (vrdmactl reload, SIGHUP), while a checked ping-pong between guests a and
# b runs all along:
#   1. the shim serves the file's guests; the command line overrides the
#      file (b's weight); a wrong file is refused naming the file and line.
#   2. reload: a guest added to the file is served, a weight change
#      applies; a guest added by vrdmactl guest add is left alone.
#   3. reload: a guest taken out of the file is removed; a changed run
#      directory and a changed partition of a running guest are refused
#      with the reason (exit 1), and the rest still applies.
#   4. SIGHUP reloads; a broken file changes nothing (exit 1).
#   5. a restart serves the guests of the file again.
# The a-b ping-pong must pass: nothing else was disturbed.
source "$(dirname "$0")/lib.sh"
RUN_DIR="$(mktemp -d "/tmp/vrdma-$TEST_NAME.XXXXXX")"
SHIM_LOG="$RUN_DIR.log"
conf="$RUN_DIR.toml"
ctl() { "$VRDMACTL" --run-dir "$RUN_DIR" "$@"; }
write_conf() {  # write_conf EXTRA_GUEST_TABLES...
    {
        echo "run-dir = \"$RUN_DIR\""
        echo "lid-count = 8"
        echo "[quota]"
        echo "qp = 256"
        printf '[[guest]]\nname = "a"\nweight = %s\n' "${A_WEIGHT:-1}"
        printf '[[guest]]\nname = "b"\n'
        for g in "$@"; do printf '%b\n' "$g"; done
    } >"$conf"
}
start_with_conf() {
    "$SHIM" --config "$conf" --guest b:weight=2 >>"$SHIM_LOG" 2>&1 &
    SHIM_PID=$!
    for _ in $(seq 1 100); do
        [ "$(head -n1 "$RUN_DIR/ready" 2>/dev/null)" = "$SHIM_PID" ] && return 0
        kill -0 "$SHIM_PID" 2>/dev/null || { cat "$SHIM_LOG" >&2; fail "the shim exited during start"; }
        sleep 0.1
    done
    fail "the shim is not ready after 10 s"
}
trap stop_shim EXIT

note "1. the file's guests, the command line's override, a wrong file"
printf 'run-dir = "%s"\n[[guest]]\nname = "a"\nowner = [1]\n' "$RUN_DIR" >"$conf"
rc=0
"$SHIM" --config "$conf" >"$RUN_DIR.bad" 2>&1 || rc=$?
sed 's/^/  | /' "$RUN_DIR.bad"
[ "$rc" -eq 2 ] && grep -q "config $conf: .*'owner' wants a string or a number" "$RUN_DIR.bad" &&
    grep -q ' 4 | owner = \[1\]' "$RUN_DIR.bad" || fail "a wrong file was not refused naming the file and line"
write_conf
start_with_conf
grep -m1 'ready:' "$SHIM_LOG" | sed 's/^/  /'
ctl load | grep -E '^guest ' | sed 's/^/  load| /'
ctl load | grep -q '^guest b .*weight 2' || fail "the command line's --guest b:weight=2 did not override the file"
pingpong_start ab 27515 -c -s 4096 -n 10000

note "2. reload: c added to the file, a's weight changed; e (vrdmactl guest add) stays"
ctl guest add e >/dev/null || fail "vrdmactl guest add e"
A_WEIGHT=3 write_conf '[[guest]]\nname = "c"'
out="$(ctl reload)" || fail "reload failed: $out"
echo "$out" | sed 's/^/  reload| /'
grep -qE '^added guest c lid [0-9]+ worker [0-9]+$' <<<"$out" || fail "reload did not add c"
grep -qx 'weight a 3' <<<"$out" || fail "reload did not change a's weight"
in_guest c ibv_devinfo | grep -q PORT_ACTIVE || fail "guest c does not work"
ctl load | grep -q '^guest a .*weight 3' || fail "a's weight is not 3"
[ -S "$RUN_DIR/e/vrdma.sock" ] || fail "the reload removed guest e, which the file never named"

note "3. reload: c taken out; a new run directory and a's partitions refused"
A_WEIGHT=3 write_conf
sed -i "s|^run-dir = .*|run-dir = \"$RUN_DIR.other\"|" "$conf"
sed -i 's/^name = "a"$/name = "a"\npkeys = ["0x8002"]/' "$conf"
rc=0
out="$(ctl reload 2>&1)" || rc=$?
echo "$out" | sed 's/^/  reload| /'
[ "$rc" -eq 1 ] || fail "a reload with changes that need a restart exited $rc, not 1"
grep -q 'removed c' <<<"$out" || fail "reload did not remove c"
grep -q 'refused: --run-dir changed: it needs a restart' <<<"$out" || fail "the run directory change was not refused"
grep -q 'refused: guest a: its owner, group, partitions' <<<"$out" || fail "a's partition change was not refused"
[ -e "$RUN_DIR/c" ] && fail "guest c's directory is still there"
[ -e "$RUN_DIR.other" ] && fail "the refused run directory was created"

note "4. SIGHUP adds d; a broken file changes nothing"
A_WEIGHT=3 write_conf '[[guest]]\nname = "d"'
kill -HUP "$SHIM_PID"
for _ in $(seq 1 50); do [ -S "$RUN_DIR/d/vrdma.sock" ] && break; sleep 0.1; done
[ -S "$RUN_DIR/d/vrdma.sock" ] || { tail "$SHIM_LOG"; fail "SIGHUP did not add d"; }
grep 'reload of' "$SHIM_LOG" | tail -n 1 | sed 's/^/  shim| /'
echo 'workers = ' >>"$conf"
rc=0
out="$(ctl reload 2>&1)" || rc=$?
echo "$out" | head -n 2 | sed 's/^/  reload| /'
[ "$rc" -eq 1 ] && grep -q 'nothing changed' <<<"$out" || fail "a broken file was not refused ($rc)"
[ -S "$RUN_DIR/d/vrdma.sock" ] || fail "the broken file's reload removed d"

note "the a-b ping-pong passed throughout"
pingpong_wait ab

note "5. a restart serves the file's guests again"
kill -TERM "$SHIM_PID"
wait "$SHIM_PID" || fail "the shim exited $? on SIGTERM"
A_WEIGHT=3 write_conf '[[guest]]\nname = "d"'
start_with_conf
line="$(grep 'ready:' "$SHIM_LOG" | tail -n 1)"
echo "  $line"
for g in a b d; do grep -q " $g(lid " <<<"$line" || fail "the restarted shim does not serve $g"; done
rm -f "$conf" "$RUN_DIR.bad"
echo "config_reload: ok"
