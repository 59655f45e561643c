# Shared by the guest scripts of scripts/test-hca.sh (source it; run inside
# a VM booted by scripts/vm/run-pair.sh with the build directory as
# $VM_GARGS). Sets the names below, brings rxe0 up (exports RXE_*), and
# defines the helpers. VM 1 is every server, VM 2 every client.
# shellcheck shell=bash

hca_src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${VM_GARGS:?the build directory (run-pair.sh --gargs)}
N=${VMID:?}
peer=$((3 - N))
share=${VM_SHARE:?}
results=$share/vm$N.results
failures=${failures:-0}
SHIM=$build/src/shim/vrdma-shim
CTL=("$build/tools/vrdmactl" --run-dir /run/vrdma)
# shellcheck disable=SC2034 # used by the scripts that source this
RUN=("$build/tools/vrdma-run" --run-dir /run/vrdma --guest "g$N" --)
server_ip=10.10.0.1
cm_prefix=10.20.0  # guest gN's rdma_cm address: 10.20.0.N (--guest gN:ip=)
shim_pid=
# A build with ASan and UBSan (scripts/test.sh's build-asan) runs here too:
# the plain provider is preloaded into instrumented programs, and what the
# sanitizers find in a shim fails the run (finish).
export ASAN_OPTIONS="${ASAN_OPTIONS:-verify_asan_link_order=0:detect_leaks=1:halt_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

say() { echo "$*" | tee -a "$results"; }
ok() { say "ok $1"; }
fail() {
    say "FAIL $1: $2"
    failures=$((failures + 1))
}

# shellcheck source=../../scripts/vm/rxe-up.sh
source "$hca_src/scripts/vm/rxe-up.sh" >/dev/null || {
    fail rxe-up "Soft-RoCE did not come up"
    exit 1
}

# start_shim: a shim with rxe0 serving guests gN (LID 10N, worker 0) and
# gNb (LID 10N+1, worker 1: each worker opens the device for itself),
# joined to the other VM's shim; waits until the peer is up (the peer's
# shim may start later: up to 60 s). Log: /tmp/shim.log (appended).
start_shim() {
    "$SHIM" --run-dir /run/vrdma --guest "g$N:ip=$cm_prefix.$N" --guest "g${N}b" --lid-base "$((10 * N))" --workers 2 \
        --fabric-listen "10.10.0.$N:7400" --fabric-peer "10.10.0.$peer:7400" \
        --fabric-key "$share/fabric.key" --hca rxe0 >>/tmp/shim.log 2>&1 &
    shim_pid=$!
    wait_fabric
}

wait_fabric() {
    local _
    for _ in $(seq 1 300); do
        "${CTL[@]}" peers 2>/dev/null | grep -q "state up" && return 0
        sleep 0.2
    done
    return 1
}

stop_shim() {
    [ -n "$shim_pid" ] || return 0
    kill "$shim_pid" 2>/dev/null
    wait "$shim_pid" 2>/dev/null
    shim_pid=
}

# finish: stops the shim, puts its warnings and errors into the results;
# the status is 0 when no check failed.
finish() {
    stop_shim
    grep -E "^vrdma-shim: (warning|error)" /tmp/shim.log | head -20 >>"$results"
    if grep -qE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" /tmp/shim.log /tmp/loop.log 2>/dev/null; then
        fail sanitizers "$(grep -hE -A8 "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" /tmp/shim.log \
            /tmp/loop.log 2>/dev/null | head -20 | tr '\n' ' ')"
    fi
    [ "$failures" = 0 ]
}

# run_pair NAME PORT CMD...: VM 1 serves, VM 2 connects to VM 1 (retrying
# while nobody listens yet). Output goes to /tmp/NAME.out.
run_pair() {
    local name=$1 port=$2
    shift 2
    local out=/tmp/$name.out
    if [ "$N" = 1 ]; then
        if timeout 180 "$@" -p "$port" >"$out" 2>&1; then ok "$name"; else fail "$name" "server: $(tail -3 "$out" | tr '\n' ' ')"; fi
        return
    fi
    if connect_retrying 180 "$out" "$@" -p "$port" "$server_ip"; then ok "$name"; else
        fail "$name" "client: $(tail -3 "$out" | tr '\n' ' ')"
    fi
}

# connect_retrying SECONDS OUT CMD...: runs CMD (under timeout SECONDS)
# until it gets past connecting to its server (for up to 60 s); returns
# CMD's status.
# cm_pair NAME SERVER... ::: CLIENT...: rdma_cm programs, which take their
# addresses as they like: VM 1 runs SERVER, VM 2 CLIENT (retrying while
# nobody listens yet, or while the peer's guests' addresses are not known).
# (":::" as the separator: the commands hold vrdma-run's "--".)
cm_pair() {
    local name=$1
    shift
    local server=() client=()
    while [ "$1" != ::: ]; do server+=("$1"); shift; done
    shift
    client=("$@")
    local out=/tmp/$name.out
    if [ "$N" = 1 ]; then
        if timeout 180 "${server[@]}" >"$out" 2>&1; then ok "$name"; else fail "$name" "server: $(tail -3 "$out" | tr '\n' ' ')"; fi
        return
    fi
    if connect_retrying 180 "$out" "${client[@]}"; then ok "$name"; else
        fail "$name" "client: $(tail -3 "$out" | tr '\n' ' ')"
    fi
}

connect_retrying() {
    local limit=$1 out=$2 tries=0 rc
    shift 2
    while :; do
        timeout "$limit" "$@" >"$out" 2>&1
        rc=$?
        if [ "$rc" != 0 ] && [ $tries -lt 120 ] &&
            grep -qiE "couldn't connect|unable to connect|connection refused|Failed to connect|REJECTED|ADDR_ERROR|Unable to perform rdma_client" "$out"; then
            tries=$((tries + 1))
            sleep 0.5
            continue
        fi
        return "$rc"
    done
}

# wait_for PATTERN FILE SECONDS: until FILE has a line matching PATTERN.
wait_for() {
    local _
    for _ in $(seq 1 $(($3 * 5))); do
        grep -qE "$1" "$2" 2>/dev/null && return 0
        sleep 0.2
    done
    return 1
}

# device_objects KIND: how many device QPs/MRs/CQs (rdma resource show
# KIND) the shim holds on rxe0. The kernel names the thread that made each
# (its worker, not the main thread): any thread of the shim counts.
device_objects() {
    local tids
    tids=$(ls "/proc/$shim_pid/task" 2>/dev/null | paste -sd'|')
    rdma resource show "$1" 2>/dev/null | grep -cE "pid (${tids:-$shim_pid})( |$)" || true
}
