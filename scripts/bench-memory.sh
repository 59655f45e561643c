#!/usr/bin/env bash
# Memory benchmark (issue 10; separate from the tests). Builds if needed,
# starts a shim with guests a and b, and measures in one run:
#   ibv_reg_mr + ibv_dereg_mr   at 4 KiB, 1 MiB, 64 MiB, anonymous and shared
#                               file memory, beside memcpy of the same size
#                               (vrdma-reg-cost)
#   ib_write_bw at 64 KiB       out of (and into) each kind of memory perftest
#                               can use: heap (its default), a /dev/shm file,
#                               a file on disk (both MAP_SHARED, --mmap),
#                               SysV huge pages (--use_hugepages) and a file
#                               on hugetlbfs, beside memcpy of 64 KiB
#   ucx_perftest                UCT put latency and bandwidth on rc_verbs, UCP
#                               tag latency and bandwidth (UCX_TLS=rc_verbs,
#                               ud_verbs), beside ib_send_lat and ib_write_bw
# and prints markdown tables (docs/performance.md "Memory" comes from here).
# As root it reserves 16 huge pages for the run (scripts/lib/huge_pages.sh)
# and puts them back; without huge pages those rows say "no huge pages".
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$src/build}"
[ -x "$build/src/shim/vrdma-shim" ] || BUILD_DIR="$build" "$src/scripts/build.sh"
command -v ucx_perftest >/dev/null || { echo "bench-memory: ucx_perftest missing: apt-get install ucx-utils" >&2; exit 1; }
ITERS_BW="${ITERS_BW:-5000}"
ITERS_LAT="${ITERS_LAT:-20000}"

# shellcheck source=lib/huge_pages.sh
source "$src/scripts/lib/huge_pages.sh"
run_dir="$(mktemp -d /tmp/vrdma-bench-memory.XXXXXX)"
files=()
shim=
cleanup() {
    [ -n "$shim" ] && { kill -TERM "$shim" 2>/dev/null; wait "$shim" 2>/dev/null || true; }
    rm -rf "$run_dir" "$run_dir.log" "${files[@]}"
    release_huge_pages
}
trap cleanup EXIT
reserve_huge_pages 16 >&2
# One worker, whatever the CPUs: the figures are those of two guests of
# one worker (scripts/bench-scale.sh measures two workers).
"$build/src/shim/vrdma-shim" --run-dir "$run_dir" --workers 1 --guest a --guest b >"$run_dir.log" 2>&1 &
shim=$!
for _ in $(seq 1 100); do [ -e "$run_dir/ready" ] && break; sleep 0.1; done
port=20715
# shellcheck source=lib/bench.sh
source "$src/scripts/lib/bench.sh"  # in_guest, wait_listen, ratio
# pair "SERVER ARGS" "CLIENT ARGS" TOOL: server in guest a, client in guest
# b; the client's output on stdout.
pair() {
    local sargs=$1 cargs=$2 tool=$3
    port=$((port + 1))
    # shellcheck disable=SC2086  # ARGS: words
    in_guest a $tool -p $port $sargs >/dev/null 2>&1 &
    local server=$!
    wait_listen $port
    # shellcheck disable=SC2086
    in_guest b $tool -p $port $cargs 127.0.0.1 2>/dev/null || true
    wait "$server" || true
}
perftest_line() { awk '$1 ~ /^[0-9]+$/ && NF >= 5 { print; exit }'; }
write_bw() {  # SERVER-OPTS CLIENT-OPTS: BW average MB/s
    pair "-d vrdma0 -s 65536 -n $ITERS_BW $1" "-d vrdma0 -s 65536 -n $ITERS_BW $2" ib_write_bw |
        perftest_line | awk '{print $4}'
}
# A file of SIZE bytes at PATH for --mmap, removed at the end.
mmap_file() { truncate -s "$2" "$1" && files+=("$1"); }

echo "measuring (this takes about two minutes)..." >&2
memcpy_bw="$("$build/tools/vrdma-baselines" memcpy 65536 | awk '{print $3}')"
reg_cost="$(in_guest a "$build/tools/vrdma-reg-cost")"

declare -A bw=()
bw[heap]="$(write_bw "" "")"
mmap_file /dev/shm/vrdma-bench-s.$$ 1M
mmap_file /dev/shm/vrdma-bench-c.$$ 1M
bw[shm]="$(write_bw "--mmap=/dev/shm/vrdma-bench-s.$$" "--mmap=/dev/shm/vrdma-bench-c.$$")"
mmap_file /var/tmp/vrdma-bench-s.$$ 1M
mmap_file /var/tmp/vrdma-bench-c.$$ 1M
bw[disk]="$(write_bw "--mmap=/var/tmp/vrdma-bench-s.$$" "--mmap=/var/tmp/vrdma-bench-c.$$")"
huge_free=$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages 2>/dev/null || echo 0)
if [ "$huge_free" -ge 4 ]; then
    bw[sysv_huge]="$(write_bw --use_hugepages --use_hugepages)"
    if [ -n "${VRDMA_TEST_HUGETLBFS:-}" ]; then
        mmap_file "$VRDMA_TEST_HUGETLBFS/s.$$" 2M
        mmap_file "$VRDMA_TEST_HUGETLBFS/c.$$" 2M
        bw[hugetlbfs]="$(write_bw "--mmap=$VRDMA_TEST_HUGETLBFS/s.$$" "--mmap=$VRDMA_TEST_HUGETLBFS/c.$$")"
    fi
fi
send_lat="$(pair "-d vrdma0 -s 8 -n $ITERS_LAT" "-d vrdma0 -s 8 -n $ITERS_LAT" ib_send_lat | perftest_line | awk '{print $5}')"

# ucx_perftest's Final line: iterations, latency 50%ile, average, overall,
# bandwidth average, overall (MB/s), message rate average, overall.
ucx() {  # ENV-WORDS ARGS...
    local envp=$1
    shift
    pair "" "$* -w 1000" "$envp ucx_perftest" | awk '$1 == "Final:" { print; exit }'
}
UCP_ENV="env UCX_NET_DEVICES=vrdma0:1 UCX_TLS=rc_verbs,ud_verbs"
put_lat="$(ucx env -t put_lat -d vrdma0:1 -x rc_verbs -s 8 -n "$ITERS_LAT" | awk '{print $3}')"
put_bw="$(ucx env -t put_bw -d vrdma0:1 -x rc_verbs -D zcopy -s 65536 -n "$ITERS_BW" | awk '{print $6}')"
tag_lat="$(ucx "$UCP_ENV" -t tag_lat -s 8 -n "$ITERS_LAT" | awk '{print $3}')"
tag_bw="$(ucx "$UCP_ENV" -t tag_bw -s 65536 -n "$ITERS_BW" | awk '{print $6}')"

row() {  # LABEL KEY
    local v="${bw[$2]:-}"
    if [ -z "$v" ]; then
        echo "| $1 | no huge pages | $memcpy_bw | - | - |"
    else
        echo "| $1 | $v | $memcpy_bw | $(ratio "$v" "$memcpy_bw") | $(ratio "$v" "${bw[heap]}") |"
    fi
}
cat <<TABLE
ibv_reg_mr + ibv_dereg_mr on vrdma0 (vrdma-reg-cost; ratio: first registration over memcpy):

\`\`\`
$reg_cost
\`\`\`

| ib_write_bw 64 KiB, both ends' buffers in | MB/s (average) | memcpy 64 KiB (MiB/s) | of memcpy | of heap |
| --- | --- | --- | --- | --- |
$(row "heap (perftest's default)" heap)
$(row "a /dev/shm file, MAP_SHARED (--mmap)" shm)
$(row "a file on disk (ext4), MAP_SHARED (--mmap)" disk)
$(row "SysV shared memory on huge pages (--use_hugepages)" sysv_huge)
$(row "a file on hugetlbfs, MAP_SHARED (--mmap)" hugetlbfs)

| UCX over vrdma0 | value | perftest beside it | value | ratio |
| --- | --- | --- | --- | --- |
| ucx_perftest put_lat 8 B, UCT rc_verbs (us, median) | $put_lat | ib_send_lat 8 B (us, typical) | $send_lat | $(ratio "$put_lat" "$send_lat") x |
| ucx_perftest tag_lat 8 B, UCP (us, median) | $tag_lat | ib_send_lat 8 B (us, typical) | $send_lat | $(ratio "$tag_lat" "$send_lat") x |
| ucx_perftest put_bw 64 KiB zcopy, UCT rc_verbs (MB/s) | $put_bw | ib_write_bw 64 KiB, heap (MB/s) | ${bw[heap]} | $(ratio "$put_bw" "${bw[heap]}") |
| ucx_perftest tag_bw 64 KiB, UCP (MB/s) | $tag_bw | ib_write_bw 64 KiB, heap (MB/s) | ${bw[heap]} | $(ratio "$tag_bw" "${bw[heap]}") |

Machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg).
TABLE
