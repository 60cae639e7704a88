/*
 * Unit tests for trainer/comm/progress.c: ranks (objects in this process)
 * publish their last sequence numbers through one shared table; a rank
 * asks which peers never reached a collective. A store that does not
 * answer in time gives "unknown" (-1), never a hang.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/errors.h"
#include "trainer/comm/progress.h"

/* One table, one trn_kv per rank (each "connection" points at the table). */
struct table {
    pthread_mutex_t mu;
    int n;
    char key[16][160];
    char val[16][32];
    int delay_ms; /* every get sleeps this long first (a slow store) */
};

struct conn {
    struct trn_kv kv;
    struct table *t;
};

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int t_set(struct trn_kv *kv, const char *key, const void *val, size_t len)
{
    struct table *t = ((struct conn *)kv)->t;
    pthread_mutex_lock(&t->mu);
    int i = 0;
    while (i < t->n && strcmp(t->key[i], key) != 0)
        i++;
    if (i == t->n && t->n < 16)
        snprintf(t->key[t->n++], sizeof(t->key[0]), "%s", key);
    if (i < 16)
        snprintf(t->val[i], sizeof(t->val[0]), "%.*s", (int)len, (const char *)val);
    pthread_mutex_unlock(&t->mu);
    return 0;
}

static int t_get(struct trn_kv *kv, const char *key, double timeout_s, void **val, size_t *len)
{
    struct table *t = ((struct conn *)kv)->t;
    sleep_ms(t->delay_ms);
    uint64_t until = cddp_mono_ns() + (uint64_t)(timeout_s * 1e9);
    for (;;) {
        pthread_mutex_lock(&t->mu);
        for (int i = 0; i < t->n; i++) {
            if (strcmp(t->key[i], key) == 0) {
                *len = strlen(t->val[i]);
                *val = strdup(t->val[i]);
                pthread_mutex_unlock(&t->mu);
                return 0;
            }
        }
        pthread_mutex_unlock(&t->mu);
        if (cddp_mono_ns() >= until)
            return CDDP_ETIMEOUT;
        sleep_ms(5);
    }
}

static int t_add(struct trn_kv *kv, const char *key, long delta, long *out)
{
    (void)kv, (void)key, (void)delta, (void)out;
    return CDDP_ESTATE;
}

static const struct trn_kv_ops t_ops = {t_set, t_get, t_add};

static int keys(struct table *t)
{
    pthread_mutex_lock(&t->mu);
    int n = t->n;
    pthread_mutex_unlock(&t->mu);
    return n;
}

static void wait_keys(struct table *t, int n)
{
    uint64_t until = cddp_mono_ns() + 20000000000u;
    while (keys(t) < n && cddp_mono_ns() < until)
        sleep_ms(10);
    assert_true(keys(t) >= n);
}

static void test_missing_ranks(void **state)
{
    (void)state;
    struct table t = {.n = 0};
    pthread_mutex_init(&t.mu, NULL);
    struct conn c[4];
    struct trn_comm_progress *p[4];
    for (int r = 0; r < 4; r++) {
        c[r] = (struct conn){.kv = {.ops = &t_ops}, .t = &t};
        assert_int_equal(trn_comm_progress_start(&c[r].kv, 1, 2, r, 4, 0.02, &p[r]), 0);
    }
    /* Rank 3 never enqueued anything: it publishes nothing (unknown). */
    trn_comm_progress_note(p[0], 9);
    trn_comm_progress_note(p[1], 4);
    trn_comm_progress_note(p[2], 9);
    wait_keys(&t, 3);
    assert_non_null(strstr(t.key[0], "cddp/nccl/progress/restart_1/round_2/rank_"));
    int out[4] = {-1, -1, -1, -1};
    /* Rank 0 timed out in #9: rank 1 stopped at #4; rank 2 is in it too. */
    assert_int_equal(trn_comm_progress_missing(p[0], 9, 10.0, out, 4), 1);
    assert_int_equal(out[0], 1);
    /* Rank 2 went on to #11 (rank 0 is stuck in #9, waiting for rank 1):
     * both 0 and 1 never reached #11, and rank 1 is the one furthest behind. */
    trn_comm_progress_note(p[2], 11);
    uint64_t until2 = cddp_mono_ns() + 20000000000u;
    while (trn_comm_progress_missing(p[2], 11, 10.0, out, 4) != 2 && cddp_mono_ns() < until2)
        sleep_ms(20);
    assert_int_equal(trn_comm_progress_missing(p[2], 11, 10.0, out, 4), 2);
    assert_int_equal(trn_comm_progress_lowest(p[2], 11, 10.0, out, 4), 1);
    assert_int_equal(out[0], 1);
    trn_comm_progress_note(p[2], 9);
    /* Later numbers are published again (only when they change). */
    trn_comm_progress_note(p[1], 12);
    uint64_t until = cddp_mono_ns() + 20000000000u;
    int n;
    while ((n = trn_comm_progress_missing(p[0], 9, 10.0, out, 4)) != 0 && cddp_mono_ns() < until)
        sleep_ms(20);
    assert_int_equal(n, 0);
    /* Rank 2 asks about #10: ranks 0 (at 9) is missing; 1 is past it. */
    assert_int_equal(trn_comm_progress_missing(p[2], 10, 10.0, out, 4), 1);
    assert_int_equal(out[0], 0);
    for (int r = 0; r < 4; r++)
        trn_comm_progress_stop(p[r]);
    pthread_mutex_destroy(&t.mu);
}

static void test_slow_store_is_unknown(void **state)
{
    (void)state;
    struct table t = {.n = 0, .delay_ms = 1500};
    pthread_mutex_init(&t.mu, NULL);
    struct conn c = {.kv = {.ops = &t_ops}, .t = &t};
    struct trn_comm_progress *p;
    assert_int_equal(trn_comm_progress_start(&c.kv, 0, 0, 0, 3, 0.02, &p), 0);
    int out[3];
    uint64_t t0 = cddp_mono_ns();
    assert_int_equal(trn_comm_progress_missing(p, 5, 0.3, out, 3), -1);
    assert_true(cddp_mono_ns() - t0 < 1200000000u); /* the budget, not the store's pace */
    trn_comm_progress_stop(p);
    pthread_mutex_destroy(&t.mu);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    struct table t = {.n = 0};
    struct conn c = {.kv = {.ops = &t_ops}, .t = &t};
    struct trn_comm_progress *p = (struct trn_comm_progress *)&c;
    assert_int_equal(trn_comm_progress_start(&c.kv, 0, 0, 3, 3, 1, &p), CDDP_ERANGE_ARG);
    assert_null(p);
    assert_int_equal(trn_comm_progress_start(NULL, 0, 0, 0, 3, 1, &p), CDDP_ERANGE_ARG);
    trn_comm_progress_stop(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_ranks),
        cmocka_unit_test(test_slow_store_is_unknown),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
