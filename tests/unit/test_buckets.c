/*
 * Unit tests for trainer/buckets.c: DDP's bucket plan (reverse parameter
 * order, 1 MiB first bucket, cap after, closed on reaching the limit) and
 * readiness (buckets launched once each, in order, only when all their
 * tensors are ready), exhaustively over every marking order of small plans.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "trainer/buckets.h"

/* Offsets of tensors that tile a buffer. */
static void tile(const size_t *numel, size_t n, size_t *off)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        off[i] = o;
        o += numel[i];
    }
}

/* Every tensor in exactly one bucket; buckets contiguous, in reverse order,
 * tiling the buffer from its end. */
static void check_plan_shape(const struct trn_bucket_plan *p)
{
    size_t end = p->n_tensors ? p->t_off[p->n_tensors - 1] + p->t_numel[p->n_tensors - 1] : 0;
    size_t expect_last = p->n_tensors;
    for (int b = 0; b < p->n_buckets; b++) {
        const struct trn_bucket *k = &p->buckets[b];
        assert_true(k->count > 0);
        assert_int_equal(k->first + k->count, expect_last);
        assert_int_equal(k->off, p->t_off[k->first]);
        assert_int_equal(k->off + k->numel, end);
        size_t sum = 0;
        for (size_t i = k->first; i < k->first + k->count; i++) {
            assert_int_equal(p->t_bucket[i], b);
            sum += p->t_numel[i];
        }
        assert_int_equal(sum, k->numel);
        end = k->off;
        expect_last = k->first;
    }
    assert_int_equal(end, 0);
    assert_int_equal(expect_last, 0);
}

static void test_plan_first_bucket_small_then_cap(void **state)
{
    (void)state;
    /* elements of 4 bytes; 1 MiB = 262144 elements; cap 2 MiB */
    size_t numel[] = {100000, 200000, 300000, 100000, 200000, 50000, 100000};
    size_t n = sizeof(numel) / sizeof(numel[0]), off[7];
    tile(numel, n, off);
    struct trn_bucket_plan p;
    assert_int_equal(trn_bucket_plan_build(&p, off, numel, n, 4, 1 << 20, 2 << 20), 0);
    check_plan_shape(&p);
    /* reverse: 100000 + 50000 + 200000 = 350000 el = 1.4 MB >= 1 MiB -> bucket 0 = {6,5,4};
     * then 100000 + 300000 + 200000 = 600000 el = 2.4 MB >= 2 MiB -> bucket 1 = {3,2,1};
     * then {0} (the remainder, under the cap) */
    assert_int_equal(p.n_buckets, 3);
    assert_int_equal(p.buckets[0].first, 4);
    assert_int_equal(p.buckets[0].count, 3);
    assert_int_equal(p.buckets[1].first, 1);
    assert_int_equal(p.buckets[1].count, 3);
    assert_int_equal(p.buckets[2].first, 0);
    assert_int_equal(p.buckets[2].count, 1);
    trn_bucket_plan_free(&p);
}

static void test_plan_exact_limit_closes_and_big_tensor_alone(void **state)
{
    (void)state;
    /* exactly 1 MiB closes the first bucket; a tensor bigger than the cap gets its own */
    size_t numel[] = {10, 1 << 22, 1 << 18};
    size_t off[3];
    tile(numel, 3, off);
    struct trn_bucket_plan p;
    assert_int_equal(trn_bucket_plan_build(&p, off, numel, 3, 4, 1 << 20, 1 << 20), 0);
    check_plan_shape(&p);
    assert_int_equal(p.n_buckets, 3);
    assert_int_equal(p.buckets[0].first, 2); /* 2^18 * 4 = 1 MiB exactly */
    assert_int_equal(p.buckets[1].first, 1); /* 16 MiB alone */
    assert_int_equal(p.buckets[2].first, 0);
    trn_bucket_plan_free(&p);
}

static void test_plan_resnet18_sizes_one_big_cap(void **state)
{
    (void)state;
    /* A huge cap: the first bucket (>= 1 MiB) and one bucket with the rest. */
    size_t numel[] = {9408, 64, 64, 36864, 64, 64, 36864, 64, 64, 513000, 1000};
    size_t n = sizeof(numel) / sizeof(numel[0]), off[11];
    tile(numel, n, off);
    struct trn_bucket_plan p;
    assert_int_equal(trn_bucket_plan_build(&p, off, numel, n, 4, 1 << 20, (size_t)1 << 40), 0);
    check_plan_shape(&p);
    assert_int_equal(p.n_buckets, 2);
    assert_int_equal(p.buckets[0].first, 9); /* fc.bias + fc.weight = 2.05 MB */
    trn_bucket_plan_free(&p);
}

static void test_plan_refuses_bad_input(void **state)
{
    (void)state;
    struct trn_bucket_plan p;
    size_t numel[] = {4, 4}, gap[] = {0, 5}, zero[] = {4, 0}, off[2] = {0, 4};
    assert_int_equal(trn_bucket_plan_build(&p, gap, numel, 2, 4, 16, 16), CDDP_ERANGE_ARG);
    assert_null(p.buckets);
    assert_int_equal(trn_bucket_plan_build(&p, off, zero, 2, 4, 16, 16), CDDP_ERANGE_ARG);
    assert_int_equal(trn_bucket_plan_build(&p, off, numel, 2, 4, 0, 16), CDDP_ERANGE_ARG);
    assert_int_equal(trn_bucket_plan_build(&p, off, numel, 2, 0, 16, 16), CDDP_ERANGE_ARG);
    /* no tensors: no buckets, and finishing is fine */
    assert_int_equal(trn_bucket_plan_build(&p, off, numel, 0, 4, 16, 16), 0);
    assert_int_equal(p.n_buckets, 0);
    struct trn_bucket_ready r;
    assert_int_equal(trn_bucket_ready_init(&r, &p), 0);
    size_t missing = 99;
    assert_int_equal(trn_bucket_ready_finish(&r, &missing), 0);
    trn_bucket_ready_free(&r);
    trn_bucket_plan_free(&p);
}

/* A plan of 1-element tensors (4 bytes), buckets closing every `per` tensors. */
static void small_plan(struct trn_bucket_plan *p, size_t n, size_t first_per, size_t per)
{
    size_t numel[16], off[16];
    for (size_t i = 0; i < n; i++)
        numel[i] = 1;
    tile(numel, n, off);
    assert_int_equal(trn_bucket_plan_build(p, off, numel, n, 4, 4 * first_per, 4 * per), 0);
    check_plan_shape(p);
}

static void test_ready_reverse_order_launches_one_by_one(void **state)
{
    (void)state;
    struct trn_bucket_plan p;
    small_plan(&p, 6, 1, 2); /* buckets: {5}, {4,3}, {2,1}, {0} */
    assert_int_equal(p.n_buckets, 4);
    struct trn_bucket_ready r;
    assert_int_equal(trn_bucket_ready_init(&r, &p), 0);
    int first, n;
    int expect[6][2] = {{0, 1}, {1, 0}, {1, 1}, {2, 0}, {2, 1}, {3, 1}};
    for (int k = 0; k < 6; k++) {
        assert_int_equal(trn_bucket_ready_mark(&r, (size_t)(5 - k), 1, &first, &n), 0);
        assert_int_equal(first, expect[k][0]);
        assert_int_equal(n, expect[k][1]);
    }
    size_t missing;
    assert_int_equal(trn_bucket_ready_finish(&r, &missing), 0);
    /* a second backward after reset behaves the same */
    trn_bucket_ready_reset(&r);
    assert_int_equal(trn_bucket_ready_finish(&r, &missing), CDDP_ESTATE);
    assert_int_equal(missing, 0);
    assert_int_equal(trn_bucket_ready_mark(&r, 5, 1, &first, &n), 0);
    assert_int_equal(n, 1);
    trn_bucket_ready_free(&r);
    trn_bucket_plan_free(&p);
}

static void test_ready_out_of_order_waits_for_earlier_buckets(void **state)
{
    (void)state;
    struct trn_bucket_plan p;
    small_plan(&p, 6, 1, 2); /* {5}, {4,3}, {2,1}, {0} */
    struct trn_bucket_ready r;
    assert_int_equal(trn_bucket_ready_init(&r, &p), 0);
    int first, n;
    /* bucket 3 and 2 ready first: nothing may launch before bucket 0 */
    assert_int_equal(trn_bucket_ready_mark(&r, 0, 1, &first, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(trn_bucket_ready_mark(&r, 1, 2, &first, &n), 0); /* tensors 1 and 2 at once */
    assert_int_equal(n, 0);
    assert_int_equal(trn_bucket_ready_mark(&r, 5, 1, &first, &n), 0);
    assert_int_equal(first, 0);
    assert_int_equal(n, 1);
    assert_int_equal(trn_bucket_ready_mark(&r, 3, 1, &first, &n), 0);
    assert_int_equal(n, 0);
    size_t missing;
    assert_int_equal(trn_bucket_ready_finish(&r, &missing), CDDP_ESTATE);
    assert_int_equal(missing, 4);
    /* the last one releases buckets 1, 2 and 3 together, in order */
    assert_int_equal(trn_bucket_ready_mark(&r, 4, 1, &first, &n), 0);
    assert_int_equal(first, 1);
    assert_int_equal(n, 3);
    assert_int_equal(trn_bucket_ready_finish(&r, &missing), 0);
    trn_bucket_ready_free(&r);
    trn_bucket_plan_free(&p);
}

static void test_ready_refuses_twice_and_partial_ranges(void **state)
{
    (void)state;
    size_t numel[] = {3, 5, 2}, off[3];
    tile(numel, 3, off); /* 0, 3, 8 */
    struct trn_bucket_plan p;
    assert_int_equal(trn_bucket_plan_build(&p, off, numel, 3, 4, 4, 4), 0);
    struct trn_bucket_ready r;
    assert_int_equal(trn_bucket_ready_init(&r, &p), 0);
    int first, n;
    assert_int_equal(trn_bucket_ready_mark(&r, 1, 2, &first, &n), CDDP_ERANGE_ARG); /* mid */
    assert_int_equal(trn_bucket_ready_mark(&r, 3, 4, &first, &n), CDDP_ERANGE_ARG); /* short */
    assert_int_equal(trn_bucket_ready_mark(&r, 3, 6, &first, &n), CDDP_ERANGE_ARG); /* spills */
    assert_int_equal(trn_bucket_ready_mark(&r, 8, 3, &first, &n), CDDP_ERANGE_ARG); /* past end */
    assert_int_equal(trn_bucket_ready_mark(&r, 10, 1, &first, &n), CDDP_ERANGE_ARG);
    assert_int_equal(trn_bucket_ready_mark(&r, 0, 0, &first, &n), CDDP_ERANGE_ARG);
    assert_int_equal(trn_bucket_ready_mark(&r, 8, 2, &first, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(trn_bucket_ready_mark(&r, 8, 2, &first, &n), CDDP_EEXISTS);
    assert_int_equal(n, 0);
    /* a range that includes an already-ready tensor changes nothing */
    assert_int_equal(trn_bucket_ready_mark(&r, 3, 7, &first, &n), CDDP_EEXISTS);
    size_t missing;
    assert_int_equal(trn_bucket_ready_finish(&r, &missing), CDDP_ESTATE);
    assert_int_equal(missing, 0);
    assert_int_equal(trn_bucket_ready_mark(&r, 0, 8, &first, &n), 0); /* two tensors at once */
    assert_int_equal(first, 1);
    assert_int_equal(n, 2);
    assert_int_equal(trn_bucket_ready_finish(&r, &missing), 0);
    trn_bucket_ready_free(&r);
    trn_bucket_plan_free(&p);
}

/* Every order of marking n single tensors, for every bucket layout. */
static bool next_perm(int *a, int n)
{
    int i = n - 2;
    while (i >= 0 && a[i] >= a[i + 1])
        i--;
    if (i < 0)
        return false;
    int j = n - 1;
    while (a[j] <= a[i])
        j--;
    int t = a[i];
    a[i] = a[j];
    a[j] = t;
    for (int l = i + 1, r = n - 1; l < r; l++, r--) {
        t = a[l];
        a[l] = a[r];
        a[r] = t;
    }
    return true;
}

static void test_ready_exhaustive_every_order(void **state)
{
    (void)state;
    long orders = 0;
    for (size_t n = 1; n <= 7; n++)
        for (size_t fp = 1; fp <= 3; fp++)
            for (size_t per = 1; per <= 4; per++) {
                struct trn_bucket_plan p;
                small_plan(&p, n, fp, per);
                struct trn_bucket_ready r;
                assert_int_equal(trn_bucket_ready_init(&r, &p), 0);
                int perm[7];
                for (int i = 0; i < (int)n; i++)
                    perm[i] = i;
                do {
                    trn_bucket_ready_reset(&r);
                    bool ready[7] = {false};
                    int launched = 0;
                    for (size_t k = 0; k < n; k++) {
                        int first, cnt;
                        assert_int_equal(
                            trn_bucket_ready_mark(&r, (size_t)perm[k], 1, &first, &cnt), 0);
                        ready[perm[k]] = true;
                        /* launched in order, each once, right after the previous */
                        assert_int_equal(first, launched);
                        for (int b = first; b < first + cnt; b++) {
                            const struct trn_bucket *bk = &p.buckets[b];
                            for (size_t t = bk->first; t < bk->first + bk->count; t++)
                                assert_true(ready[t]);
                        }
                        launched += cnt;
                        /* and as soon as possible: the next bucket is not complete */
                        if (launched < p.n_buckets) {
                            const struct trn_bucket *bk = &p.buckets[launched];
                            bool all = true;
                            for (size_t t = bk->first; t < bk->first + bk->count; t++)
                                all = all && ready[t];
                            assert_false(all);
                        }
                    }
                    assert_int_equal(launched, p.n_buckets);
                    size_t missing;
                    assert_int_equal(trn_bucket_ready_finish(&r, &missing), 0);
                    orders++;
                } while (next_perm(perm, (int)n));
                trn_bucket_ready_free(&r);
                trn_bucket_plan_free(&p);
            }
    assert_true(orders > 5040);
}

/* SyncBN's merge: a small case by hand, then random ranks (one empty)
 * against the two-pass statistics of all their values together. */
static void test_bn_merge_small_by_hand(void **state)
{
    (void)state;
    /* rank 0 saw {1, 3} in channel 0 and {0, 0} in channel 1; rank 1 saw {5} and {6} */
    const float all[] = {2, 0, 1, 0, 2, 5, 6, 0, 0, 1};
    float mean[2], var[2];
    assert_true(trn_bn_merge_stats(all, 2, 2, mean, var) == 3.0);
    assert_true(mean[0] == 3.0f && var[0] == (float)(8.0 / 3.0));
    assert_true(mean[1] == 2.0f && var[1] == 8.0f);
    /* one rank: its own statistics back, exactly */
    assert_true(trn_bn_merge_stats(all, 1, 2, mean, var) == 2.0);
    assert_true(mean[0] == 2.0f && var[0] == 1.0f && mean[1] == 0.0f && var[1] == 0.0f);
}

static void test_bn_merge_random_ranks_match_two_pass(void **state)
{
    (void)state;
    enum { W = 4, C = 5, MAXN = 50 };
    static const int counts[W] = {37, 0, 50, 3};
    static float vals[W][C][MAXN];
    float all[W * (2 * C + 1)];
    uint32_t seed = 12345;
    for (int r = 0; r < W; r++) {
        float *b = all + r * (2 * C + 1);
        for (int ch = 0; ch < C; ch++) {
            double sum = 0, sq = 0;
            for (int i = 0; i < counts[r]; i++) {
                seed = seed * 1664525u + 1013904223u;
                vals[r][ch][i] = (float)((seed >> 8) % 10000) / 1000.0f + (float)(ch * 3 + r);
                sum += vals[r][ch][i];
            }
            double m = counts[r] ? sum / counts[r] : 0;
            for (int i = 0; i < counts[r]; i++)
                sq += (vals[r][ch][i] - m) * (vals[r][ch][i] - m);
            b[ch] = (float)m;
            b[C + ch] = (float)(counts[r] ? sq / counts[r] : 0);
        }
        b[2 * C] = (float)counts[r];
    }
    float mean[C], var[C];
    double n = trn_bn_merge_stats(all, W, C, mean, var);
    assert_true(n == 90.0);
    for (int ch = 0; ch < C; ch++) {
        double sum = 0, sq = 0;
        for (int r = 0; r < W; r++)
            for (int i = 0; i < counts[r]; i++)
                sum += vals[r][ch][i];
        double m = sum / n;
        for (int r = 0; r < W; r++)
            for (int i = 0; i < counts[r]; i++)
                sq += (vals[r][ch][i] - m) * (vals[r][ch][i] - m);
        assert_true(fabs(mean[ch] - m) <= 1e-6 * fabs(m));
        assert_true(fabs(var[ch] - sq / n) <= 1e-5 * (sq / n));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_first_bucket_small_then_cap),
        cmocka_unit_test(test_plan_exact_limit_closes_and_big_tensor_alone),
        cmocka_unit_test(test_plan_resnet18_sizes_one_big_cap),
        cmocka_unit_test(test_plan_refuses_bad_input),
        cmocka_unit_test(test_ready_reverse_order_launches_one_by_one),
        cmocka_unit_test(test_ready_out_of_order_waits_for_earlier_buckets),
        cmocka_unit_test(test_ready_refuses_twice_and_partial_ranges),
        cmocka_unit_test(test_ready_exhaustive_every_order),
        cmocka_unit_test(test_bn_merge_small_by_hand),
        cmocka_unit_test(test_bn_merge_random_ranks_match_two_pass),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
