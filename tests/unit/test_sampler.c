/* Unit tests for trainer/data/sampler.c: DistributedSampler semantics. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "trainer/data/sampler.h"

/* PyTorch's DistributedSampler with shuffle=False, written out for comparison. */
static size_t torch_indices(size_t len, size_t world, size_t rank, bool drop_last, uint32_t *out)
{
    size_t num =
        (drop_last && len % world) ? (len - world + world - 1) / world : (len + world - 1) / world;
    size_t total = num * world, k = 0;
    for (size_t pos = rank; pos < total; pos += world)
        out[k++] = (uint32_t)(pos % len);
    return k;
}

static void test_no_shuffle_matches_torch(void **state)
{
    (void)state;
    uint32_t want[64];
    for (size_t len = 1; len <= 23; len++) {
        for (int world = 1; world <= 5; world++) {
            for (int dl = 0; dl <= 1; dl++) {
                if (dl && len < (size_t)world && len % (size_t)world)
                    continue;
                for (int rank = 0; rank < world; rank++) {
                    struct trn_sampler s;
                    assert_int_equal(trn_sampler_init(&s, len, world, rank, false, dl, 0), 0);
                    trn_sampler_set_epoch(&s, 3);
                    size_t n = torch_indices(len, (size_t)world, (size_t)rank, dl, want);
                    assert_int_equal(s.num_samples, n);
                    assert_memory_equal(s.indices, want, n * sizeof(uint32_t));
                    trn_sampler_free(&s);
                }
            }
        }
    }
}

static void test_shuffle_disjoint_and_epochs_differ(void **state)
{
    (void)state;
    enum { LEN = 1000, WORLD = 4 };
    int seen[LEN] = {0};
    uint32_t first[LEN / WORLD];
    for (int rank = 0; rank < WORLD; rank++) {
        struct trn_sampler s;
        assert_int_equal(trn_sampler_init(&s, LEN, WORLD, rank, true, false, 42), 0);
        trn_sampler_set_epoch(&s, 0);
        for (size_t i = 0; i < s.num_samples; i++)
            seen[s.indices[i]]++;
        if (rank == 0) {
            memcpy(first, s.indices, sizeof(first));
            trn_sampler_set_epoch(&s, 1);
            assert_memory_not_equal(first, s.indices, sizeof(first));
        }
        trn_sampler_free(&s);
    }
    for (int i = 0; i < LEN; i++)
        assert_int_equal(seen[i], 1);
}

/* torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist() from
 * torch 1.13.1: the shuffled order is PyTorch's, so a world of 1 sees it whole. */
static void test_shuffle_is_torch_randperm(void **state)
{
    (void)state;
    static const uint32_t seed0_n10[] = {4, 1, 7, 5, 3, 9, 0, 8, 6, 2};
    static const uint32_t seed7_n23[] = {10, 15, 1,  9, 11, 20, 7, 14, 21, 12, 5, 18,
                                         17, 0,  16, 3, 6,  8,  2, 4,  13, 19, 22};
    struct trn_sampler s;
    assert_int_equal(trn_sampler_init(&s, 10, 1, 0, true, false, 0), 0);
    trn_sampler_set_epoch(&s, 0);
    assert_memory_equal(s.indices, seed0_n10, sizeof(seed0_n10));
    trn_sampler_free(&s);
    /* seed + epoch: seed 3 at epoch 4 is torch's seed 7 */
    assert_int_equal(trn_sampler_init(&s, 23, 1, 0, true, false, 3), 0);
    trn_sampler_set_epoch(&s, 4);
    assert_memory_equal(s.indices, seed7_n23, sizeof(seed7_n23));
    trn_sampler_free(&s);
    /* DistributedSampler(range(23), 4, rank=3, seed=7): every 4th from position 3,
     * the last one padding from the head of the permutation (10) */
    assert_int_equal(trn_sampler_init(&s, 23, 4, 3, true, false, 7), 0);
    trn_sampler_set_epoch(&s, 0);
    static const uint32_t r3[] = {9, 14, 18, 3, 4, 10};
    assert_int_equal(s.num_samples, 6);
    assert_memory_equal(s.indices, r3, sizeof(r3));
    trn_sampler_free(&s);
}

static void test_bad_args(void **state)
{
    (void)state;
    struct trn_sampler s;
    assert_int_equal(trn_sampler_init(&s, 0, 1, 0, false, false, 0), CDDP_ERANGE_ARG);
    assert_int_equal(trn_sampler_init(&s, 10, 2, 2, false, false, 0), CDDP_ERANGE_ARG);
    assert_int_equal(trn_sampler_init(&s, 3, 4, 0, false, true, 0), CDDP_ERANGE_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_shuffle_matches_torch),
        cmocka_unit_test(test_shuffle_disjoint_and_epochs_differ),
        cmocka_unit_test(test_shuffle_is_torch_randperm),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
