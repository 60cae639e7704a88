/* Unit tests for common/numfmt.c: numbers as text (the shortest form that
 * reads back exactly; nothing for NaN and infinities). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "common/numfmt.h"

static void test_format_double(void **state)
{
    (void)state;
    char buf[40];
    assert_int_equal(cddp_format_double(0, buf, sizeof(buf)), 1);
    assert_string_equal(buf, "0");
    cddp_format_double(-42, buf, sizeof(buf));
    assert_string_equal(buf, "-42");
    cddp_format_double(-0.0, buf, sizeof(buf));
    assert_string_equal(buf, "-0");
    cddp_format_double(0.1, buf, sizeof(buf));
    assert_string_equal(buf, "0.1");
    cddp_format_double(1.0 / 3.0, buf, sizeof(buf));
    assert_true(strtod(buf, NULL) == 1.0 / 3.0);
    cddp_format_double(9007199254740993.0 * 4, buf, sizeof(buf)); /* past 2^53: %g */
    assert_true(strtod(buf, NULL) == 9007199254740993.0 * 4);
    assert_int_equal(cddp_format_double(NAN, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "");
    assert_int_equal(cddp_format_double(-INFINITY, buf, sizeof(buf)), 0);
    assert_int_equal(cddp_format_double(12345, buf, 3), 0); /* does not fit */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_double),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
