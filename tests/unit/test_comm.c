/*
 * Unit tests for trainer/comm/: the communicator over real gloo (TCP on
 * loopback), ranks as threads of this process sharing an in-process
 * key-value table (the bootstrap store's job in cddp-train), and the
 * world-size-1 path. Process-level tests (bootstrap store, timeouts with
 * exit 75 and the error file) are in tests/integration/test_comm.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/errors.h"
#include "trainer/comm/comm.h"

/* ---- an in-process trn_kv: a table under a mutex, get waits on a condvar ---- */

#define MEMKV_MAX 256

struct memkv {
    struct trn_kv kv;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n;
    char keys[MEMKV_MAX][128];
    void *vals[MEMKV_MAX];
    size_t lens[MEMKV_MAX];
};

static int memkv_find(struct memkv *m, const char *key)
{
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->keys[i], key) == 0)
            return i;
    return -1;
}

static int memkv_set(struct trn_kv *kv, const char *key, const void *val, size_t len)
{
    struct memkv *m = (struct memkv *)kv;
    pthread_mutex_lock(&m->mu);
    int i = memkv_find(m, key);
    if (i < 0) {
        assert_true(m->n < MEMKV_MAX);
        i = m->n++;
        snprintf(m->keys[i], sizeof(m->keys[i]), "%s", key);
    } else {
        free(m->vals[i]);
    }
    m->vals[i] = malloc(len ? len : 1);
    memcpy(m->vals[i], val, len);
    m->lens[i] = len;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    return 0;
}

static int memkv_get(struct trn_kv *kv, const char *key, double timeout_s, void **val, size_t *len)
{
    struct memkv *m = (struct memkv *)kv;
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    uint64_t ns = (uint64_t)dl.tv_nsec + (uint64_t)(timeout_s * 1e9);
    dl.tv_sec += (time_t)(ns / 1000000000u);
    dl.tv_nsec = (long)(ns % 1000000000u);
    pthread_mutex_lock(&m->mu);
    int i;
    while ((i = memkv_find(m, key)) < 0) {
        if (pthread_cond_timedwait(&m->cv, &m->mu, &dl) != 0 && memkv_find(m, key) < 0) {
            pthread_mutex_unlock(&m->mu);
            snprintf(kv->err, sizeof(kv->err), "key '%s' not set within %.1f s", key, timeout_s);
            return CDDP_ETIMEOUT;
        }
    }
    *val = malloc(m->lens[i] ? m->lens[i] : 1);
    memcpy(*val, m->vals[i], m->lens[i]);
    *len = m->lens[i];
    pthread_mutex_unlock(&m->mu);
    return 0;
}

static int memkv_add(struct trn_kv *kv, const char *key, long delta, long *out)
{
    (void)kv;
    (void)key;
    (void)delta;
    (void)out;
    return CDDP_ESTATE;
}

static const struct trn_kv_ops memkv_ops = {memkv_set, memkv_get, memkv_add};

static struct memkv *memkv_new(void)
{
    struct memkv *m = calloc(1, sizeof(*m));
    m->kv.ops = &memkv_ops;
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    return m;
}

static void memkv_free(struct memkv *m)
{
    for (int i = 0; i < m->n; i++)
        free(m->vals[i]);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

/* ---- running N ranks as threads ---- */

struct rank_ctx {
    int rank, world;
    struct memkv *kv;
    double timeout_s;
    double init_timeout_s;
    void (*body)(struct rank_ctx *r, struct trn_comm *c);
    int create_rc;
    struct trn_comm_error create_err;
    char failure[512];       /* set by the body on a wrong result */
    pthread_barrier_t *sync; /* shared by the threads of one test */
};

static void *rank_main(void *arg)
{
    struct rank_ctx *r = arg;
    struct trn_comm_options o = {
        .rank = r->rank,
        .world = r->world,
        .timeout_s = r->timeout_s,
        .init_timeout_s = r->init_timeout_s > 0 ? r->init_timeout_s : 20,
        .host = "127.0.0.1",
    };
    struct trn_comm *c = NULL;
    r->create_rc = trn_comm_create(&o, &r->kv->kv, &c, &r->create_err);
    if (r->create_rc == 0) {
        r->body(r, c);
        trn_comm_destroy(c);
    }
    return NULL;
}

static void run_ranks(int world, double timeout_s,
                      void (*body)(struct rank_ctx *, struct trn_comm *), struct rank_ctx *ctx)
{
    struct memkv *kv = memkv_new();
    pthread_t th[8];
    pthread_barrier_t sync;
    pthread_barrier_init(&sync, NULL, (unsigned)world);
    for (int i = 0; i < world; i++) {
        ctx[i] = (struct rank_ctx){.rank = i,
                                   .world = world,
                                   .kv = kv,
                                   .timeout_s = timeout_s,
                                   .body = body,
                                   .sync = &sync};
        assert_int_equal(pthread_create(&th[i], NULL, rank_main, &ctx[i]), 0);
    }
    for (int i = 0; i < world; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&sync);
    memkv_free(kv);
    for (int i = 0; i < world; i++) {
        if (ctx[i].create_rc != 0)
            fail_msg("rank %d: create: %s", i, ctx[i].create_err.detail);
        if (ctx[i].failure[0])
            fail_msg("rank %d: %s", i, ctx[i].failure);
    }
}

#define CHECK(r, cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond) && !(r)->failure[0])                                                           \
            snprintf((r)->failure, sizeof((r)->failure), __VA_ARGS__);                             \
    } while (0)

/* Sizes not multiples of anything: gloo splits buffers into per-rank chunks. */
static const size_t counts[] = {1, 2, 3, 7, 1000, 65537, 262147};

static void body_collectives(struct rank_ctx *r, struct trn_comm *c)
{
    int rank = r->rank, world = r->world;
    CHECK(r, trn_comm_rank(c) == rank && trn_comm_world(c) == world, "rank/world");
    CHECK(r, strcmp(trn_comm_backend(c), "gloo") == 0, "backend %s", trn_comm_backend(c));
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        size_t n = counts[k];
        float *f = malloc(n * sizeof(float));
        double *d = malloc(n * sizeof(double));
        int64_t *q = malloc(n * sizeof(int64_t));
        for (size_t i = 0; i < n; i++) {
            f[i] = (float)((rank + 1) * (int)(i % 97)); /* small integers: exact sums */
            d[i] = 0.5 * (rank + 1) + (double)i;
            q[i] = (int64_t)(i % 13) * (rank == 1 ? -1 : rank + 2);
        }
        CHECK(r, trn_comm_allreduce(c, f, n, TRN_COMM_F32, TRN_COMM_SUM) == 0, "allreduce f32");
        CHECK(r, trn_comm_allreduce(c, d, n, TRN_COMM_F64, TRN_COMM_AVG) == 0, "allreduce avg");
        CHECK(r, trn_comm_allreduce(c, q, n, TRN_COMM_I64, TRN_COMM_MAX) == 0, "allreduce max");
        float sumw = (float)(world * (world + 1) / 2);
        double avg = 0;
        for (int j = 0; j < world; j++)
            avg += 0.5 * (j + 1);
        avg /= world;
        int64_t maxw = world > 2 ? world + 1 : 2;
        for (size_t i = 0; i < n; i++) {
            CHECK(r, f[i] == sumw * (float)(i % 97), "f32 sum n=%zu [%zu]=%g", n, i, f[i]);
            CHECK(r, fabs(d[i] - (avg + (double)i)) < 1e-9, "avg n=%zu [%zu]=%g", n, i, d[i]);
            CHECK(r, q[i] == (int64_t)(i % 13) * maxw, "max n=%zu [%zu]=%lld", n, i,
                  (long long)q[i]);
        }
        /* broadcast from the last rank */
        for (size_t i = 0; i < n; i++)
            d[i] = rank == world - 1 ? (double)i * 3 : -1.0;
        CHECK(r, trn_comm_broadcast(c, d, n, TRN_COMM_F64, world - 1) == 0, "broadcast");
        for (size_t i = 0; i < n; i++)
            CHECK(r, d[i] == (double)i * 3, "broadcast n=%zu [%zu]=%g", n, i, d[i]);
        free(f);
        free(d);
        free(q);
    }
    /* allgather, odd counts and bytes; both from a separate buffer and in place */
    for (size_t n = 1; n <= 9; n += 4) {
        uint8_t send[16];
        uint8_t *recv = malloc(n * (size_t)world);
        for (size_t i = 0; i < n; i++)
            send[i] = (uint8_t)(rank * 16 + (int)i);
        CHECK(r, trn_comm_allgather(c, send, recv, n, TRN_COMM_U8) == 0, "allgather");
        for (int j = 0; j < world; j++)
            for (size_t i = 0; i < n; i++)
                CHECK(r, recv[(size_t)j * n + i] == (uint8_t)(j * 16 + (int)i),
                      "allgather n=%zu block %d", n, j);
        memset(recv, 0, n * (size_t)world);
        memcpy(recv + (size_t)rank * n, send, n);
        CHECK(r, trn_comm_allgather(c, recv + (size_t)rank * n, recv, n, TRN_COMM_U8) == 0,
              "allgather in place");
        for (int j = 0; j < world; j++)
            CHECK(r, recv[(size_t)j * n] == (uint8_t)(j * 16), "allgather in place block %d", j);
        free(recv);
    }
    CHECK(r, trn_comm_barrier(c) == 0, "barrier");
    /* zero elements: a no-op on every rank */
    CHECK(r, trn_comm_allreduce(c, NULL, 0, TRN_COMM_F32, TRN_COMM_SUM) == 0, "empty");
}

static void test_gloo_collectives(void **state)
{
    (void)state;
    struct rank_ctx ctx[4];
    for (int world = 2; world <= 4; world++)
        run_ranks(world, 30, body_collectives, ctx);
}

/* Several async allreduces in flight at once, waited in order (DDP buckets). */
static void body_async(struct rank_ctx *r, struct trn_comm *c)
{
    enum { NB = 6, N = 40001 };
    struct trn_comm_work w[NB];
    float *bufs[NB];
    for (int b = 0; b < NB; b++) {
        bufs[b] = malloc(N * sizeof(float));
        for (int i = 0; i < N; i++)
            bufs[b][i] = (float)(b + r->rank);
        CHECK(r, trn_comm_allreduce_start(c, &w[b], bufs[b], N, TRN_COMM_F32, TRN_COMM_AVG) == 0,
              "start %d", b);
    }
    for (int b = 0; b < NB; b++) {
        CHECK(r, trn_comm_wait(c, &w[b]) == 0, "wait %d", b);
        float want = (float)b + (float)(r->world - 1) / 2.0f;
        for (int i = 0; i < N; i++)
            CHECK(r, fabsf(bufs[b][i] - want) < 1e-6f, "bucket %d [%d]=%g want %g", b, i,
                  bufs[b][i], want);
        free(bufs[b]);
    }
    /* A synchronous collective issued while async work is queued runs after it. */
    float x[3] = {1, 2, 3};
    struct trn_comm_work w2;
    CHECK(r, trn_comm_allreduce_start(c, &w2, x, 3, TRN_COMM_F32, TRN_COMM_SUM) == 0, "start");
    CHECK(r, trn_comm_barrier(c) == 0, "barrier after start");
    CHECK(r, trn_comm_wait(c, &w2) == 0, "wait after barrier");
    CHECK(r, x[2] == 3.0f * (float)r->world, "x[2]=%g", x[2]);
}

static void test_gloo_async(void **state)
{
    (void)state;
    struct rank_ctx ctx[3];
    run_ranks(3, 30, body_async, ctx);
}

/* Rank 1 never calls: rank 0's allreduce fails with ETIMEOUT after ~1 s;
 * then the communicator is broken. */
static void body_timeout(struct rank_ctx *r, struct trn_comm *c)
{
    if (r->rank == 1) {
        pthread_barrier_wait(r->sync); /* until rank 0 has seen its timeout */
        return;
    }
    float x[1000] = {0};
    uint64_t t0 = cddp_mono_ns();
    int rc = trn_comm_allreduce(c, x, 1000, TRN_COMM_F32, TRN_COMM_SUM);
    double took = (double)(cddp_mono_ns() - t0) * 1e-9;
    const struct trn_comm_error *e = trn_comm_last_error(c);
    CHECK(r, rc == CDDP_ETIMEOUT, "rc %d (%s)", rc, e->detail);
    CHECK(r, e->code == CDDP_ETIMEOUT, "error code %d", e->code);
    CHECK(r, strcmp(e->op, "allreduce") == 0, "op %s", e->op);
    CHECK(r, e->waited_s >= 0.9 && e->waited_s < 5.0, "waited %.2f s", e->waited_s);
    CHECK(r, took < 6.0, "took %.2f s", took);
    CHECK(r, e->timeout_s == 1.0, "timeout %.1f", e->timeout_s);
    CHECK(r, e->bytes == 4000, "bytes %zu", e->bytes);
    CHECK(r, strstr(e->detail, "imed out") != NULL, "detail '%s'", e->detail);
    /* broken from now on, and the first error stays */
    CHECK(r, trn_comm_barrier(c) == CDDP_ESTATE, "barrier after failure");
    struct trn_comm_work w;
    CHECK(r, trn_comm_allreduce_start(c, &w, x, 1, TRN_COMM_F32, TRN_COMM_SUM) == CDDP_ESTATE,
          "start after failure");
    CHECK(r, strcmp(trn_comm_last_error(c)->op, "allreduce") == 0, "first error kept");
    pthread_barrier_wait(r->sync);
}

static void test_gloo_timeout(void **state)
{
    (void)state;
    struct rank_ctx ctx[2];
    run_ranks(2, 1.0, body_timeout, ctx);
}

/* Rank 1 leaves (its communicator is destroyed, sockets closed) while rank 0
 * waits in an allreduce: rank 0 fails fast with EPEER, not after the timeout. */
static void body_peer_gone(struct rank_ctx *r, struct trn_comm *c)
{
    if (r->rank == 1) {
        pthread_barrier_wait(r->sync);
        trn_comm_barrier(c); /* pairs up with rank 0's barrier */
        return;              /* rank_main destroys the communicator */
    }
    pthread_barrier_wait(r->sync);
    CHECK(r, trn_comm_barrier(c) == 0, "barrier");
    float x[100000] = {0};
    uint64_t t0 = cddp_mono_ns();
    int rc = trn_comm_allreduce(c, x, 100000, TRN_COMM_F32, TRN_COMM_SUM);
    double took = (double)(cddp_mono_ns() - t0) * 1e-9;
    const struct trn_comm_error *e = trn_comm_last_error(c);
    CHECK(r, rc == CDDP_EPEER, "rc %d (%s)", rc, e->detail);
    CHECK(r, took < 10.0, "took %.2f s: not fast", took);
    CHECK(r, e->detail[0] != '\0', "no detail");
}

static void test_gloo_peer_gone(void **state)
{
    (void)state;
    struct rank_ctx ctx[2];
    run_ranks(2, 30.0, body_peer_gone, ctx);
}

/* Point to point: rank 0 sends to rank 2 (odd sizes, several in a row, in
 * order), rank 1 takes no part; the collectives after it keep the same
 * sequence number on every rank. */
static void body_p2p(struct rank_ctx *r, struct trn_comm *c)
{
    CHECK(r, trn_comm_has_p2p(c), "gloo has p2p");
    CHECK(r, trn_comm_barrier(c) == 0, "barrier"); /* seq 1 */
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        size_t n = counts[k];
        float *f = malloc(n * sizeof(float));
        int64_t *q = malloc(n * sizeof(int64_t));
        for (size_t i = 0; i < n; i++) {
            f[i] = r->rank == 0 ? (float)(i % 1013) + 0.5f : -1.0f;
            q[i] = r->rank == 0 ? (int64_t)i * 7 - 3 : 0;
        }
        if (r->rank == 0) {
            CHECK(r, trn_comm_send(c, f, n, TRN_COMM_F32, 2) == 0, "send f32 n=%zu", n);
            CHECK(r, trn_comm_send(c, q, n, TRN_COMM_I64, 2) == 0, "send i64 n=%zu", n);
        } else if (r->rank == 2) {
            CHECK(r, trn_comm_recv(c, f, n, TRN_COMM_F32, 0) == 0, "recv f32 n=%zu", n);
            CHECK(r, trn_comm_recv(c, q, n, TRN_COMM_I64, 0) == 0, "recv i64 n=%zu", n);
        }
        for (size_t i = 0; i < n; i++) {
            float want = r->rank == 1 ? -1.0f : (float)(i % 1013) + 0.5f;
            CHECK(r, f[i] == want, "n=%zu f[%zu]=%g", n, i, f[i]);
            CHECK(r, q[i] == (r->rank == 1 ? 0 : (int64_t)i * 7 - 3), "n=%zu q[%zu]", n, i);
        }
        free(f);
        free(q);
    }
    /* arguments: self, out of range, nothing to move (both ends skip it) */
    float x[1] = {0};
    CHECK(r, trn_comm_send(c, x, 1, TRN_COMM_F32, r->rank) == CDDP_ERANGE_ARG, "send to self");
    CHECK(r, trn_comm_recv(c, x, 1, TRN_COMM_F32, 3) == CDDP_ERANGE_ARG, "recv from 3");
    CHECK(r, trn_comm_send(c, NULL, 1, TRN_COMM_F32, (r->rank + 1) % 3) == CDDP_ERANGE_ARG,
          "send NULL");
    CHECK(r, trn_comm_send(c, NULL, 0, TRN_COMM_F32, (r->rank + 1) % 3) == 0, "send nothing");
    struct trn_comm_work w;
    CHECK(r, trn_comm_allreduce_start(c, &w, x, 1, TRN_COMM_F32, TRN_COMM_SUM) == 0, "start");
    CHECK(r, trn_comm_wait(c, &w) == 0, "allreduce after p2p");
    CHECK(r, w.seq == 2, "the allreduce after the sends is #%llu, not #2",
          (unsigned long long)w.seq);
    CHECK(r, trn_comm_last_error(c)->code == 0, "no error");
}

static void test_gloo_p2p(void **state)
{
    (void)state;
    struct rank_ctx ctx[3];
    run_ranks(3, 30, body_p2p, ctx);
}

/* A receive whose sender never sends fails like a collective: ETIMEOUT,
 * op "recv", no sequence number; then the communicator is broken. A
 * receive from a peer that leaves fails with EPEER before the timeout. */
static void body_p2p_fail(struct rank_ctx *r, struct trn_comm *c)
{
    float x[1000] = {0};
    if (r->rank == 1) {
        pthread_barrier_wait(r->sync); /* until rank 0's receive timed out */
        return;                        /* rank_main destroys the communicator */
    }
    int rc = trn_comm_recv(c, x, 1000, TRN_COMM_F32, 1);
    const struct trn_comm_error *e = trn_comm_last_error(c);
    CHECK(r, rc == CDDP_ETIMEOUT, "rc %d (%s)", rc, e->detail);
    CHECK(r, strcmp(e->op, "recv") == 0 && e->coll == TRN_COLL_RECV, "op %s", e->op);
    CHECK(r, e->bytes == 4000 && e->seq == 0, "bytes %zu seq %llu", e->bytes,
          (unsigned long long)e->seq);
    CHECK(r, e->waited_s >= 0.9 && e->waited_s < 5.0, "waited %.2f s", e->waited_s);
    CHECK(r, strstr(e->detail, "imed out") != NULL, "detail '%s'", e->detail);
    CHECK(r, trn_comm_send(c, x, 1, TRN_COMM_F32, 1) == CDDP_ESTATE, "send after failure");
    CHECK(r, trn_comm_missing(c, 1.0, (int[2]){0}, 2) == -1, "no missing ranks for a recv");
    pthread_barrier_wait(r->sync);
}

static void body_p2p_peer_gone(struct rank_ctx *r, struct trn_comm *c)
{
    if (r->rank == 1) {
        trn_comm_barrier(c);
        return; /* rank_main destroys the communicator */
    }
    CHECK(r, trn_comm_barrier(c) == 0, "barrier");
    float *x = calloc(1000000, sizeof(float));
    uint64_t t0 = cddp_mono_ns();
    int rc = trn_comm_recv(c, x, 1000000, TRN_COMM_F32, 1);
    double took = (double)(cddp_mono_ns() - t0) * 1e-9;
    const struct trn_comm_error *e = trn_comm_last_error(c);
    CHECK(r, rc == CDDP_EPEER, "rc %d (%s)", rc, e->detail);
    CHECK(r, strcmp(e->op, "recv") == 0, "op %s", e->op);
    CHECK(r, took < 10.0, "took %.2f s: not fast", took);
    free(x);
}

static void test_gloo_p2p_fail(void **state)
{
    (void)state;
    struct rank_ctx ctx[2];
    run_ranks(2, 1.0, body_p2p_fail, ctx);
    run_ranks(2, 30.0, body_p2p_peer_gone, ctx);
}

/* World 2 but only rank 0 shows up: create fails after the init timeout. */
static void test_gloo_connect_timeout(void **state)
{
    (void)state;
    struct memkv *kv = memkv_new();
    struct trn_comm_options o = {.rank = 0, .world = 2, .init_timeout_s = 1.0, .host = "127.0.0.1"};
    struct trn_comm *c = (struct trn_comm *)1;
    struct trn_comm_error e;
    uint64_t t0 = cddp_mono_ns();
    int rc = trn_comm_create(&o, &kv->kv, &c, &e);
    double took = (double)(cddp_mono_ns() - t0) * 1e-9;
    assert_true(rc < 0);
    assert_null(c);
    assert_string_equal(e.op, "connect");
    assert_non_null(strstr(e.detail, "gloo/rank1"));
    assert_true(took >= 0.9 && took < 5.0);
    memkv_free(kv);
}

static void test_local(void **state)
{
    (void)state;
    struct trn_comm_options o = {.rank = 0, .world = 1};
    struct trn_comm *c;
    struct trn_comm_error e;
    assert_int_equal(trn_comm_create(&o, NULL, &c, &e), 0);
    assert_string_equal(trn_comm_backend(c), "local");
    assert_true(trn_comm_timeout(c) == TRN_COMM_DEFAULT_TIMEOUT_S);
    float x[5] = {1, 2, 3, 4, 5};
    assert_int_equal(trn_comm_allreduce(c, x, 5, TRN_COMM_F32, TRN_COMM_SUM), 0);
    assert_int_equal(trn_comm_allreduce(c, x, 5, TRN_COMM_F32, TRN_COMM_AVG), 0);
    assert_true(x[4] == 5.0f);
    assert_int_equal(trn_comm_broadcast(c, x, 5, TRN_COMM_F32, 0), 0);
    float y[5] = {0};
    assert_int_equal(trn_comm_allgather(c, x, y, 5, TRN_COMM_F32), 0);
    assert_memory_equal(x, y, sizeof(x));
    assert_int_equal(trn_comm_barrier(c), 0);
    struct trn_comm_work w;
    assert_int_equal(trn_comm_allreduce_start(c, &w, x, 5, TRN_COMM_F32, TRN_COMM_SUM), 0);
    assert_int_equal(trn_comm_wait(c, &w), 0);
    /* argument checks */
    int32_t i[2] = {0};
    assert_int_equal(trn_comm_allreduce(c, i, 2, TRN_COMM_I32, TRN_COMM_AVG), CDDP_ERANGE_ARG);
    assert_int_equal(trn_comm_broadcast(c, x, 5, TRN_COMM_F32, 1), CDDP_ERANGE_ARG);
    assert_int_equal(trn_comm_allreduce(c, NULL, 5, TRN_COMM_F32, TRN_COMM_SUM), CDDP_ERANGE_ARG);
    assert_int_equal(trn_comm_allreduce(c, x, 5, (enum trn_comm_dtype)42, TRN_COMM_SUM),
                     CDDP_ERANGE_ARG);
    /* no point to point without peers; the communicator stays usable */
    assert_false(trn_comm_has_p2p(c));
    assert_int_equal(trn_comm_send(c, x, 5, TRN_COMM_F32, 0), CDDP_ERR_FROM_ERRNO(ENOTSUP));
    assert_int_equal(trn_comm_recv(c, x, 5, TRN_COMM_F32, 0), CDDP_ERR_FROM_ERRNO(ENOTSUP));
    /* bad arguments do not break the communicator */
    assert_int_equal(trn_comm_barrier(c), 0);
    assert_int_equal(trn_comm_last_error(c)->code, 0);
    trn_comm_destroy(c);

    o.rank = 1;
    assert_int_equal(trn_comm_create(&o, NULL, &c, &e), CDDP_ERANGE_ARG);
    o = (struct trn_comm_options){.rank = 0, .world = 2, .backend = "mpi"};
    struct memkv *kv = memkv_new();
    assert_int_equal(trn_comm_create(&o, &kv->kv, &c, &e), CDDP_ECONFIG);
    assert_non_null(strstr(e.detail, "unknown comm backend 'mpi'"));
    memkv_free(kv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_local),          cmocka_unit_test(test_gloo_collectives),
        cmocka_unit_test(test_gloo_async),     cmocka_unit_test(test_gloo_timeout),
        cmocka_unit_test(test_gloo_peer_gone), cmocka_unit_test(test_gloo_connect_timeout),
        cmocka_unit_test(test_gloo_p2p),       cmocka_unit_test(test_gloo_p2p_fail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
