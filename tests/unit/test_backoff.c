/* Unit tests for common/backoff.c: exponential backoff with jitter. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/backoff.h"

static void test_backoff(void **state)
{
    (void)state;
    struct cddp_backoff b;
    cddp_backoff_init(&b, 10, 1000);
    /* random 0: the bottom of each step; the step doubles and stops at max. */
    const uint64_t low[] = {5, 10, 20, 40, 80, 160, 320, 500, 500};
    for (size_t i = 0; i < sizeof(low) / sizeof(low[0]); i++)
        assert_int_equal(cddp_backoff_next(&b, 0, UINT64_MAX), low[i]);
    cddp_backoff_reset(&b);
    /* The top of the step: random % (half + 1) == half. */
    assert_int_equal(cddp_backoff_next(&b, 5, UINT64_MAX), 10);
    assert_int_equal(cddp_backoff_next(&b, 10, UINT64_MAX), 20);
    assert_int_equal(cddp_backoff_next(&b, 21, UINT64_MAX), 20); /* 21 % 21 == 0 */
    /* Every draw lies in [step/2, step]. */
    cddp_backoff_reset(&b);
    for (uint32_t r = 0; r < 1000; r += 7) {
        uint64_t step = b.step_ms;
        uint64_t ms = cddp_backoff_next(&b, r * 2654435761u, UINT64_MAX);
        assert_true(ms >= step / 2 && ms <= step);
    }
    /* The time left caps the wait. */
    assert_int_equal(cddp_backoff_next(&b, 0, 3), 3);
    assert_int_equal(cddp_backoff_next(&b, 0, 0), 0);
    /* Degenerate settings are clamped: first 0 -> 1, max below first -> first. */
    cddp_backoff_init(&b, 0, 0);
    assert_int_equal(b.step_ms, 1);
    assert_int_equal(b.max_ms, 1);
    assert_int_equal(cddp_backoff_next(&b, 7, UINT64_MAX), 0); /* [1/2, 1] rounds to 0 */
    assert_int_equal(b.step_ms, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backoff),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
