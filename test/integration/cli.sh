#!/usr/bin/env bash
# The command-line contract of vrdma-shim, vrdma-run and vrdmactl: --help,
# one clear line and a non-zero exit for wrong usage or a missing shim, and a
# clean shutdown that removes everything the shim published.
source "$(dirname "$0")/lib.sh"

expect_fail() {  # expect_fail CODE PATTERN CMD...
    local code="$1" pattern="$2"
    shift 2
    local out rc=0
    out="$("$@" 2>&1)" || rc=$?
    echo "\$ $* -> $rc: $out"
    [ "$rc" -eq "$code" ] || fail "'$*' exited $rc, expected $code"
    grep -Eq "$pattern" <<<"$out" || fail "'$*' said '$out', expected /$pattern/"
}

"$SHIM" --help | grep >/dev/null -- '--run-dir' || fail "vrdma-shim --help does not explain --run-dir"
"$VRDMA_RUN" --help | grep >/dev/null -- '--guest' || fail "vrdma-run --help does not explain --guest"
"$VRDMA_BUILD_DIR/tools/vrdmactl" --help | grep >/dev/null 'list' || fail "vrdmactl --help"

expect_fail 2 'unknown (argument|option)' "$SHIM" --bogus
expect_fail 2 'guest' "$SHIM" --run-dir /tmp/vrdma-cli-none
expect_fail 2 'guest' "$SHIM" --run-dir /tmp/vrdma-cli-none --guest 'bad/name'
expect_fail 2 'rkey-guess-limit must be 0..1000000' "$SHIM" --run-dir /tmp/vrdma-cli-none --guest a --rkey-guess-limit many
expect_fail 2 'qkey-guess-limit must be 0..1000000' "$SHIM" --run-dir /tmp/vrdma-cli-none --guest a --qkey-guess-limit 1000001
expect_fail 2 'hca-local needs --hca' "$SHIM" --run-dir /tmp/vrdma-cli-none --guest a --hca-local
expect_fail 1 '^vrdma-shim: --hca: (no RDMA device named nosuch0|cannot list RDMA devices)' "$SHIM" --run-dir /tmp/vrdma-cli-none --guest a --hca nosuch0
# Workers (docs/protocol.md "Workers"): counts, placements and CPUs checked.
expect_fail 2 'workers must be 1..64' "$SHIM" --run-dir /tmp/vrdma-cli-none --guest a --workers 0
expect_fail 2 'the shim has 2 workers' "$SHIM" --run-dir /tmp/vrdma-cli-none --guest a:worker=2 --workers 2
# (--workers with --hca is accepted: each worker opens the device; a
# missing one fails as above.)
expect_fail 1 '^vrdma-shim: --hca: (no RDMA device named nosuch0|cannot list RDMA devices)' "$SHIM" --run-dir /tmp/vrdma-cli-none --guest a --workers 2 --hca nosuch0
expect_fail 2 'names 1 CPU for 2 workers' "$SHIM" --run-dir /tmp/vrdma-cli-none --guest a --workers 2 --worker-cpus 0
expect_fail 2 'worker-cpus wants CPU numbers' "$SHIM" --run-dir /tmp/vrdma-cli-none --guest a --worker-cpus 1-0
expect_fail 2 'is not one this process may run on' "$SHIM" --run-dir /tmp/vrdma-cli-none --guest a --worker-cpus 4095
expect_fail 2 'idle-yield must be auto or always' "$SHIM" --run-dir /tmp/vrdma-cli-none --guest a --idle-yield sometimes
expect_fail 2 'no guest' "$VRDMA_RUN" --run-dir /tmp/vrdma-cli-none -- true
expect_fail 2 'no program' "$VRDMA_RUN" --run-dir /tmp/vrdma-cli-none --guest a
expect_fail 3 'is vrdma-shim running' "$VRDMA_RUN" --run-dir /tmp/vrdma-cli-none --guest a -- true

start_shim a b
expect_fail 3 "no guest 'c'" "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest c -- true
expect_fail 127 'cannot run' "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- /nonexistent/program
in_guest a true || fail "vrdma-run of true failed"
# Several guests: each must exist, none twice; --print-env takes one.
expect_fail 3 "no guest 'c'" "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a --guest c -- true
expect_fail 2 "given twice" "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a,b,a -- true
expect_fail 2 "invalid guest name" "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a, -- true
expect_fail 2 "print-env takes one guest" "$VRDMA_RUN" --print-env --run-dir "$RUN_DIR" --guest a --guest b
expect_fail 127 'cannot run' "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a --guest b -- /nonexistent/program
"$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a --guest b -- sh -c 'exit 7' && rc=0 || rc=$?
[ "$rc" -eq 7 ] || fail "vrdma-run with two guests did not pass on the program's exit status (got $rc)"
# A second shim on the same run directory is refused while the first lives.
expect_fail 1 'already' "$SHIM" --run-dir "$RUN_DIR" --guest a
"$VRDMA_BUILD_DIR/tools/vrdmactl" --run-dir "$RUN_DIR" status | tee /dev/stderr | grep >/dev/null 'a .*answering' ||
    fail "vrdmactl status does not show guest a answering"
grep -q 'ready: guests a(lid 1) b(lid 2)' "$SHIM_LOG" || fail "shim did not print its ready line"
dev_a="$(ls "$RUN_DIR/a/sys/class/infiniband_verbs/" | grep '^uverbs_vrdma_a_')" || fail "no uverbs entry for guest a"
[ "$(readlink "/dev/infiniband/$dev_a")" = /dev/null ] || fail "no /dev/infiniband/$dev_a link to /dev/null"

# Clean shutdown removes the tree, the sockets and the /dev nodes.
kill -TERM "$SHIM_PID"
wait "$SHIM_PID" || fail "shim exited non-zero on SIGTERM"
[ -z "$(ls -A "$RUN_DIR")" ] || fail "shim left files in $RUN_DIR: $(ls -A "$RUN_DIR")"
! ls /dev/infiniband/ | grep >/dev/null "^$dev_a\$" || fail "shim left /dev/infiniband/$dev_a"
expect_fail 3 'not answering|does not serve|no guest' "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- true
SHIM_PID=""
echo "cli: ok"
