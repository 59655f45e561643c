#!/usr/bin/env bash
# rdma-core's own verbs test suite (tests/ of the rdma-core source at the
# version Debian ships, installed by python3-pyverbs under
# /usr/share/doc/rdma-core/tests, partly gzipped), run by its run_tests.py
# against vrdma0 in guest a: the tests rdma-core runs against rxe and real
# devices. Fails on any failure or error, on fewer passes than today's
# (RDMA_CORE_MIN_PASSED), and on a skip whose reason is not one of those
# docs/rdma-core-tests.md lists (a feature of other hardware, or one vrdma
# does not offer yet): a test that starts skipping for a new reason is a
# regression until the list says why.
#
# In the two-hosts topology (integration.fabric.rdma_core_tests) the suite
# runs across the TCP fabric: guest a on one host, b on the other, and a
# copy of the suite patched by rdma_core_across_hosts.py puts the two
# players of each test on the two (docs/rdma-core-tests.md says how).
source "$(dirname "$0")/lib.sh"
suite_src=/usr/share/doc/rdma-core/tests
python=/usr/bin/python3  # Debian's, where pyverbs is installed
[ -f "$suite_src/run_tests.py" ] || { echo "no $suite_src (apt-get install python3-pyverbs)"; exit 77; }
"$python" -c 'import pyverbs' 2>/dev/null || { echo "no pyverbs for $python"; exit 77; }
across=false
[ "$VRDMA_TOPOLOGY" = two-hosts ] && across=true
# 10.0.0.1: guest a's address for rdma_cm, which test_rdmacm.py reads as
# the address of vrdma0's network interface (below).
min_passed="${RDMA_CORE_MIN_PASSED:-149}"
if $across; then
    start_shim a:ip=10.0.0.1 b:ip=10.0.0.2
    GUEST_ARGS="--guest a --guest b"
    export VRDMA_SUITE_DEVICES=vrdma0,vrdma1
else
    start_shim a:ip=10.0.0.1
    GUEST_ARGS="--guest a"
fi
# The suite's huge-page tests want 2 MiB pages (scripts/test.sh reserves
# them for the whole run; alone, this does, and gives them back).
source "$(dirname "$0")/../../scripts/lib/huge_pages.sh"
reserve_huge_pages 8 >/dev/null
trap 'rc=$?; release_huge_pages; (exit $rc); stop_shim' EXIT
suite="$RUN_DIR.suite"
cp -r "$suite_src" "$suite"
gunzip -f "$suite"/*.gz
$across && { python3 "$(dirname "$0")/rdma_core_across_hosts.py" "$suite" || fail "could not patch the suite"; }
rc=0
# test_rdmacm.py finds the device's IP address by reading the real
# /sys/class/infiniband/DEV/device/net/ (not SYSFS_PATH) for an interface
# name, then `ip addr show` of it. As root, the suite runs in a private
# mount and network namespace where that directory names vrdma_a, a veth
# holding guest a's address, 10.0.0.1 (a tmpfs hides the host's
# /sys/class there; the shim's sockets are files, reached from any
# namespace). Without root, those tests skip ("doesn't have net
# interface").
# (test_rdmacm.py uses vrdma0 for both ends: across the fabric too, its
# connections stay on host 1; integration.fabric.rdma_cm crosses.)
run_suite() {
    # shellcheck disable=SC2086  # GUEST_ARGS: one word per argument
    timeout 300 "$VRDMA_RUN" --run-dir "$RUN_DIR" $GUEST_ARGS -- "$python" "$suite/run_tests.py" --dev vrdma0 -v
}
if [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null; then
    export -f run_suite
    export VRDMA_RUN RUN_DIR python suite GUEST_ARGS VRDMA_SUITE_DEVICES
    unshare -m -n bash -c '
        set -e
        ip link set lo up
        ip link add vrdma_a type veth peer name vrdma_a_peer
        ip addr add 10.0.0.1/24 dev vrdma_a
        ip link set vrdma_a up
        ip link set vrdma_a_peer up
        mount -t tmpfs vrdma-sys-class /sys/class
        mkdir -p /sys/class/infiniband/vrdma0/device/net/vrdma_a
        run_suite' >"$RUN_DIR.out" 2>&1 || rc=$?
else
    run_suite >"$RUN_DIR.out" 2>&1 || rc=$?
fi
grep -E '^(ERROR|FAIL):' -A12 "$RUN_DIR.out" || true
ran="$(sed -nE 's/^Ran ([0-9]+) tests.*/\1/p' "$RUN_DIR.out")"
# unittest's own summary ("OK (skipped=178)", "FAILED (failures=1, ...)").
summary="$(grep -E '^(OK|FAILED)( |$)' "$RUN_DIR.out" | tail -n1)"
skipped="$(sed -nE 's/.*skipped=([0-9]+).*/\1/p' <<<"$summary")"
skipped="${skipped:-0}"
failed="$(grep -cE '^(ERROR|FAIL):' "$RUN_DIR.out" || true)"
passed=$((${ran:-0} - skipped - failed))
echo "rdma-core tests: ran ${ran:-0}, passed $passed, failed or errors $failed, skipped $skipped (exit $rc)"
echo "skips by reason:"
# unittest quotes a reason in single quotes, or in double quotes when it
# holds an apostrophe.
skip_reasons() { grep -oE "\.\.\. skipped ('[^']*'|\"[^\"]*\")$" "$RUN_DIR.out" | sed -E "s/^\.\.\. skipped //"; }
skip_reasons | sort | uniq -c | sort -rn | sed 's/^/  /'
# Every skip reason must be one the docs explain.
docs="$(dirname "$0")/../../docs/rdma-core-tests.md"
allowed="$(sed -nE -e "s/^\| *'([^']*)' *\|.*/\1/p" -e 's/^\| *"([^"]*)" *\|.*/\1/p' "$docs")"
unexplained=0
while IFS= read -r reason; do
    [ -n "$reason" ] || continue
    if ! grep -qxF -- "$reason" <<<"$allowed"; then
        echo "  a skip not in docs/rdma-core-tests.md: '$reason'" >&2
        unexplained=1
    fi
done < <(skip_reasons | sed -E "s/^['\"](.*)['\"]$/\1/" | sort -u)
rm -rf "$suite"
[ -n "$ran" ] || { tail -30 "$RUN_DIR.out" >&2; fail "the suite did not finish"; }
[ "$failed" -eq 0 ] && [ "$rc" -eq 0 ] || fail "$failed tests failed or ended in errors"
[ "$passed" -ge "$min_passed" ] || fail "only $passed tests passed (at least $min_passed did before)"
[ "$unexplained" -eq 0 ] || fail "tests skipped for reasons docs/rdma-core-tests.md does not give"
if $across; then
    # The players were on two hosts: their traffic crossed the fabric.
    msgs="$(host_ctl 2 peers | sed -nE 's/.* rx_msgs ([0-9]+) .*/\1/p' | head -n1)"
    echo "fabric messages received by host 2 during the suite: ${msgs:-0}"
    [ "${msgs:-0}" -ge 10000 ] || fail "the suite's traffic did not cross the fabric (${msgs:-0} messages)"
fi
echo "rdma_core_tests: ok"
