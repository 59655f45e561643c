# Shared helpers for the integration tests: start a real vrdma-shim in a
# private run directory, run real clients in its guests, stop it cleanly.
# Needs VRDMA_BUILD_DIR (set by ctest).
#
# Topologies (VRDMA_TOPOLOGY):
#   one-host   (default) one shim serves every guest.
#   two-hosts  two shims joined by the TCP fabric, each in its own network
#              namespace (a simulated host) with a veth pair between them:
#              `start_shim a b c` puts guest a on host 1 (lid-base 1) and
#              b, c on host 2 (lid-base 10). Only the shims run in the
#              namespaces; clients run here and attach through the file
#              system (run directories and UNIX sockets are not namespaced),
#              so they still exchange connection data over 127.0.0.1 and
#              cannot tell that their peer is on another "host". Needs root;
#              exits 77 (skipped) without it. See "Two hosts" below.
set -euo pipefail

: "${VRDMA_BUILD_DIR:?set VRDMA_BUILD_DIR to the build directory}"
SHIM="$VRDMA_BUILD_DIR/src/shim/vrdma-shim"
VRDMA_RUN="$VRDMA_BUILD_DIR/tools/vrdma-run"
VRDMACTL="$VRDMA_BUILD_DIR/tools/vrdmactl"
TEST_NAME="$(basename "$0" .sh)"
VRDMA_TOPOLOGY="${VRDMA_TOPOLOGY:-one-host}"
case "$VRDMA_TOPOLOGY" in
one-host | two-hosts) ;;
*) echo "VRDMA_TOPOLOGY must be one-host or two-hosts, not '$VRDMA_TOPOLOGY'" >&2; exit 2 ;;
esac
RUN_DIR=""
SHIM_PID=""
SHIM_LOG=""

fail() {
    echo "FAIL: $TEST_NAME: $*" >&2
    exit 1
}

note() { echo "--- $*"; }

# start_shim GUEST... : starts the shim serving these guests, waits for ready.
# In two-hosts mode: the fabric of two shims (fabric_start).
start_shim() {
    if [ "$VRDMA_TOPOLOGY" = two-hosts ]; then
        fabric_start "$1" "${*:2}"
        return 0
    fi
    RUN_DIR="$(mktemp -d "/tmp/vrdma-$TEST_NAME.XXXXXX")"
    SHIM_LOG="$RUN_DIR.log"
    local args=()
    for g in "$@"; do args+=(--guest "$g"); done
    # shellcheck disable=SC2086  # VRDMA_SHIM_ARGS: extra options, split on spaces
    "$SHIM" --run-dir "$RUN_DIR" "${args[@]}" ${VRDMA_SHIM_ARGS:-} >"$SHIM_LOG" 2>&1 &
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
    if [ "$VRDMA_TOPOLOGY" = two-hosts ]; then fabric_stop "$rc"; fi
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

# guest_counter GUEST NAME : counter NAME of GUEST's line in vrdmactl counters.
guest_counter() {
    "$VRDMACTL" --run-dir "$RUN_DIR" counters | awk -v g="$1" -v c="$2" '$1 == "guest" && $2 == g {
        for (i = 3; i < NF; i += 2) if ($i == c) print $(i + 1) }'
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
    local crc=0 src=0 attempt
    for attempt in 1 2; do
        crc=0 src=0
        # shellcheck disable=SC2086
        timeout "$limit" "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- $server >"$out.server" 2>&1 &
        local spid=$!
        wait_port "$port"
        # shellcheck disable=SC2086
        timeout "$limit" "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- $client >"$out.client" 2>&1 || crc=$?
        wait "$spid" || src=$?
        sed 's/^/  server| /' "$out.server"
        sed 's/^/  client| /' "$out.client"
        # perftest calibrates its cycle counter against the clock before it
        # reports and gives up ("Can't produce a report") when the samples
        # scatter, as they can on 2 busy cores: its own measurement, not
        # vrdma's transfer (which it had finished). Once more, then it counts.
        if [ "$attempt" -eq 1 ] && [ "$crc$src" != 00 ] && grep -q "Can't produce a report" "$out.client" "$out.server"; then
            note "perftest could not calibrate its clock (r^2 < 0.9): running the pair once more"
            continue
        fi
        break
    done
    rm -f "$out.server" "$out.client"
    [ "$src" -eq 0 ] || fail "server '$server' exited with $src"
    [ "$crc" -eq 0 ] || fail "client '$client' exited with $crc"
}

# ---------------------------------------------------------------------------
# Two hosts (VRDMA_TOPOLOGY=two-hosts; fault tests use the fabric_* helpers
# directly, with more guests or a third host).
#
# A host H is a network namespace vrdma-PID-hH running one vrdma-shim whose
# run directory is RUN_DIR/hH; RUN_DIR/GUEST is a symbolic link to
# RUN_DIR/hH/GUEST, so `vrdma-run --run-dir "$RUN_DIR" --guest GUEST`, in_guest
# and client_server work unchanged (vrdma-run needs only DIR/GUEST/sys and the
# socket it names). Links are veth pairs with a /30 each, taken from a /28 of
# 10.0.0.0/8 that depends on this shell's pid (runs side by side do not
# collide; the addresses exist only inside the namespaces). Every shim listens
# on ADDR:7400 and names its peers; all shims of a run share RUN_DIR/fabric.key
# unless told otherwise. Logs: RUN_DIR.hH.log. fabric_stop (the EXIT trap)
# stops every shim with SIGTERM (each must exit 0), removes the namespaces,
# the links and every file, whatever happened before.
FABRIC_PORT=7400
FABRIC_HOSTS=()            # host numbers, in creation order
declare -A HOST_NS=()      # H -> namespace
declare -A HOST_GUESTS=()  # H -> "g1 g2" (the --guest specs: NAME[:key=value...])
declare -A HOST_NAMES=()   # H -> the guests' names alone
declare -A HOST_LID=()     # H -> lid base
declare -A HOST_ADDR=()    # H -> listen address
declare -A HOST_PEERS=()   # H -> "ADDR:PORT ..."
declare -A HOST_KEY=()     # H -> key file
declare -A HOST_CRYPTO=()  # H -> --fabric-crypto (default: $VRDMA_FABRIC_CRYPTO, else the shim's)
declare -A HOST_PID=()     # H -> shim pid ("" when not running)
declare -A HOST_ARGS=()    # H -> more arguments of its shim (default: $VRDMA_SHIM_ARGS, else --workers 1)
declare -A HOST_IF=()      # H -> its interface on its first link
FABRIC_LINKS=0
FABRIC_NET=""

# The run directory, log and vrdmactl of host H.
host_run_dir() { echo "$RUN_DIR/h$1"; }
host_log() { echo "$RUN_DIR.h$1.log"; }
host_ctl() {
    local h="$1"
    shift
    "$VRDMACTL" --run-dir "$(host_run_dir "$h")" "$@"
}
# guest_run_dir NAME: the run directory of the shim that serves guest NAME.
guest_run_dir() {
    local h
    for h in "${FABRIC_HOSTS[@]}"; do
        case " ${HOST_NAMES[$h]} " in *" $1 "*) host_run_dir "$h"; return 0 ;; esac
    done
    echo "$RUN_DIR"
}
# guest_host NAME: the host number whose shim serves guest NAME.
guest_host() {
    local h
    for h in "${FABRIC_HOSTS[@]}"; do
        case " ${HOST_NAMES[$h]} " in *" $1 "*) echo "$h"; return 0 ;; esac
    done
    fail "no host serves guest $1"
}

fabric_require() {
    [ "$(id -u)" -eq 0 ] || { echo "SKIP: $TEST_NAME: two-hosts mode needs root (network namespaces)"; exit 77; }
    command -v ip >/dev/null || { echo "SKIP: $TEST_NAME: no ip(8) (apt-get install iproute2)"; exit 77; }
}

# fabric_init: the run directory, the key and the address block of this run.
fabric_init() {
    fabric_require
    [ -z "$RUN_DIR" ] || return 0
    RUN_DIR="$(mktemp -d "/tmp/vrdma-$TEST_NAME.XXXXXX")"
    SHIM_LOG="$RUN_DIR.h1.log"
    trap stop_shim EXIT
    fabric_key "$RUN_DIR/fabric.key"
    local v=$(( ($$ % 1048576) * 16 ))
    FABRIC_NET="10.$(( (v >> 16) & 255 )).$(( (v >> 8) & 255 )).$(( v & 255 ))"
}

# fabric_key FILE: 32 random bytes as one hex line, readable by root only.
fabric_key() {
    (umask 077 && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$1" && echo >>"$1")
}

# fabric_addr N: the Nth address of this run's block.
fabric_addr() {
    local a=${FABRIC_NET##*.}
    echo "${FABRIC_NET%.*}.$(( a + $1 ))"
}

# fabric_host H "GUEST..." LID_BASE: a namespace for host H (no shim yet).
fabric_host() {
    local h="$1"
    local ns="vrdma-$$-h$h"
    ip netns add "$ns" || fail "ip netns add $ns failed"
    FABRIC_HOSTS+=("$h")
    HOST_NS[$h]="$ns"
    HOST_GUESTS[$h]="$2"
    HOST_LID[$h]="$3"
    HOST_KEY[$h]="$RUN_DIR/fabric.key"
    HOST_PEERS[$h]=""
    HOST_PID[$h]=""
    ip -n "$ns" link set lo up
    mkdir -p "$(host_run_dir "$h")"
    local g
    HOST_NAMES[$h]=""
    for g in $2; do
        HOST_NAMES[$h]+=" ${g%%:*}"
        ln -sfn "h$h/${g%%:*}" "$RUN_DIR/${g%%:*}"
    done
}

# fabric_link HA HB: a veth pair between the two hosts with a /30 of its own.
# A host's first link gives its listen address; a host reached over a later
# link also routes to the other end's listen address through it.
fabric_link() {
    local ha="$1" hb="$2"
    [ "$FABRIC_LINKS" -lt 4 ] || fail "at most 4 links per run"
    local k=$FABRIC_LINKS
    FABRIC_LINKS=$((k + 1))
    local ia="vr$$l${k}a" ib="vr$$l${k}b"
    local aa ab
    aa="$(fabric_addr $((4 * k + 1)))"
    ab="$(fabric_addr $((4 * k + 2)))"
    ip link add "$ia" netns "${HOST_NS[$ha]}" type veth peer name "$ib" netns "${HOST_NS[$hb]}" ||
        fail "cannot create the veth pair $ia/$ib"
    ip -n "${HOST_NS[$ha]}" addr add "$aa/30" dev "$ia"
    ip -n "${HOST_NS[$hb]}" addr add "$ab/30" dev "$ib"
    ip -n "${HOST_NS[$ha]}" link set "$ia" up
    ip -n "${HOST_NS[$hb]}" link set "$ib" up
    local h a i
    for h in "$ha" "$hb"; do
        [ "$h" = "$ha" ] && { a="$aa"; i="$ia"; } || { a="$ab"; i="$ib"; }
        if [ -z "${HOST_ADDR[$h]:-}" ]; then
            HOST_ADDR[$h]="$a"
            HOST_IF[$h]="$i"
        fi
    done
    # Listen addresses that are not on this link: route them over it.
    [ "${HOST_ADDR[$ha]}" = "$aa" ] || ip -n "${HOST_NS[$hb]}" route add "${HOST_ADDR[$ha]}/32" via "$aa"
    [ "${HOST_ADDR[$hb]}" = "$ab" ] || ip -n "${HOST_NS[$ha]}" route add "${HOST_ADDR[$hb]}/32" via "$ab"
}

# fabric_peer H OTHER: host H's shim names OTHER's shim as a peer.
fabric_peer() {
    HOST_PEERS[$1]="${HOST_PEERS[$1]} ${HOST_ADDR[$2]}:$FABRIC_PORT"
}

# fabric_shim_cmd H: host H's shim command line, one word per line.
fabric_shim_cmd() {
    local h="$1" g p
    printf '%s\n' ip netns exec "${HOST_NS[$h]}" "$SHIM" --run-dir "$(host_run_dir "$h")"
    for g in ${HOST_GUESTS[$h]}; do printf '%s\n' --guest "$g"; done
    printf '%s\n' --lid-base "${HOST_LID[$h]}" --fabric-listen "${HOST_ADDR[$h]}:$FABRIC_PORT"
    for p in ${HOST_PEERS[$h]}; do printf '%s\n' --fabric-peer "$p"; done
    printf '%s\n' --fabric-key "${HOST_KEY[$h]}"
    # One worker unless told (the tests count the links: one per pair of
    # workers, and the default worker count follows the machine's CPUs).
    local a
    for a in ${HOST_ARGS[$h]:-${VRDMA_SHIM_ARGS:---workers 1}}; do printf '%s\n' "$a"; done
    # VRDMA_FABRIC_CRYPTO: every host's --fabric-crypto; HOST_CRYPTO[H]: one host's
    local crypto="${HOST_CRYPTO[$h]:-${VRDMA_FABRIC_CRYPTO:-}}"
    [ -z "$crypto" ] || printf '%s\n' --fabric-crypto "$crypto"
}

# fabric_shim_start H: starts host H's shim (again, after a kill: the same
# command line) and waits for its ready file to name it.
fabric_shim_start() {
    local h="$1" log
    log="$(host_log "$h")"
    local cmd=()
    mapfile -t cmd < <(fabric_shim_cmd "$h")
    echo "\$ ${cmd[*]}" >>"$log"
    "${cmd[@]}" >>"$log" 2>&1 &
    HOST_PID[$h]=$!
    local ready
    ready="$(host_run_dir "$h")/ready"
    for _ in $(seq 1 100); do
        [ "$(head -n1 "$ready" 2>/dev/null)" = "${HOST_PID[$h]}" ] && return 0
        if ! kill -0 "${HOST_PID[$h]}" 2>/dev/null; then
            wait "${HOST_PID[$h]}" || true
            HOST_PID[$h]=""
            cat "$log" >&2
            grep -q "unknown argument '--fabric" "$log" &&
                fail "this vrdma-shim has no TCP fabric yet (--fabric-* unknown): two-hosts mode needs it"
            fail "the shim of host $h exited during start"
        fi
        sleep 0.1
    done
    cat "$log" >&2
    fail "the shim of host $h is not ready after 10 s"
}

# fabric_wait_state H ADDR:PORT STATE [SECONDS]: until `vrdmactl peers` on
# host H shows that peer in STATE, an extended regex such as 'down|connecting'
# (default 20 s). Prints the line.
fabric_wait_state() {
    local h="$1" peer="$2" state="$3" limit="${4:-20}" out=""
    local deadline=$(( $(date +%s) + limit ))
    local peer_re="${peer//./\\.}"
    while :; do
        out="$(host_ctl "$h" peers 2>&1 || true)"
        if grep -Eq "^peer $peer_re state ($state) " <<<"$out"; then
            grep -E "^peer $peer_re " <<<"$out"
            return 0
        fi
        [ "$(date +%s)" -lt "$deadline" ] || break
        sleep 0.1
    done
    echo "--- vrdmactl peers on host $h:" >&2
    echo "$out" >&2
    echo "--- log of host $h:" >&2
    tail -n 30 "$(host_log "$h")" >&2
    fail "host $h: peer $peer not '$state' after $limit s"
}

# fabric_wait_up H...: every configured peer of every host H is up (both
# directions of each link when both sides name each other).
fabric_wait_up() {
    local h p
    for h in "$@"; do
        for p in ${HOST_PEERS[$h]}; do fabric_wait_state "$h" "$p" up >/dev/null; done
    done
    for h in "$@"; do host_ctl "$h" peers | sed "s/^/  host $h| /"; done
}

# fabric_start "GUESTS OF HOST 1" "GUESTS OF HOST 2": the two-hosts fabric:
# host 1 (lid-base 1) and host 2 (lid-base 10), one veth link, each naming
# the other as a peer; waits for both shims ready and both peers up.
fabric_start() {
    [ -n "$2" ] || fail "two-hosts mode needs guests on both hosts (start_shim a b)"
    fabric_init
    fabric_host 1 "$1" 1
    fabric_host 2 "$2" 10
    fabric_link 1 2
    fabric_peer 1 2
    fabric_peer 2 1
    fabric_shim_start 1
    fabric_shim_start 2
    SHIM_PID="${HOST_PID[1]}"
    fabric_wait_up 1 2
}

# fabric_kill H SIGNAL: signals host H's shim and reaps it; its exit status
# is left in FABRIC_KILL_RC (not a command substitution: the shim is a child
# of this shell).
FABRIC_KILL_RC=""
fabric_kill() {
    local h="$1" sig="$2"
    [ -n "${HOST_PID[$h]}" ] || fail "host $h has no shim running"
    FABRIC_KILL_RC=0
    kill -"$sig" "${HOST_PID[$h]}"
    # (braces: no "Killed" line from bash for the job)
    { wait "${HOST_PID[$h]}"; } 2>/dev/null || FABRIC_KILL_RC=$?
    HOST_PID[$h]=""
}

# fabric_stop RC: the EXIT path of two-hosts mode (called by stop_shim).
fabric_stop() {
    local rc="$1" h pid src
    local pids=" ${HOST_PID[*]} "
    local j
    for j in $(jobs -p); do
        case "$pids" in *" $j "*) ;; *) kill "$j" 2>/dev/null || true ;; esac
    done
    if [ "$rc" -ne 0 ]; then
        for h in "${FABRIC_HOSTS[@]}"; do
            [ -n "${HOST_PID[$h]}" ] || continue
            echo "--- vrdmactl peers on host $h (before stopping):" >&2
            host_ctl "$h" peers >&2 || true
        done
    fi
    for h in "${FABRIC_HOSTS[@]}"; do
        pid="${HOST_PID[$h]}"
        [ -n "$pid" ] || continue
        src=0
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid"
            wait "$pid" || src=$?
        else
            wait "$pid" || src=$?
        fi
        if [ "$src" -ne 0 ]; then
            echo "the shim of host $h exited with $src (0 expected on SIGTERM)" >&2
            [ "$rc" -eq 0 ] && rc=1
        fi
        if [ -e "$(host_run_dir "$h")/ready" ]; then
            echo "the shim of host $h left its ready file behind" >&2
            [ "$rc" -eq 0 ] && rc=1
        fi
    done
    if [ "$rc" -ne 0 ]; then
        for h in "${FABRIC_HOSTS[@]}"; do
            # Its links' ups and downs first: the tail may have lost them.
            echo "--- fabric events of host $h (${HOST_NS[$h]}):" >&2
            grep -E "fabric: .*(peer .* (up|down)|violation|refus)" "$(host_log "$h")" 2>/dev/null | head -n 20 >&2 || true
            echo "--- log of host $h (${HOST_NS[$h]}):" >&2
            tail -n 50 "$(host_log "$h")" >&2 2>/dev/null || true
        done
    fi
    # A shim killed and never restarted leaves its /dev/infiniband links.
    local link
    for h in "${FABRIC_HOSTS[@]}"; do
        for link in "$(host_run_dir "$h")"/*/sys/class/infiniband_verbs/uverbs_vrdma_*; do
            [ -e "$link" ] || continue
            link="/dev/infiniband/$(basename "$link")"
            [ "$(readlink "$link" 2>/dev/null)" = /dev/null ] && rm -f "$link"
        done
        ip netns del "${HOST_NS[$h]}" 2>/dev/null || true
    done
    if [ -n "$RUN_DIR" ]; then
        rm -rf "$RUN_DIR"
        for h in "${FABRIC_HOSTS[@]}"; do rm -f "$(host_log "$h")"; done
        rm -f "$RUN_DIR".*
    fi
    exit "$rc"
}

# ---------------------------------------------------------------------------
# RC streams for the fabric tests (test/integration/fabric_stream.cpp).
STREAM="$VRDMA_BUILD_DIR/test/integration/vrdma-fabric-stream"
declare -A STREAM_SPID=() STREAM_CPID=()

# stream_start NAME SERVER_GUEST CLIENT_GUEST PORT ARGS...: a stream server
# in SERVER_GUEST and its client in CLIENT_GUEST, in the background, both
# with ARGS; output in RUN_DIR.NAME.server and RUN_DIR.NAME.client.
stream_start() {
    local name="$1" sg="$2" cg="$3" port="$4"
    shift 4
    local out="$RUN_DIR.$name"
    timeout 300 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest "$sg" -- "$STREAM" -p "$port" "$@" >"$out.server" 2>&1 &
    STREAM_SPID[$name]=$!
    wait_port "$port"
    timeout 300 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest "$cg" -- "$STREAM" -p "$port" "$@" 127.0.0.1 \
        >"$out.client" 2>&1 &
    STREAM_CPID[$name]=$!
}

# stream_show NAME: both outputs, prefixed (progress lines left out).
stream_show() {
    local out="$RUN_DIR.$1"
    grep -v '^progress ' "$out.server" | sed "s/^/  $1 server| /" || true
    grep -v '^progress ' "$out.client" | sed "s/^/  $1 client| /" || true
}

# stream_wait NAME: both ends exit 0 (within their 300 s), the server checked
# every byte and the client got the end of the stream.
stream_wait() {
    local name="$1" src=0 crc=0
    local out="$RUN_DIR.$name"
    wait "${STREAM_CPID[$name]}" || crc=$?
    wait "${STREAM_SPID[$name]}" || src=$?
    stream_show "$name"
    [ "$crc" -eq 0 ] || fail "stream $name: the client exited with $crc"
    [ "$src" -eq 0 ] || fail "stream $name: the server exited with $src"
    grep -q '^server: verified [0-9]* messages' "$out.server" || fail "stream $name: the server did not verify the data"
    grep -q '^client: done ' "$out.client" || fail "stream $name: the client did not finish"
}

# stream_run NAME SERVER_GUEST CLIENT_GUEST PORT ARGS...: start and wait.
stream_run() {
    stream_start "$@"
    stream_wait "$1"
}

# wait_line FILE REGEX [SECONDS [SKIP]]: until FILE has a line matching the
# extended REGEX (default 10 s), among its lines after the first SKIP.
wait_line() {
    local deadline=$(( $(date +%s) + ${3:-10} ))
    until tail -n +"$(( ${4:-0} + 1 ))" "$1" 2>/dev/null | grep -Eq "$2"; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            echo "--- $1:" >&2
            cat "$1" >&2 || true
            fail "no line /$2/ in $(basename "$1") after ${3:-10} s"
        fi
        sleep 0.05
    done
}

# now_ms: wall clock in milliseconds.
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# pingpong_start NAME PORT ARGS...: ibv_rc_pingpong -p PORT ARGS in the
# background, the server in guest a and the client in guest b (outputs
# $RUN_DIR.NAME.server and .client). pingpong_wait NAME: both must exit 0.
declare -A PINGPONG_SPID=() PINGPONG_CPID=()
pingpong_start() {
    local name="$1" port="$2"
    shift 2
    "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- ibv_rc_pingpong -d vrdma0 -g 0 -p "$port" "$@" \
        >"$RUN_DIR.$name.server" 2>&1 &
    PINGPONG_SPID[$name]=$!
    wait_port "$port"
    "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- ibv_rc_pingpong -d vrdma0 -g 0 -p "$port" "$@" 127.0.0.1 \
        >"$RUN_DIR.$name.client" 2>&1 &
    PINGPONG_CPID[$name]=$!
}
pingpong_wait() {
    local name="$1"
    wait "${PINGPONG_CPID[$name]}" || { cat "$RUN_DIR.$name.client" >&2; fail "ping-pong $name: the client failed"; }
    wait "${PINGPONG_SPID[$name]}" || { cat "$RUN_DIR.$name.server" >&2; fail "ping-pong $name: the server failed"; }
    grep -m1 'bytes in' "$RUN_DIR.$name.client" | sed "s/^/  $name: /"
    rm -f "$RUN_DIR.$name.server" "$RUN_DIR.$name.client"
}

# pair_outlasted SPID CPID WHAT HINT: right after WHAT ended, the pair of
# background clients SPID and CPID (outputs $RUN_DIR.s and $RUN_DIR.c) must
# still have been running then, and must both exit 0.
pair_outlasted() {
    local spid="$1" cpid="$2" what="$3" hint="$4" running src=0 crc=0
    running="$(kill -0 "$spid" 2>/dev/null && kill -0 "$cpid" 2>/dev/null && echo yes || echo no)"
    wait "$spid" || src=$?
    wait "$cpid" || crc=$?
    echo "  the pair: server $src, client $crc; client: $(grep -m1 -iE 'failed|iters' "$RUN_DIR.c" || true)"
    [ "$src" -eq 0 ] && [ "$crc" -eq 0 ] || { cat "$RUN_DIR.s" "$RUN_DIR.c" >&2; fail "the pair failed beside $what"; }
    [ "$running" = yes ] || fail "the pair ended before $what did: the test proved nothing ($hint)"
}

# ud_pair_start SERVER_GUEST CLIENT_GUEST PORT SECONDS: a checked
# ibv_ud_pingpong between the two guests in the background (outputs
# $RUN_DIR.s and $RUN_DIR.c, pids UD_SPID and UD_CPID, client connected on
# return) that lasts about SECONDS whatever the build's speed: a first run
# of 20000 round trips (on PORT+1) measures one (about 10 us plain, several
# times that sanitized or loaded) and the pair gets as many as SECONDS take
# at that speed (UD_PAIR_ITERS overrides, and skips the measuring run; the
# count is left in UD_ITERS). A loaded machine can measure a round trip
# several times slower than the pair then runs: a caller whose pair must
# outlast something checks that it did (pair_outlasted) and may try again
# with more.
ud_pair_start() {
    local sg="$1" cg="$2" port="$3" secs="$4" usec=measured iters spid
    local cal="ibv_ud_pingpong -d vrdma0 -g 0 -p $((port + 1)) -n 20000 -c"
    if [ -n "${UD_PAIR_ITERS:-}" ]; then
        UD_ITERS="$UD_PAIR_ITERS"
        ud_pair_launch "$sg" "$cg" "$port"
        return
    fi
    timeout 300 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest "$sg" -- $cal >"$RUN_DIR.s" 2>&1 &
    spid=$!
    wait_port $((port + 1))
    timeout 300 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest "$cg" -- $cal 127.0.0.1 >"$RUN_DIR.c" 2>&1 ||
        { cat "$RUN_DIR.c" >&2; fail "the measuring UD ping-pong of $sg and $cg failed"; }
    wait "$spid" || fail "the measuring UD ping-pong server in $sg failed"
    usec="$(sed -nE 's/.* = ([0-9.]+) usec\/iter.*/\1/p' "$RUN_DIR.c" | head -n1)"
    UD_ITERS="$(awk -v u="$usec" -v s="$secs" \
        'BEGIN { n = int(s * 1e6 / (u > 0 ? u : 1)); print (n < 4000 ? 4000 : n > 2000000 ? 2000000 : n) }')"
    echo "  a UD round trip takes ${usec} us: the pair gets $UD_ITERS of them"
    ud_pair_launch "$sg" "$cg" "$port"
}
ud_pair_launch() {
    local sg="$1" cg="$2" port="$3"
    local ud="ibv_ud_pingpong -d vrdma0 -g 0 -p $port -n $UD_ITERS -c"
    timeout 300 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest "$sg" -- stdbuf -oL $ud >"$RUN_DIR.s" 2>&1 &
    UD_SPID=$!
    wait_port "$port"
    timeout 300 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest "$cg" -- stdbuf -oL $ud 127.0.0.1 >"$RUN_DIR.c" 2>&1 &
    UD_CPID=$!
    wait_line "$RUN_DIR.c" 'remote address'
}

# cm_pair NAME PORT SERVER... -- CLIENT...: rdma_cm programs. SERVER in
# guest a, once a's shim logs its listen on PORT (in CM_LOG, default the
# shim's log); then CLIENT in guest b; both must exit 0. The client's
# output is left in CLIENT_OUT.
cm_pair() {
    local name="$1" port="$2"
    shift 2
    local server=() client=()
    while [ "$1" != -- ]; do server+=("$1"); shift; done
    shift
    client=("$@")
    note "$name: ${server[*]}  <-  ${client[*]}"
    local out="$RUN_DIR.out.$name" log="${CM_LOG:-$SHIM_LOG}" seen
    # Only a listen logged from now on counts: pairs may share a port.
    seen="$(wc -l <"$log")"
    timeout 60 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- "${server[@]}" >"$out.server" 2>&1 &
    local spid=$! src=0 crc=0
    # (a server that ends before it listens has its output shown)
    trap 'rc=$?; sed "s/^/  server| /" "$out.server" 2>/dev/null; (exit $rc); stop_shim' EXIT
    wait_line "$log" "guest a: rdma_cm: listening on .* port $port " 20 "$seen"
    timeout 60 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- "${client[@]}" >"$out.client" 2>&1 || crc=$?
    trap stop_shim EXIT
    wait "$spid" || src=$?
    tail -n 4 "$out.server" | sed 's/^/  server| /'
    tail -n 4 "$out.client" | sed 's/^/  client| /'
    [ "$src" -eq 0 ] || fail "$name: server exited $src"
    [ "$crc" -eq 0 ] || fail "$name: client exited $crc"
    CLIENT_OUT="$(cat "$out.client")"
    rm -f "$out.server" "$out.client"
}

# cm_multicast: mckey across guests: two receiving QPs of guest a (-c 2)
# join 230.1.2.3; once both joined, a sender in guest b sends 10 datagrams
# of 4 KiB (the MTU) to the group; each receiving QP must get all 10
# (mckey waits for them), and both sides exit 0.
cm_multicast() {
    note "mckey: 2 receivers in guest a, a sender in guest b, group 230.1.2.3"
    local out="$RUN_DIR.out.mckey" spid src=0 crc=0 deadline=$(( $(date +%s) + 20 ))
    timeout 60 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- \
        stdbuf -oL mckey -m 230.1.2.3 -b 10.0.0.1 -c 2 -C 10 -S 4096 >"$out.server" 2>&1 &
    spid=$!
    until [ "$(grep -c 'joined dgid' "$out.server")" -ge 2 ]; do
        [ "$(date +%s)" -lt "$deadline" ] || { cat "$out.server" >&2; fail "mckey: the receivers did not join"; }
        sleep 0.05
    done
    timeout 60 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- mckey -m 230.1.2.3 -s -C 10 -S 4096 \
        >"$out.client" 2>&1 || crc=$?
    wait "$spid" || src=$?
    tail -n 4 "$out.server" | sed 's/^/  receivers| /'
    tail -n 4 "$out.client" | sed 's/^/  sender| /'
    [ "$src" -eq 0 ] || fail "mckey: the receivers exited $src"
    [ "$crc" -eq 0 ] || fail "mckey: the sender exited $crc"
    grep -q 'data transfers complete' "$out.server" || fail "mckey: the receivers did not get every datagram"
    rm -f "$out.server" "$out.client"
}

# cm_udpong: udpong (rsockets datagrams) between guest a (10.0.0.1, the
# server) and guest b (10.0.0.2). Rsockets resolve datagram addresses
# through a kernel UDP socket (rsocket.c: ds_get_src_addr, and its UDP
# service exchanges QPNs over it), so each guest needs its address on an
# interface of its own network namespace, as a container has: each side
# runs in a namespace of its own, joined by a veth pair carrying the
# guests' addresses (the shims' sockets are files, reached from any
# namespace). Skipped without root.
UDP_NS_A="" UDP_NS_B=""
cm_udpong() {
    if [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; then
        note "udpong: skipped (it needs root for the network namespaces that hold the guests' addresses)"
        return 0
    fi
    note "udpong: rsockets datagrams, each guest in a network namespace with its address"
    UDP_NS_A="vrdma-udp-a-$$" UDP_NS_B="vrdma-udp-b-$$"
    local a="vu$$a" b="vu$$b" ns up out
    trap 'rc=$?; ip netns del "$UDP_NS_A" 2>/dev/null; ip netns del "$UDP_NS_B" 2>/dev/null; (exit $rc); stop_shim' EXIT
    ip netns add "$UDP_NS_A"
    ip netns add "$UDP_NS_B"
    ip link add "$a" type veth peer name "$b"
    ip link set "$a" netns "$UDP_NS_A"
    ip link set "$b" netns "$UDP_NS_B"
    ip -n "$UDP_NS_A" addr add 10.0.0.1/24 dev "$a"
    ip -n "$UDP_NS_B" addr add 10.0.0.2/24 dev "$b"
    for ns in "$UDP_NS_A" "$UDP_NS_B"; do ip -n "$ns" link set lo up; done
    ip -n "$UDP_NS_A" link set "$a" up
    ip -n "$UDP_NS_B" link set "$b" up
    ip netns exec "$UDP_NS_A" timeout 60 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- udpong -b 10.0.0.1 -p 7178 \
        >"$RUN_DIR.udpong" 2>&1 &
    up=$!
    for _ in $(seq 1 200); do  # its UDP socket bound (rsockets' datagram service)
        ip netns exec "$UDP_NS_A" ss -Huln 'sport = :7178' | grep -q . && break
        sleep 0.1
    done
    out="$(ip netns exec "$UDP_NS_B" timeout 60 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest b -- \
        udpong -s 10.0.0.1 -p 7178 -C 200 -S 1000 2>&1)" || { echo "$out"; cat "$RUN_DIR.udpong"; fail "udpong failed"; }
    sed 's/^/  client| /' <<<"$out"
    grep -Eq '^custom +1000 +200 ' <<<"$out" || fail "udpong: no line for 200 transfers of 1000 bytes"
    kill "$up" 2>/dev/null || true  # its server runs until stopped
    wait "$up" || true
    ip netns del "$UDP_NS_A"
    ip netns del "$UDP_NS_B"
    trap stop_shim EXIT
}

# cm_cmtime: cmtime's 50 connections set up and torn down, the server in
# guest a (listening once the shim of a logs it, in CM_LOG), the client in
# guest b, which must exit 0 and time every step.
cm_cmtime() {
    note "cmtime: 50 connections set up and torn down"
    local log="${CM_LOG:-$SHIM_LOG}" seen ct out
    seen="$(wc -l <"$log")"
    timeout 60 "$VRDMA_RUN" --run-dir "$RUN_DIR" --guest a -- cmtime -p 7177 >/dev/null 2>&1 &
    ct=$!
    wait_line "$log" "guest a: rdma_cm: listening on .* port 7177 " 20 "$seen"
    out="$(in_guest b timeout 60 cmtime -s 10.0.0.1 -p 7177 -c 50 2>&1)" || { echo "$out"; fail "cmtime: the client failed"; }
    sed 's/^/  client| /' <<<"$out"
    grep -Eq '^connect +:' <<<"$out" || fail "cmtime: no connect step in its table"
    kill "$ct" 2>/dev/null || true  # its server runs until stopped
    wait "$ct" || true
}

# cm_programs: unmodified rdmacm-utils and perftest -R from guest b
# (client) to guest a (server, 10.0.0.1), through cm_pair, data checked
# where the program checks it.
cm_programs() {
    # rping verifies every ping (-v prints each); 20 of 4 KiB.
    cm_pair rping 7174 rping -s -a 10.0.0.1 -C 20 -S 4096 -- rping -c -a 10.0.0.1 -C 20 -S 4096 -v
    [ "$(grep -c '^ping data: rdma-ping-' <<<"$CLIENT_OUT")" -eq 20 ] || fail "rping: not 20 pings"
    cm_pair ucmatose 7471 ucmatose -c 4 -C 10 -- ucmatose -s 10.0.0.1 -c 4 -C 10
    grep -q 'return status 0' <<<"$CLIENT_OUT" || fail "ucmatose: no 'return status 0'"
    cm_pair rdma_server 7471 rdma_server -s 10.0.0.1 -- rdma_client -s 10.0.0.1
    cm_pair udaddy 7174 udaddy -- udaddy -s 10.0.0.1
    grep -q 'return status 0' <<<"$CLIENT_OUT" || fail "udaddy: no 'return status 0'"
    cm_multicast
    # rsockets over rdma_cm: blocking and non-blocking, each byte verified (-T v).
    cm_pair rstream-blocking 7471 rstream -T b -T v -S 65536 -C 50 -- rstream -s 10.0.0.1 -T b -T v -S 65536 -C 50
    cm_pair rstream-nonblocking 7471 rstream -T n -T v -S 4096 -C 50 -- rstream -s 10.0.0.1 -T n -T v -S 4096 -C 50
    cm_pair riostream 7471 riostream -T b -T v -S 65536 -C 50 -- riostream -s 10.0.0.1 -T b -T v -S 65536 -C 50
    # perftest with -R: connections by rdma_cm (perftest checks no data).
    cm_pair ib_write_bw 18515 ib_write_bw -R -d vrdma0 -n 200 -- ib_write_bw -R -d vrdma0 -n 200 10.0.0.1
    cm_pair ib_read_bw 18515 ib_read_bw -R -d vrdma0 -n 200 -- ib_read_bw -R -d vrdma0 -n 200 10.0.0.1
    cm_pair ib_send_lat 18515 ib_send_lat -R -d vrdma0 -n 200 -- ib_send_lat -R -d vrdma0 -n 200 10.0.0.1
    cm_pair ib_send_bw-ud 18515 ib_send_bw -R -c UD -d vrdma0 -n 200 -- ib_send_bw -R -c UD -d vrdma0 -n 200 10.0.0.1
}
