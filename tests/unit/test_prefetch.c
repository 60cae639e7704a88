/* Unit tests for trainer/prefetch.c: the batch sources, and the loader's
 * ring over a fake dataset (order, the failed batch, freeing early, the
 * signal mask, the host allocator). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/prefetch.h"

/* A dataset of 1x2x2 samples: sample i is (i, i + 0.25, i + 0.5, i + 0.75),
 * label i % 7; sample `bad` fails to read. Records whether SIGTERM was
 * blocked on every thread that read. */
struct fake {
    struct trn_dataset d;
    long bad;
    atomic_int unblocked, reads;
};

static int fake_get(const struct trn_dataset *d, size_t index, float *chw, int32_t *label,
                    char *err, size_t errlen)
{
    struct fake *f = (struct fake *)d;
    sigset_t cur;
    pthread_sigmask(SIG_SETMASK, NULL, &cur);
    if (!sigismember(&cur, SIGTERM) || !sigismember(&cur, SIGINT) || !sigismember(&cur, SIGALRM))
        atomic_fetch_add(&f->unblocked, 1);
    atomic_fetch_add(&f->reads, 1);
    if ((long)index == f->bad) {
        snprintf(err, errlen, "fake: sample %zu is corrupt", index);
        return -5;
    }
    for (int k = 0; k < 4; k++)
        chw[k] = (float)index + 0.25f * (float)k;
    *label = (int32_t)(index % 7);
    return 0;
}

static void fake_init(struct fake *f, size_t len, long bad)
{
    memset(f, 0, sizeof(*f));
    f->d.kind = "fake";
    f->d.len = len;
    f->d.channels = 1;
    f->d.height = 2;
    f->d.width = 2;
    f->d.num_classes = 7;
    f->d.get = fake_get;
    f->bad = bad;
}

/* Training's batches are the sampler's, epoch after epoch, from `first`. */
static void test_train_batches_follow_sampler(void **state)
{
    (void)state;
    struct trn_sampler s;
    assert_int_equal(trn_sampler_init(&s, 23, 2, 1, true, false, 5), 0); /* 12 per epoch */
    struct trn_train_batches t;
    assert_int_equal(trn_train_batches_init(&t, &s, 5, 1, 1, 4), 0); /* epochs 1..3, from b 1 */
    uint32_t idx[5];
    for (int epoch = 1; epoch < 4; epoch++) {
        trn_sampler_set_epoch(&s, epoch);
        for (long b = epoch == 1 ? 1 : 0; b < 3; b++) {
            int want = b == 2 ? 2 : 5;
            assert_int_equal(trn_train_batches_next(&t, idx), want);
            assert_memory_equal(idx, s.indices + b * 5, (size_t)want * sizeof(uint32_t));
        }
    }
    assert_int_equal(trn_train_batches_next(&t, idx), 0);
    assert_int_equal(trn_train_batches_next(&t, idx), 0);
    assert_ptr_not_equal(t.sampler.indices, s.indices); /* its own arrays */
    trn_train_batches_free(&t);
    trn_sampler_free(&s);
}

static void test_list_batches(void **state)
{
    (void)state;
    uint32_t list[7] = {3, 1, 4, 1, 5, 9, 2}, idx[3];
    struct trn_list_batches l = {.idx = list, .len = 7, .batch = 3};
    assert_int_equal(trn_list_batches_next(&l, idx), 3);
    assert_memory_equal(idx, list, 3 * sizeof(uint32_t));
    assert_int_equal(trn_list_batches_next(&l, idx), 3);
    assert_int_equal(trn_list_batches_next(&l, idx), 1);
    assert_int_equal(idx[0], 2);
    assert_int_equal(trn_list_batches_next(&l, idx), 0);
}

static void check_batch(const struct trn_batch *b, const uint32_t *want, int n)
{
    assert_non_null(b);
    assert_int_equal(b->rc, 0);
    assert_int_equal(b->n, n);
    for (int i = 0; i < n; i++) {
        assert_int_equal(b->idx[i], want[i]);
        assert_int_equal(b->labels[i], (int32_t)(want[i] % 7));
        for (int k = 0; k < 4; k++)
            assert_true(b->x[i * 4 + k] == (float)want[i] + 0.25f * (float)k);
    }
}

struct counting {
    int allocs, frees;
};

static void *count_alloc(void *arg, size_t bytes)
{
    ((struct counting *)arg)->allocs++;
    return malloc(bytes);
}

static void count_free(void *arg, void *p)
{
    ((struct counting *)arg)->frees++;
    free(p);
}

/* Every batch in order, whatever the depth, holding one or two at a time. */
static void test_order(void **state)
{
    (void)state;
    struct fake f;
    fake_init(&f, 50, -1);
    uint32_t list[50];
    for (int i = 0; i < 50; i++)
        list[i] = (uint32_t)((i * 17) % 50);
    for (int ahead = 1; ahead <= 4; ahead++) {
        for (int hold = 1; hold <= 2; hold++) {
            struct counting c = {0};
            struct trn_list_batches l = {.idx = list, .len = 50, .batch = 8};
            struct trn_prefetch_opts o = {.data = &f.d,
                                          .batch = 8,
                                          .ahead = ahead,
                                          .threads = 2,
                                          .next = trn_list_batches_next,
                                          .next_arg = &l,
                                          .host = {count_alloc, count_free, &c}};
            struct trn_prefetch *p;
            char err[256];
            assert_int_equal(trn_prefetch_start(&p, &o, err, sizeof(err)), 0);
            assert_int_equal(c.allocs, ahead + 2);
            struct trn_batch *held = NULL;
            for (int b = 0; b < 7; b++) {
                struct trn_batch *e = trn_prefetch_next(p);
                check_batch(e, list + b * 8, b == 6 ? 2 : 8);
                if (hold == 1) {
                    trn_prefetch_release(p, e);
                } else {
                    if (held)
                        trn_prefetch_release(p, held);
                    held = e;
                }
            }
            assert_null(trn_prefetch_next(p));
            assert_null(trn_prefetch_next(p));
            assert_true(trn_prefetch_wait_s(p) >= 0);
            trn_prefetch_free(p);
            assert_int_equal(c.frees, c.allocs);
        }
    }
    assert_int_equal(atomic_load(&f.unblocked), 0);
}

/* A sample that fails: the batches before it come out whole, its own batch
 * with the dataset's message, nothing after it. */
static void test_failed_batch(void **state)
{
    (void)state;
    struct fake f;
    fake_init(&f, 40, 21); /* in batch 2 of 0..4 (8 per batch, identity order) */
    uint32_t list[40];
    for (int i = 0; i < 40; i++)
        list[i] = (uint32_t)i;
    struct trn_list_batches l = {.idx = list, .len = 40, .batch = 8};
    struct trn_prefetch_opts o = {.data = &f.d,
                                  .batch = 8,
                                  .ahead = 3,
                                  .threads = -1, /* all cores but one */
                                  .next = trn_list_batches_next,
                                  .next_arg = &l};
    struct trn_prefetch *p;
    char err[256];
    assert_int_equal(trn_prefetch_start(&p, &o, err, sizeof(err)), 0);
    for (int b = 0; b < 2; b++) {
        struct trn_batch *e = trn_prefetch_next(p);
        check_batch(e, list + b * 8, 8);
        trn_prefetch_release(p, e);
    }
    struct trn_batch *e = trn_prefetch_next(p);
    assert_non_null(e);
    assert_int_not_equal(e->rc, 0);
    assert_string_equal(e->err, "fake: sample 21 is corrupt");
    assert_null(trn_prefetch_next(p));
    trn_prefetch_free(p);                     /* the failed batch still held */
    assert_true(atomic_load(&f.reads) <= 24); /* nothing past batch 2 was read */
}

/* Freed while the loader is ahead, batches held: joins, frees, no leak. */
static void test_free_early(void **state)
{
    (void)state;
    struct fake f;
    fake_init(&f, 1000, -1);
    struct trn_sampler s;
    assert_int_equal(trn_sampler_init(&s, 1000, 1, 0, true, false, 1), 0);
    struct trn_train_batches t;
    assert_int_equal(trn_train_batches_init(&t, &s, 16, 0, 0, 1000), 0);
    struct trn_prefetch_opts o = {
        .data = &f.d, .batch = 16, .ahead = 2, .next = trn_train_batches_next, .next_arg = &t};
    struct trn_prefetch *p;
    char err[256];
    assert_int_equal(trn_prefetch_start(&p, &o, err, sizeof(err)), 0);
    trn_sampler_set_epoch(&s, 0);
    struct trn_batch *a = trn_prefetch_next(p), *b = trn_prefetch_next(p);
    check_batch(a, s.indices, 16);
    check_batch(b, s.indices + 16, 16);
    trn_prefetch_free(p);
    trn_train_batches_free(&t);
    trn_sampler_free(&s);
    trn_prefetch_free(NULL);
}

static void test_bad_opts(void **state)
{
    (void)state;
    struct fake f;
    fake_init(&f, 10, -1);
    struct trn_prefetch_opts o = {.data = &f.d, .batch = 4, .ahead = 0};
    struct trn_prefetch *p = (struct trn_prefetch *)&o;
    char err[256];
    assert_int_not_equal(trn_prefetch_start(&p, &o, err, sizeof(err)), 0);
    assert_null(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_train_batches_follow_sampler),
        cmocka_unit_test(test_list_batches),
        cmocka_unit_test(test_order),
        cmocka_unit_test(test_failed_batch),
        cmocka_unit_test(test_free_early),
        cmocka_unit_test(test_bad_opts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
