/*
 * vrdma-mpi-test: an MPI program that checks, with every byte verified,
 * what Open MPI moves between its ranks. It knows nothing of vrdma: the
 * integration tests (test/integration/mpi*.sh) run it with the openib BTL
 * as the only transport between ranks, so everything it checks went
 * through vrdma0.
 *
 *   point-to-point  0 B .. 16 MiB (default) at every protocol boundary of
 *                   ob1/openib (inline 128 B, eager 12 KiB, max send 64 KiB,
 *                   RDMA pipeline 1 MiB): blocking (Send/Recv, Ssend,
 *                   Sendrecv, ANY_SOURCE), non-blocking (Isend/Irecv to and
 *                   from every peer at once), many messages in flight (per
 *                   peer, mixed sizes, receives posted in reverse order and
 *                   after the messages arrived), and send buffers freed and
 *                   allocated anew between messages (a registration cache
 *                   must not hand out stale registrations)
 *   collectives     barrier (checked with clocks), bcast, reduce, allreduce,
 *                   alltoall, gather, scatter, allgather: every root, exact
 *                   integer results
 *   one-sided       MPI_Put, MPI_Get, MPI_Accumulate with fence and with
 *                   lock/unlock (exclusive and shared), on MPI_Win_allocate
 *                   and on MPI_Win_create windows
 *
 * Usage: vrdma-mpi-test [--max-size BYTES] [--only LIST] [-v]
 *   --only LIST  comma-separated groups (p2p, coll, rma) or tests (blocking,
 *                nonblocking, many, remapped, barrier, bcast, reduce,
 *                alltoall, gather, rma); default all
 * Exit status 0 when every check passed; on the first failure it prints
 * what differed (rank, test, size, offset) and calls MPI_Abort.
 */
#define _GNU_SOURCE
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static int rank, nranks;
static int verbose;
static size_t max_size = 16u << 20;
static const char *current = "start";
static unsigned long long checks;

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "vrdma-mpi-test: rank %d: FAIL in %s: ", rank, current);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

#define MPI_CHECK(call)                                              \
    do {                                                             \
        int rc_ = (call);                                            \
        if (rc_ != MPI_SUCCESS) {                                    \
            char s_[MPI_MAX_ERROR_STRING];                           \
            int l_ = 0;                                              \
            MPI_Error_string(rc_, s_, &l_);                          \
            die("%s returned %d (%s)", #call, rc_, s_);              \
        }                                                            \
    } while (0)

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) die("out of memory (%zu bytes)", n);
    return p;
}

/* The byte at offset i of the message identified by seed. Neighbouring
 * bytes differ, and so do the same offsets of different messages, so a
 * shifted, truncated, stale or misdelivered buffer is caught. */
static inline uint8_t pattern_byte(uint64_t seed, size_t i) {
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + (uint64_t)(i >> 3) * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    return (uint8_t)(x >> (8 * (i & 7)));
}

static void fill(void *buf, size_t n, uint64_t seed) {
    uint8_t *b = buf;
    for (size_t i = 0; i < n; ++i) b[i] = pattern_byte(seed, i);
}

static void verify(const void *buf, size_t n, uint64_t seed, const char *what, int peer) {
    const uint8_t *b = buf;
    ++checks;
    for (size_t i = 0; i < n; ++i)
        if (b[i] != pattern_byte(seed, i))
            die("%s: %zu bytes from/to rank %d: byte %zu is 0x%02x, expected 0x%02x", what, n, peer, i,
                b[i], pattern_byte(seed, i));
}

static uint64_t seed_of(int src, int dst, size_t size, int k) {
    return ((uint64_t)src << 56) ^ ((uint64_t)dst << 48) ^ ((uint64_t)size << 8) ^ (uint64_t)k;
}

/* Sizes at and around every boundary where ob1/openib change protocol. */
static size_t *message_sizes(int *count) {
    static const size_t base[] = {0,     1,     2,      3,      7,      8,       63,      64,      127,
                                  128,   129,   255,    256,    1000,   1024,    4095,    4096,    4097,
                                  8192,  12200, 12287,  12288,  12289,  16384,   32768,   65535,   65536,
                                  65537, 131072, 262144, 524287, 1048576, 1048577, 1060864, 2097152, 4194304,
                                  4194305, 8388608, 16777216};
    size_t *out = xmalloc(sizeof(base));
    int n = 0;
    for (size_t i = 0; i < sizeof(base) / sizeof(base[0]); ++i)
        if (base[i] <= max_size) out[n++] = base[i];
    if (n == 0 || out[n - 1] != max_size) out[n++] = max_size;
    *count = n;
    return out;
}

static void phase(const char *name) {
    current = name;
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    if (rank == 0 && verbose) printf("  %s\n", name), fflush(stdout);
}

static void done(const char *what) {
    unsigned long long total = 0;
    MPI_CHECK(MPI_Reduce(&checks, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD));
    if (rank == 0) printf("ok  %-44s (%llu buffers verified)\n", what, total), fflush(stdout);
    checks = 0;
}

/* ---------------------------------------------------------------- p2p -- */

/* Every ordered pair (a, b) in turn; the others wait. */
static void p2p_blocking(const size_t *sizes, int nsizes) {
    phase("p2p blocking send/recv");
    size_t cap = sizes[nsizes - 1];
    uint8_t *sbuf = xmalloc(cap), *rbuf = xmalloc(cap + 64);
    for (int a = 0; a < nranks; ++a)
        for (int b = 0; b < nranks; ++b) {
            if (a == b || (rank != a && rank != b)) continue;
            int peer = rank == a ? b : a;
            for (int s = 0; s < nsizes; ++s) {
                size_t n = sizes[s];
                /* Unique per sender: ANY_SOURCE below must match only a. */
                int tag = 1000 + a * 64 + s;
                if (rank == a) {
                    fill(sbuf, n, seed_of(a, b, n, 1));
                    /* Alternate standard and synchronous sends. */
                    if (s & 1)
                        MPI_CHECK(MPI_Ssend(sbuf, (int)n, MPI_BYTE, b, tag, MPI_COMM_WORLD));
                    else
                        MPI_CHECK(MPI_Send(sbuf, (int)n, MPI_BYTE, b, tag, MPI_COMM_WORLD));
                    MPI_Status st;
                    memset(rbuf, 0xEE, n + 64);
                    MPI_CHECK(MPI_Recv(rbuf, (int)n, MPI_BYTE, b, tag, MPI_COMM_WORLD, &st));
                    verify(rbuf, n, seed_of(b, a, n, 2), "blocking echo", peer);
                } else {
                    MPI_Status st;
                    memset(rbuf, 0xEE, n + 64);
                    /* Receive into a larger buffer from ANY_SOURCE: the
                     * count and source must be exact, nothing past n written. */
                    MPI_CHECK(MPI_Recv(rbuf, (int)(n + 64), MPI_BYTE, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, &st));
                    int count = -1;
                    MPI_CHECK(MPI_Get_count(&st, MPI_BYTE, &count));
                    if ((size_t)count != n || st.MPI_SOURCE != a || st.MPI_TAG != tag)
                        die("blocking recv: status count %d source %d tag %d, expected %zu %d %d", count,
                            st.MPI_SOURCE, st.MPI_TAG, n, a, tag);
                    verify(rbuf, n, seed_of(a, b, n, 1), "blocking recv", peer);
                    for (size_t i = n; i < n + 64; ++i)
                        if (rbuf[i] != 0xEE) die("blocking recv of %zu bytes wrote byte %zu", n, i);
                    fill(sbuf, n, seed_of(b, a, n, 2));
                    MPI_CHECK(MPI_Send(sbuf, (int)n, MPI_BYTE, a, tag, MPI_COMM_WORLD));
                }
            }
        }
    free(sbuf);
    free(rbuf);

    /* Sendrecv around the ring in both directions at every size. */
    sbuf = xmalloc(cap);
    rbuf = xmalloc(cap);
    for (int s = 0; s < nsizes; ++s)
        for (int dir = 1; dir >= -1; dir -= 2) {
            size_t n = sizes[s];
            int to = (rank + dir + nranks) % nranks, from = (rank - dir + nranks) % nranks;
            fill(sbuf, n, seed_of(rank, to, n, 3));
            MPI_CHECK(MPI_Sendrecv(sbuf, (int)n, MPI_BYTE, to, 7, rbuf, (int)n, MPI_BYTE, from, 7, MPI_COMM_WORLD,
                                   MPI_STATUS_IGNORE));
            verify(rbuf, n, seed_of(from, rank, n, 3), "sendrecv", from);
        }
    free(sbuf);
    free(rbuf);
    done("p2p blocking (Send, Ssend, Recv, Sendrecv)");
}

/* At each size, every rank sends to and receives from every other rank at
 * once. Buffers are allocated for each size and freed after it, so large
 * buffers are mmapped and munmapped between messages. */
static void p2p_nonblocking(const size_t *sizes, int nsizes) {
    phase("p2p non-blocking");
    int peers = nranks - 1;
    for (int s = 0; s < nsizes; ++s) {
        size_t n = sizes[s];
        uint8_t **sb = xmalloc(sizeof(*sb) * nranks), **rb = xmalloc(sizeof(*rb) * nranks);
        MPI_Request *req = xmalloc(sizeof(*req) * 2 * nranks);
        int r = 0;
        for (int p = 0; p < nranks; ++p) {
            if (p == rank) continue;
            rb[p] = xmalloc(n);
            MPI_CHECK(MPI_Irecv(rb[p], (int)n, MPI_BYTE, p, 100 + s, MPI_COMM_WORLD, &req[r++]));
        }
        for (int p = 0; p < nranks; ++p) {
            if (p == rank) continue;
            sb[p] = xmalloc(n);
            fill(sb[p], n, seed_of(rank, p, n, 4));
            MPI_CHECK(MPI_Isend(sb[p], (int)n, MPI_BYTE, p, 100 + s, MPI_COMM_WORLD, &req[r++]));
        }
        MPI_CHECK(MPI_Waitall(2 * peers, req, MPI_STATUSES_IGNORE));
        for (int p = 0; p < nranks; ++p) {
            if (p == rank) continue;
            verify(rb[p], n, seed_of(p, rank, n, 4), "isend/irecv", p);
            free(rb[p]);
            free(sb[p]);
        }
        free(sb);
        free(rb);
        free(req);
    }
    done("p2p non-blocking (Isend, Irecv, Waitall)");
}

/* Many messages in flight per peer: mixed sizes, receives posted in reverse
 * order of the sends; then a second round where the messages arrive before
 * any receive is posted (unexpected messages), completed with Waitany and
 * Testsome; and the same sizes sent to self. */
static void p2p_many(void) {
    phase("p2p many in flight");
    enum { kMsgs = 64 };
    size_t cap = max_size < (1u << 20) ? max_size : (1u << 20);
    size_t msg_size[kMsgs];
    for (int k = 0; k < kMsgs; ++k) {
        static const size_t pick[] = {0, 8, 100, 128, 129, 1024, 4000, 12288, 20000, 65536, 100000};
        msg_size[k] = k == kMsgs - 1 ? cap : pick[k % (sizeof(pick) / sizeof(pick[0]))];
        if (msg_size[k] > cap) msg_size[k] = cap;
    }
    for (int round = 0; round < 2; ++round) {
        int total = kMsgs * nranks; /* including self */
        uint8_t **sb = xmalloc(sizeof(*sb) * total), **rb = xmalloc(sizeof(*rb) * total);
        MPI_Request *sreq = xmalloc(sizeof(*sreq) * total), *rreq = xmalloc(sizeof(*rreq) * total);
        for (int i = 0; i < total; ++i) {
            int p = i / kMsgs, k = i % kMsgs;
            rb[i] = xmalloc(msg_size[k]);
            sb[i] = xmalloc(msg_size[k]);
            fill(sb[i], msg_size[k], seed_of(rank, p, msg_size[k], 1000 * round + k));
        }
        if (round == 0)
            for (int i = total - 1; i >= 0; --i) {
                int p = i / kMsgs, k = i % kMsgs;
                MPI_CHECK(MPI_Irecv(rb[i], (int)msg_size[k], MPI_BYTE, p, k, MPI_COMM_WORLD, &rreq[i]));
            }
        for (int i = 0; i < total; ++i) {
            int p = i / kMsgs, k = i % kMsgs;
            MPI_CHECK(MPI_Isend(sb[i], (int)msg_size[k], MPI_BYTE, p, k, MPI_COMM_WORLD, &sreq[i]));
        }
        if (round == 1) {
            /* Let the eager ones arrive unexpected, then post in reverse. */
            MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
            for (int i = total - 1; i >= 0; --i) {
                int p = i / kMsgs, k = i % kMsgs;
                MPI_CHECK(MPI_Irecv(rb[i], (int)msg_size[k], MPI_BYTE, p, k, MPI_COMM_WORLD, &rreq[i]));
            }
        }
        if (round == 0) {
            MPI_CHECK(MPI_Waitall(total, rreq, MPI_STATUSES_IGNORE));
            MPI_CHECK(MPI_Waitall(total, sreq, MPI_STATUSES_IGNORE));
        } else {
            for (int left = total; left > 0; --left) {
                int idx;
                MPI_CHECK(MPI_Waitany(total, rreq, &idx, MPI_STATUS_IGNORE));
                if (idx == MPI_UNDEFINED) die("Waitany: no active request with %d left", left);
            }
            int left = total;
            int *idx = xmalloc(sizeof(int) * total);
            while (left > 0) {
                int outcount = 0;
                MPI_CHECK(MPI_Testsome(total, sreq, &outcount, idx, MPI_STATUSES_IGNORE));
                if (outcount != MPI_UNDEFINED) left -= outcount;
            }
            free(idx);
        }
        for (int i = 0; i < total; ++i) {
            int p = i / kMsgs, k = i % kMsgs;
            verify(rb[i], msg_size[k], seed_of(p, rank, msg_size[k], 1000 * round + k), "many in flight", p);
            free(rb[i]);
            free(sb[i]);
        }
        free(sb);
        free(rb);
        free(sreq);
        free(rreq);
    }
    done("p2p many in flight (64/peer, unexpected, self)");
}

/* The same virtual address backed by new pages between two messages: a
 * registration cached for the old pages must not be used for the new. */
static void p2p_remapped(void) {
    phase("p2p remapped buffers");
    size_t n = max_size < (4u << 20) ? max_size : (4u << 20);
    if (n < 4096) n = 4096;
    int to = (rank + 1) % nranks, from = (rank - 1 + nranks) % nranks;
    uint8_t *rbuf = xmalloc(n);
    for (int it = 0; it < 6; ++it) {
        uint8_t *sbuf = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (sbuf == MAP_FAILED) die("mmap %zu", n);
        fill(sbuf, n, seed_of(rank, to, n, 50 + it));
        MPI_CHECK(MPI_Sendrecv(sbuf, (int)n, MPI_BYTE, to, 9, rbuf, (int)n, MPI_BYTE, from, 9, MPI_COMM_WORLD,
                               MPI_STATUS_IGNORE));
        verify(rbuf, n, seed_of(from, rank, n, 50 + it), "remapped send buffer", from);
        munmap(sbuf, n);
        /* And a received-into buffer that is unmapped and mapped again. */
        uint8_t *rb2 = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (rb2 == MAP_FAILED) die("mmap %zu", n);
        fill(rbuf, n, seed_of(rank, to, n, 70 + it));
        MPI_CHECK(MPI_Sendrecv(rbuf, (int)n, MPI_BYTE, to, 10, rb2, (int)n, MPI_BYTE, from, 10, MPI_COMM_WORLD,
                               MPI_STATUS_IGNORE));
        verify(rb2, n, seed_of(from, rank, n, 70 + it), "remapped receive buffer", from);
        munmap(rb2, n);
    }
    free(rbuf);
    done("p2p buffers unmapped and mapped again");
}

/* -------------------------------------------------------- collectives -- */

static double mono_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void coll_barrier(void) {
    phase("barrier");
    /* All ranks run on one host, so CLOCK_MONOTONIC is one clock: nobody
     * may leave a barrier before the last one entered it. */
    for (int it = 0; it < 20; ++it) {
        if (rank == it % nranks) usleep(20000);
        double times[2];
        times[0] = mono_now();
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        times[1] = mono_now();
        double *all = xmalloc(sizeof(double) * 2 * nranks);
        MPI_CHECK(MPI_Allgather(times, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, MPI_COMM_WORLD));
        double last_in = 0, first_out = 1e300;
        for (int p = 0; p < nranks; ++p) {
            if (all[2 * p] > last_in) last_in = all[2 * p];
            if (all[2 * p + 1] < first_out) first_out = all[2 * p + 1];
        }
        ++checks;
        if (first_out < last_in) die("a rank left barrier %d %.6f s before the last entered", it, last_in - first_out);
        free(all);
    }
    for (int it = 0; it < 200; ++it) MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    done("barrier (ordering checked with one clock)");
}

static void coll_bcast(const size_t *sizes, int nsizes) {
    phase("bcast");
    uint8_t *buf = xmalloc(sizes[nsizes - 1]);
    for (int s = 0; s < nsizes; ++s)
        for (int root = 0; root < nranks; ++root) {
            size_t n = sizes[s];
            if (rank == root)
                fill(buf, n, seed_of(root, 255, n, 5));
            else
                memset(buf, 0, n);
            MPI_CHECK(MPI_Bcast(buf, (int)n, MPI_BYTE, root, MPI_COMM_WORLD));
            verify(buf, n, seed_of(root, 255, n, 5), "bcast", root);
        }
    free(buf);
    done("bcast (every size, every root)");
}

static int64_t contrib(int r, size_t i, int salt) { return (int64_t)(i * 2654435761u % 1000003) * (r + 1) + salt * r - 7; }

static void check_reduced(const int64_t *sum, const int64_t *max, size_t count, int salt, const char *what) {
    ++checks;
    for (size_t i = 0; i < count; ++i) {
        int64_t s = 0, m = INT64_MIN;
        for (int r = 0; r < nranks; ++r) {
            int64_t v = contrib(r, i, salt);
            s += v;
            if (v > m) m = v;
        }
        if (sum[i] != s) die("%s: element %zu of %zu: sum %lld, expected %lld", what, i, count, (long long)sum[i], (long long)s);
        if (max[i] != m) die("%s: element %zu of %zu: max %lld, expected %lld", what, i, count, (long long)max[i], (long long)m);
    }
}

static void coll_reduce(void) {
    phase("reduce/allreduce");
    static const size_t counts[] = {1, 7, 1000, 4096, 100000, 1u << 20};
    for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); ++c) {
        size_t count = counts[c];
        if (count * 8 > max_size && count > 1) continue;
        int64_t *in = xmalloc(count * 8), *sum = xmalloc(count * 8), *max = xmalloc(count * 8);
        for (size_t i = 0; i < count; ++i) in[i] = contrib(rank, i, (int)c);
        for (int root = 0; root < nranks; ++root) {
            memset(sum, 0, count * 8);
            memset(max, 0, count * 8);
            MPI_CHECK(MPI_Reduce(in, sum, (int)count, MPI_INT64_T, MPI_SUM, root, MPI_COMM_WORLD));
            MPI_CHECK(MPI_Reduce(in, max, (int)count, MPI_INT64_T, MPI_MAX, root, MPI_COMM_WORLD));
            if (rank == root) check_reduced(sum, max, count, (int)c, "reduce");
        }
        MPI_CHECK(MPI_Allreduce(in, sum, (int)count, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
        MPI_CHECK(MPI_Allreduce(in, max, (int)count, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));
        check_reduced(sum, max, count, (int)c, "allreduce");
        /* In place. */
        memcpy(sum, in, count * 8);
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sum, (int)count, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD));
        memcpy(max, in, count * 8);
        MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, max, (int)count, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD));
        check_reduced(sum, max, count, (int)c, "allreduce in place");
        free(in);
        free(sum);
        free(max);
    }
    done("reduce, allreduce (sum, max; every root)");
}

static void coll_alltoall(void) {
    phase("alltoall");
    static const size_t blocks[] = {1, 8, 128, 1000, 12288, 65536, 1u << 20};
    for (size_t b = 0; b < sizeof(blocks) / sizeof(blocks[0]); ++b) {
        size_t n = blocks[b];
        if (n * nranks > 2 * max_size && n > 1) continue;
        uint8_t *sb = xmalloc(n * nranks), *rb = xmalloc(n * nranks);
        for (int p = 0; p < nranks; ++p) fill(sb + p * n, n, seed_of(rank, p, n, 6));
        memset(rb, 0, n * nranks);
        MPI_CHECK(MPI_Alltoall(sb, (int)n, MPI_BYTE, rb, (int)n, MPI_BYTE, MPI_COMM_WORLD));
        for (int p = 0; p < nranks; ++p) verify(rb + p * n, n, seed_of(p, rank, n, 6), "alltoall", p);
        free(sb);
        free(rb);
    }
    done("alltoall");
}

static void coll_gather_scatter(void) {
    phase("gather/scatter/allgather");
    static const size_t blocks[] = {1, 100, 4096, 12289, 65536, 1u << 20};
    for (size_t b = 0; b < sizeof(blocks) / sizeof(blocks[0]); ++b) {
        size_t n = blocks[b];
        if (n * nranks > 2 * max_size && n > 1) continue;
        uint8_t *mine = xmalloc(n), *all = xmalloc(n * nranks);
        for (int root = 0; root < nranks; ++root) {
            /* Gather: the root gets every rank's block in rank order. */
            fill(mine, n, seed_of(rank, root, n, 7));
            memset(all, 0, n * nranks);
            MPI_CHECK(MPI_Gather(mine, (int)n, MPI_BYTE, all, (int)n, MPI_BYTE, root, MPI_COMM_WORLD));
            if (rank == root)
                for (int p = 0; p < nranks; ++p) verify(all + p * n, n, seed_of(p, root, n, 7), "gather", p);
            /* Scatter: rank p gets the root's block p. */
            if (rank == root)
                for (int p = 0; p < nranks; ++p) fill(all + p * n, n, seed_of(root, p, n, 8));
            memset(mine, 0, n);
            MPI_CHECK(MPI_Scatter(all, (int)n, MPI_BYTE, mine, (int)n, MPI_BYTE, root, MPI_COMM_WORLD));
            verify(mine, n, seed_of(root, rank, n, 8), "scatter", root);
        }
        fill(mine, n, seed_of(rank, 254, n, 9));
        MPI_CHECK(MPI_Allgather(mine, (int)n, MPI_BYTE, all, (int)n, MPI_BYTE, MPI_COMM_WORLD));
        for (int p = 0; p < nranks; ++p) verify(all + p * n, n, seed_of(p, 254, n, 9), "allgather", p);
        free(mine);
        free(all);
    }
    done("gather, scatter, allgather (every root)");
}

/* ------------------------------------------------------------ one-sided -- */

/* Window layout: nranks slots of `slot` bytes; origin r writes slot r. */
static void rma_fence(MPI_Win win, uint8_t *base, size_t slot, const char *kind) {
    static const size_t sizes[] = {1, 8, 128, 4096, 12289, 65536, 1u << 20};
    uint8_t *src = xmalloc(slot), *dst = xmalloc(slot);
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); ++s) {
        size_t n = sizes[s];
        if (n > slot) continue;
        /* Put: every rank writes its slot in every rank's window (self too). */
        memset(base, 0, slot * nranks);
        MPI_CHECK(MPI_Win_fence(0, win));
        for (int t = 0; t < nranks; ++t) {
            fill(src, n, seed_of(rank, t, n, 20));
            MPI_CHECK(MPI_Put(src, (int)n, MPI_BYTE, t, (MPI_Aint)(rank * slot), (int)n, MPI_BYTE, win));
            /* The origin buffer may be reused only after the fence; keep
             * one per target by writing it again below. */
            MPI_CHECK(MPI_Win_fence(0, win));
        }
        MPI_CHECK(MPI_Win_fence(0, win));
        for (int o = 0; o < nranks; ++o) verify(base + o * slot, n, seed_of(o, rank, n, 20), "put+fence", o);
        /* Get: every rank reads every rank's slot for it. */
        for (int o = 0; o < nranks; ++o) fill(base + o * slot, n, seed_of(rank, o, n, 21));
        MPI_CHECK(MPI_Win_fence(0, win));
        for (int t = 0; t < nranks; ++t) {
            memset(dst, 0, n);
            MPI_CHECK(MPI_Get(dst, (int)n, MPI_BYTE, t, (MPI_Aint)(rank * slot), (int)n, MPI_BYTE, win));
            MPI_CHECK(MPI_Win_fence(0, win));
            verify(dst, n, seed_of(t, rank, n, 21), "get+fence", t);
        }
        MPI_CHECK(MPI_Win_fence(0, win));
    }
    /* Accumulate: every rank adds into every rank's first slot. */
    size_t count = slot / 8;
    if (count > 8192) count = 8192;
    int64_t *acc = (int64_t *)base, *add = xmalloc(count * 8);
    for (int rep = 0; rep < 3; ++rep) {
        memset(base, 0, count * 8);
        MPI_CHECK(MPI_Win_fence(0, win));
        for (size_t i = 0; i < count; ++i) add[i] = contrib(rank, i, rep);
        for (int t = 0; t < nranks; ++t)
            MPI_CHECK(MPI_Accumulate(add, (int)count, MPI_INT64_T, t, 0, (int)count, MPI_INT64_T, MPI_SUM, win));
        MPI_CHECK(MPI_Win_fence(0, win));
        ++checks;
        for (size_t i = 0; i < count; ++i) {
            int64_t s = 0;
            for (int r = 0; r < nranks; ++r) s += contrib(r, i, rep);
            if (acc[i] != s) die("accumulate+fence (%s): element %zu: %lld, expected %lld", kind, i, (long long)acc[i], (long long)s);
        }
        MPI_CHECK(MPI_Win_fence(0, win));
    }
    free(add);
    free(src);
    free(dst);
}

static void rma_lock(MPI_Win win, uint8_t *base, size_t slot, const char *kind) {
    static const size_t sizes[] = {1, 8, 128, 4096, 65536, 1u << 20};
    uint8_t *src = xmalloc(slot), *dst = xmalloc(slot);
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); ++s) {
        size_t n = sizes[s];
        if (n > slot) continue;
        MPI_CHECK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank, 0, win));
        memset(base, 0, slot * nranks);
        MPI_CHECK(MPI_Win_unlock(rank, win));
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        /* Put under an exclusive lock, to every target. */
        for (int t = 0; t < nranks; ++t) {
            fill(src, n, seed_of(rank, t, n, 30));
            MPI_CHECK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, t, 0, win));
            MPI_CHECK(MPI_Put(src, (int)n, MPI_BYTE, t, (MPI_Aint)(rank * slot), (int)n, MPI_BYTE, win));
            MPI_CHECK(MPI_Win_unlock(t, win));
        }
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        MPI_CHECK(MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, win));
        for (int o = 0; o < nranks; ++o) verify(base + o * slot, n, seed_of(o, rank, n, 30), "put+lock", o);
        MPI_CHECK(MPI_Win_unlock(rank, win));
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
        /* Get under a shared lock, from every target, what Put left there. */
        for (int t = 0; t < nranks; ++t) {
            memset(dst, 0, n);
            MPI_CHECK(MPI_Win_lock(MPI_LOCK_SHARED, t, 0, win));
            MPI_CHECK(MPI_Get(dst, (int)n, MPI_BYTE, t, (MPI_Aint)(rank * slot), (int)n, MPI_BYTE, win));
            MPI_CHECK(MPI_Win_unlock(t, win));
            verify(dst, n, seed_of(rank, t, n, 30), "get+lock", t);
        }
        MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    }
    /* Accumulate under exclusive locks, many times from every rank to rank
     * (rep % nranks): a counter and a vector. */
    enum { kReps = 50 };
    size_t count = 512;
    if (count * 8 > slot) count = slot / 8;
    int64_t *add = xmalloc(count * 8);
    MPI_CHECK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, rank, 0, win));
    memset(base, 0, count * 8);
    MPI_CHECK(MPI_Win_unlock(rank, win));
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    for (int rep = 0; rep < kReps; ++rep) {
        int t = rep % nranks;
        for (size_t i = 0; i < count; ++i) add[i] = contrib(rank, i, rep);
        MPI_CHECK(MPI_Win_lock(rep & 1 ? MPI_LOCK_SHARED : MPI_LOCK_EXCLUSIVE, t, 0, win));
        MPI_CHECK(MPI_Accumulate(add, (int)count, MPI_INT64_T, t, 0, (int)count, MPI_INT64_T, MPI_SUM, win));
        MPI_CHECK(MPI_Win_unlock(t, win));
    }
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    MPI_CHECK(MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, win));
    ++checks;
    for (size_t i = 0; i < count; ++i) {
        int64_t s = 0;
        for (int rep = rank; rep < kReps; rep += nranks)
            for (int r = 0; r < nranks; ++r) s += contrib(r, i, rep);
        if (((int64_t *)base)[i] != s)
            die("accumulate+lock (%s): element %zu: %lld, expected %lld", kind, i, (long long)((int64_t *)base)[i],
                (long long)s);
    }
    MPI_CHECK(MPI_Win_unlock(rank, win));
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    free(add);
    free(src);
    free(dst);
}

static void rma(void) {
    size_t slot = max_size < (1u << 20) ? max_size : (1u << 20);
    if (slot < 8 * 512) slot = 8 * 512;
    size_t bytes = slot * nranks;

    phase("one-sided, MPI_Win_allocate");
    uint8_t *base = NULL;
    MPI_Win win;
    MPI_CHECK(MPI_Win_allocate((MPI_Aint)bytes, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win));
    rma_fence(win, base, slot, "Win_allocate");
    rma_lock(win, base, slot, "Win_allocate");
    MPI_CHECK(MPI_Win_free(&win));
    done("one-sided Put/Get/Accumulate, fence+lock (allocate)");

    phase("one-sided, MPI_Win_create");
    base = xmalloc(bytes);
    MPI_CHECK(MPI_Win_create(base, (MPI_Aint)bytes, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &win));
    rma_fence(win, base, slot, "Win_create");
    rma_lock(win, base, slot, "Win_create");
    MPI_CHECK(MPI_Win_free(&win));
    free(base);
    done("one-sided Put/Get/Accumulate, fence+lock (create)");
}

/* ------------------------------------------------------------------ main -- */

/* --only LIST: comma-separated groups (p2p, coll, rma) or tests. */
static int wanted(const char *only, const char *group, const char *test) {
    if (!only) return 1;
    char *list = strdup(only);
    int hit = 0;
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save))
        if (!strcmp(t, group) || !strcmp(t, test)) hit = 1;
    free(list);
    return hit;
}

int main(int argc, char **argv) {
    const char *only = NULL;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--max-size") && i + 1 < argc) {
            max_size = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "--only") && i + 1 < argc) {
            only = argv[++i];
        } else if (!strcmp(argv[i], "-v")) {
            verbose = 1;
        } else {
            if (rank == 0)
                fprintf(stderr, "usage: vrdma-mpi-test [--max-size BYTES] [--only LIST] [-v]\n");
            MPI_Finalize();
            return 2;
        }
    }
    if (max_size > (size_t)1 << 30) max_size = (size_t)1 << 30;
    if (nranks < 2) {
        if (rank == 0) fprintf(stderr, "vrdma-mpi-test: needs at least 2 ranks\n");
        MPI_Finalize();
        return 2;
    }
    char host[256] = "";
    gethostname(host, sizeof(host) - 1);
    const char *guest = getenv("VRDMA_GUEST");
    printf("rank %d of %d: pid %d on %s, vrdma guest %s\n", rank, nranks, (int)getpid(), host, guest ? guest : "(none)");
    fflush(stdout);
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    double t0 = MPI_Wtime();

    int nsizes;
    size_t *sizes = message_sizes(&nsizes);
    if (wanted(only, "p2p", "blocking")) p2p_blocking(sizes, nsizes);
    if (wanted(only, "p2p", "nonblocking")) p2p_nonblocking(sizes, nsizes);
    if (wanted(only, "p2p", "many")) p2p_many();
    if (wanted(only, "p2p", "remapped")) p2p_remapped();
    if (wanted(only, "coll", "barrier")) coll_barrier();
    if (wanted(only, "coll", "bcast")) coll_bcast(sizes, nsizes);
    if (wanted(only, "coll", "reduce")) coll_reduce();
    if (wanted(only, "coll", "alltoall")) coll_alltoall();
    if (wanted(only, "coll", "gather")) coll_gather_scatter();
    if (wanted(only, "rma", "rma")) rma();
    free(sizes);

    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    if (rank == 0)
        printf("vrdma-mpi-test: all checks passed, %d ranks, messages up to %zu bytes, %.1f s\n", nranks, max_size,
               MPI_Wtime() - t0);
    MPI_Finalize();
    return 0;
}
