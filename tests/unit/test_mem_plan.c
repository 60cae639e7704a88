/*
 * Unit tests for trainer/mem_plan.c: one arena for a step's
 * buffers (pure C; runs without CUDA).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>

#include "trainer/mem_plan.h"

/* Every pair live at once is disjoint in memory, and everything is aligned and inside. */
static void assert_valid(const struct trn_mem_req *r, int n, size_t align, size_t arena)
{
    for (int i = 0; i < n; i++) {
        assert_int_equal(r[i].offset % align, 0);
        assert_true(r[i].offset + r[i].bytes <= arena);
        for (int j = i + 1; j < n; j++) {
            if (!r[i].bytes || !r[j].bytes)
                continue;
            int in_time = r[i].first <= r[j].last && r[j].first <= r[i].last;
            int in_space =
                r[i].offset < r[j].offset + r[j].bytes && r[j].offset < r[i].offset + r[i].bytes;
            if (in_time && in_space) {
                print_error("requests %d and %d overlap\n", i, j);
                fail();
            }
        }
    }
}

static void test_disjoint_lifetimes_share(void **state)
{
    (void)state;
    struct trn_mem_req r[] = {{1000, 0, 1, 0}, {1000, 2, 3, 0}, {500, 4, 4, 0}};
    size_t arena = trn_mem_plan(r, 3, 256);
    assert_int_equal(arena, 1024);
    for (int i = 0; i < 3; i++)
        assert_int_equal(r[i].offset, 0);
}

static void test_overlapping_lifetimes_split(void **state)
{
    (void)state;
    /* a chain like a forward pass: each output lives until the next op */
    struct trn_mem_req r[] = {{100, 0, 1, 0}, {300, 1, 2, 0}, {200, 2, 3, 0}, {50, 0, 3, 0}};
    size_t arena = trn_mem_plan(r, 4, 64);
    assert_valid(r, 4, 64, arena);
    assert_true(arena >= trn_mem_peak_live(r, 4));
    assert_true(arena <= 768); /* at most the sizes rounded up, stacked: 128+320+256+64 */
    assert_int_equal(trn_mem_peak_live(r, 4), 550);
}

static void test_refuses_bad_input(void **state)
{
    (void)state;
    struct trn_mem_req r[] = {{10, 3, 2, 0}};
    assert_int_equal(trn_mem_plan(r, 1, 64), (size_t)-1);
    r[0].first = 0;
    assert_int_equal(trn_mem_plan(r, 1, 48), (size_t)-1); /* not a power of two */
    assert_int_equal(trn_mem_plan(r, 1, 64), 64);
    assert_int_equal(trn_mem_plan(NULL, 0, 64), 0);
}

static void test_random_plans_are_valid(void **state)
{
    (void)state;
    uint64_t s = 99;
    for (int round = 0; round < 200; round++) {
        int n = 1 + round % 40;
        struct trn_mem_req *r = calloc((size_t)n, sizeof(*r));
        size_t sum = 0;
        for (int i = 0; i < n; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            r[i].bytes = (size_t)((s >> 33) % 5000);
            r[i].first = (int)((s >> 20) % 30);
            r[i].last = r[i].first + (int)((s >> 10) % 8);
            sum += (r[i].bytes + 255) / 256 * 256;
        }
        size_t arena = trn_mem_plan(r, n, 256);
        assert_valid(r, n, 256, arena);
        assert_true(arena >= trn_mem_peak_live(r, n));
        assert_true(arena <= sum);
        free(r);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_disjoint_lifetimes_share),
        cmocka_unit_test(test_overlapping_lifetimes_split),
        cmocka_unit_test(test_refuses_bad_input),
        cmocka_unit_test(test_random_plans_are_valid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
