/*
 * Unit tests for trainer/ops/cuda/algo_cache.c: the convolution algorithm
 * cache of the CUDA backend (pure C; runs without CUDA).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "trainer/ops/cuda/algo_cache.h"
#include "trainer/ops/ops.h"

static struct trn_algo_cache cache;

static struct trn_conv_key key(enum trn_conv_dir dir, int n, int cin, int hw, int cout, int k,
                               int stride)
{
    return trn_conv_key_make(dir, n, cin, hw, hw, cout, k, stride, k / 2, TRN_F32, TRN_LAYOUT_NHWC,
                             TRN_LAYOUT_NHWC, false, false, 256u << 20);
}

static void test_get_put(void **state)
{
    (void)state;
    trn_algo_cache_init(&cache);
    struct trn_conv_key k1 = key(TRN_CONV_FWD, 64, 64, 56, 64, 3, 1);
    struct trn_conv_choice got, c1 = {3, 1, 4096, 0.5f, 8};
    assert_false(trn_algo_cache_get(&cache, &k1, &got));
    assert_int_equal(trn_algo_cache_put(&cache, &k1, &c1), 0);
    assert_true(trn_algo_cache_get(&cache, &k1, &got));
    assert_int_equal(got.algo, 3);
    assert_int_equal(got.workspace, 4096);
    assert_int_equal(got.padded_c, 8); /* a padded stem's choice comes back padded */
    assert_int_equal(cache.count, 1);
    assert_int_equal(cache.hits, 1);
    assert_int_equal(cache.misses, 1);
    /* replacing keeps one entry */
    struct trn_conv_choice c2 = {5, 0, 0, 0.25f, 0};
    assert_int_equal(trn_algo_cache_put(&cache, &k1, &c2), 0);
    assert_int_equal(cache.count, 1);
    assert_true(trn_algo_cache_get(&cache, &k1, &got));
    assert_int_equal(got.algo, 5);
}

/* Every field is part of the key: changing any one misses. */
static void test_every_field_counts(void **state)
{
    (void)state;
    trn_algo_cache_init(&cache);
    struct trn_conv_key base = key(TRN_CONV_BWD_FILTER, 32, 128, 28, 256, 1, 2);
    struct trn_conv_choice c = {1, 1, 0, 0, 0};
    assert_int_equal(trn_algo_cache_put(&cache, &base, &c), 0);
    struct trn_conv_key v[] = {
        key(TRN_CONV_BWD_DATA, 32, 128, 28, 256, 1, 2),
        key(TRN_CONV_BWD_FILTER, 31, 128, 28, 256, 1, 2),
        key(TRN_CONV_BWD_FILTER, 32, 64, 28, 256, 1, 2),
        key(TRN_CONV_BWD_FILTER, 32, 128, 27, 256, 1, 2),
        key(TRN_CONV_BWD_FILTER, 32, 128, 28, 128, 1, 2),
        key(TRN_CONV_BWD_FILTER, 32, 128, 28, 256, 3, 2),
        key(TRN_CONV_BWD_FILTER, 32, 128, 28, 256, 1, 1),
        trn_conv_key_make(TRN_CONV_BWD_FILTER, 32, 128, 28, 28, 256, 1, 2, 0, TRN_BF16,
                          TRN_LAYOUT_NHWC, TRN_LAYOUT_NHWC, false, false, 256u << 20),
        trn_conv_key_make(TRN_CONV_BWD_FILTER, 32, 128, 28, 28, 256, 1, 2, 0, TRN_F32,
                          TRN_LAYOUT_NCHW, TRN_LAYOUT_NCHW, false, false, 256u << 20),
        trn_conv_key_make(TRN_CONV_BWD_FILTER, 32, 128, 28, 28, 256, 1, 2, 0, TRN_F32,
                          TRN_LAYOUT_NHWC, TRN_LAYOUT_NHWC, true, false, 256u << 20),
        trn_conv_key_make(TRN_CONV_BWD_FILTER, 32, 128, 28, 28, 256, 1, 2, 0, TRN_F32,
                          TRN_LAYOUT_NHWC, TRN_LAYOUT_NHWC, false, true, 256u << 20),
        trn_conv_key_make(TRN_CONV_BWD_FILTER, 32, 128, 28, 28, 256, 1, 2, 0, TRN_F32,
                          TRN_LAYOUT_NHWC, TRN_LAYOUT_NHWC, false, false, 64u << 20),
        trn_conv_key_make(TRN_CONV_BWD_FILTER, 32, 128, 28, 29, 256, 1, 2, 0, TRN_F32,
                          TRN_LAYOUT_NHWC, TRN_LAYOUT_NHWC, false, false, 256u << 20),
    };
    struct trn_conv_choice got;
    assert_true(trn_algo_cache_get(&cache, &base, &got));
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++)
        assert_false(trn_algo_cache_get(&cache, &v[i], &got));
    /* the same fields again: a hit (the key has no stray padding bytes) */
    struct trn_conv_key again = key(TRN_CONV_BWD_FILTER, 32, 128, 28, 256, 1, 2);
    assert_true(trn_algo_cache_get(&cache, &again, &got));
}

/* --amp: one shape in fp32, bf16 and fp16 is three entries, each with its
 * own choice (conv.cu's key_of passes the plan's activation dtype). */
static void test_dtypes_are_separate(void **state)
{
    (void)state;
    trn_algo_cache_init(&cache);
    static const enum trn_dtype dts[] = {TRN_F32, TRN_BF16, TRN_F16};
    for (int d = 0; d < 3; d++) {
        struct trn_conv_key k =
            trn_conv_key_make(TRN_CONV_FWD, 64, 64, 56, 56, 64, 3, 1, 1, dts[d], TRN_LAYOUT_NHWC,
                              TRN_LAYOUT_NHWC, true, false, 256u << 20);
        struct trn_conv_choice c = {d + 1, d == 0 ? 0 : 1, 1024 * d, 0, 0};
        assert_int_equal(trn_algo_cache_put(&cache, &k, &c), 0);
    }
    assert_int_equal(cache.count, 3);
    for (int d = 0; d < 3; d++) {
        struct trn_conv_key k =
            trn_conv_key_make(TRN_CONV_FWD, 64, 64, 56, 56, 64, 3, 1, 1, dts[d], TRN_LAYOUT_NHWC,
                              TRN_LAYOUT_NHWC, true, false, 256u << 20);
        struct trn_conv_choice got;
        assert_true(trn_algo_cache_get(&cache, &k, &got));
        assert_int_equal(got.algo, d + 1);
        assert_int_equal(got.workspace, 1024 * d);
    }
}

/* Filling the table: every entry stays reachable, the one past the end is refused. */
static void test_full(void **state)
{
    (void)state;
    trn_algo_cache_init(&cache);
    for (int i = 0; i < TRN_ALGO_CACHE_CAP; i++) {
        struct trn_conv_key k = key(TRN_CONV_FWD, 1 + i, 8, 8, 8, 3, 1);
        struct trn_conv_choice c = {i % 8, 0, i, 0, 0};
        assert_int_equal(trn_algo_cache_put(&cache, &k, &c), 0);
    }
    assert_int_equal(cache.count, TRN_ALGO_CACHE_CAP);
    for (int i = 0; i < TRN_ALGO_CACHE_CAP; i++) {
        struct trn_conv_key k = key(TRN_CONV_FWD, 1 + i, 8, 8, 8, 3, 1);
        struct trn_conv_choice got;
        assert_true(trn_algo_cache_get(&cache, &k, &got));
        assert_int_equal(got.workspace, i);
    }
    struct trn_conv_key extra = key(TRN_CONV_FWD, 1 << 20, 8, 8, 8, 3, 1);
    struct trn_conv_choice c = {0, 0, 0, 0, 0}, got;
    assert_int_equal(trn_algo_cache_put(&cache, &extra, &c), -1);
    assert_false(trn_algo_cache_get(&cache, &extra, &got));
    /* replacing an existing entry still works when full */
    struct trn_conv_key k0 = key(TRN_CONV_FWD, 1, 8, 8, 8, 3, 1);
    c.workspace = 99;
    assert_int_equal(trn_algo_cache_put(&cache, &k0, &c), 0);
    assert_true(trn_algo_cache_get(&cache, &k0, &got));
    assert_int_equal(got.workspace, 99);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_put),
        cmocka_unit_test(test_every_field_counts),
        cmocka_unit_test(test_dtypes_are_separate),
        cmocka_unit_test(test_full),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
