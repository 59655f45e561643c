# shellcheck shell=bash
# Sourced by scripts/test.sh: huge pages for the hugetlb cases of the
# verbs suite (verbs_memory_test.cpp "[hugetlb]"), which skip with a
# warning where the host has none free.
#
# reserve_huge_pages N: as root, makes at least N 2 MiB huge pages free
# (raising /proc/sys/vm/nr_hugepages) and mounts a hugetlbfs of them on a
# temporary directory, exported as VRDMA_TEST_HUGETLBFS. release_huge_pages
# puts both back. Not root, or a kernel without hugetlb: a note, nothing
# changed.
HUGE_PAGES_SYSCTL=/proc/sys/vm/nr_hugepages
HUGE_PAGES_FREE=/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages
HUGE_PAGES_BEFORE=
HUGE_PAGES_MOUNT=

reserve_huge_pages() {
    local want=$1 free total
    if [ "$(id -u)" -ne 0 ] || [ ! -w "$HUGE_PAGES_SYSCTL" ] || [ ! -r "$HUGE_PAGES_FREE" ]; then
        echo "huge pages: not root or no hugetlb: the [hugetlb] verbs cases will skip"
        return 0
    fi
    free=$(cat "$HUGE_PAGES_FREE")
    if [ "$free" -lt "$want" ]; then
        HUGE_PAGES_BEFORE=$(cat "$HUGE_PAGES_SYSCTL")
        total=$(( HUGE_PAGES_BEFORE + want - free ))
        echo "$total" >"$HUGE_PAGES_SYSCTL" || true
        free=$(cat "$HUGE_PAGES_FREE")
    fi
    HUGE_PAGES_MOUNT="$(mktemp -d /tmp/vrdma-hugetlbfs.XXXXXX)"
    if mount -t hugetlbfs -o pagesize=2M none "$HUGE_PAGES_MOUNT" 2>/dev/null; then
        export VRDMA_TEST_HUGETLBFS="$HUGE_PAGES_MOUNT"
    else
        rmdir "$HUGE_PAGES_MOUNT"
        HUGE_PAGES_MOUNT=
    fi
    echo "huge pages: $free of 2 MiB free${HUGE_PAGES_MOUNT:+, hugetlbfs on $HUGE_PAGES_MOUNT}"
}

release_huge_pages() {
    if [ -n "$HUGE_PAGES_MOUNT" ]; then
        umount "$HUGE_PAGES_MOUNT" 2>/dev/null && rmdir "$HUGE_PAGES_MOUNT"
        HUGE_PAGES_MOUNT=
    fi
    if [ -n "$HUGE_PAGES_BEFORE" ]; then
        echo "$HUGE_PAGES_BEFORE" >"$HUGE_PAGES_SYSCTL" || true
        HUGE_PAGES_BEFORE=
    fi
}
