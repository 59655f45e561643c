# Shared helpers for the integration tests: start a real vrdma-shim in a
# private run directory, run real clients in its guests, stop it cleanly.
# Needs VRDMA_BUILD_DIR (set by ctest).
set -euo pipefail

: "${VRDMA_BUILD_DIR:?set VRDMA_BUILD_DIR to the build directory}"
SHIM="$VRDMA_BUILD_DIR/src/shim/vrdma-shim"
VRDMA_RUN="$VRDMA_BUILD_DIR/tools/vrdma-run"
TEST_NAME="$(basename "$0" .sh)"
RUN_DIR=""
SHIM_PID=""
SHIM_LOG=""

fail() {
    echo "FAIL: $TEST_NAME: $*" >&2
    exit 1
}

note() { echo "--- $*"; }

# start_shim GUEST... : starts the shim serving these guests, waits for ready.
start_shim() {
    RUN_DIR="$(mktemp -d "/tmp/vrdma-$TEST_NAME.XXXXXX")"
    SHIM_LOG="$RUN_DIR.log"
    local args=()
    for g in "$@"; do args+=(--guest "$g"); done
    "$SHIM" --run-dir "$RUN_DIR" "${args[@]}" >"$SHIM_LOG" 2>&1 &
    SHIM_PID=$!
    trap stop_shim EXIT
    for _ in $(seq 1 100); do
        [ -e "$RUN_DIR/ready" ] && return 0
        kill -0 "$SHIM_PID" 2>/dev/null || { cat "$SHIM_LOG" >&2; fail "shim exited during start"; }
        sleep 0.1
    done
    cat "$SHIM_LOG" >&2
    fail "shim not ready after 10 s"
}

# stop_shim: SIGTERM, expect exit 0 and everything it published removed.
stop_shim() {
    local rc=$?
    trap - EXIT
    jobs -p | grep -v "^$SHIM_PID\$" | xargs -r kill 2>/dev/null || true
    if [ -n "$SHIM_PID" ] && kill -0 "$SHIM_PID" 2>/dev/null; then
        kill -TERM "$SHIM_PID"
        local shim_rc=0
        wait "$SHIM_PID" || shim_rc=$?
        if [ "$shim_rc" -ne 0 ]; then
            echo "shim exited with $shim_rc; its log:" >&2
            cat "$SHIM_LOG" >&2
            [ "$rc" -eq 0 ] && rc=1
        fi
    fi
    if [ -n "$RUN_DIR" ] && [ -e "$RUN_DIR/ready" ]; then
        echo "shim left $RUN_DIR/ready behind" >&2
        [ "$rc" -eq 0 ] && rc=1
    fi
    if [ "$rc" -ne 0 ] && [ -n "$SHIM_LOG" ] && [ -e "$SHIM_LOG" ]; then
        echo "--- shim log:" >&2
        tail -n 50 "$SHIM_LOG" >&2
    fi
    [ -n "$RUN_DIR" ] && rm -rf "$RUN_DIR" "$SHIM_LOG"
    exit "$rc"
}

# in_guest NAME CMD... : run CMD attached to guest NAME's device.
in_guest() {
    local g="$1"
    shift
    "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest "$g" -- "$@"
}

# wait_port PORT : until something listens on TCP PORT (10 s).
wait_port() {
    for _ in $(seq 1 200); do
        ss -ltnH "sport = :$1" | grep >/dev/null . && return 0
        sleep 0.05
    done
    fail "nothing listens on port $1"
}

# client_server LIMIT PORT "SERVER CMD" "CLIENT CMD": the server runs in guest
# a, the client in guest b; both must exit 0 within LIMIT seconds. Output of
# both goes to stdout, prefixed.
client_server() {
    local limit="$1" port="$2" server="$3" client="$4"
    local out="$RUN_DIR.out.$port"
    # shellcheck disable=SC2086
    timeout "$limit" "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- $server >"$out.server" 2>&1 &
    local spid=$!
    wait_port "$port"
    local crc=0 src=0
    # shellcheck disable=SC2086
    timeout "$limit" "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- $client >"$out.client" 2>&1 || crc=$?
    wait "$spid" || src=$?
    sed 's/^/  server| /' "$out.server"
    sed 's/^/  client| /' "$out.client"
    rm -f "$out.server" "$out.client"
    [ "$src" -eq 0 ] || fail "server '$server' exited with $src"
    [ "$crc" -eq 0 ] || fail "client '$client' exited with $crc"
}
