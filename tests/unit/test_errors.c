/* Unit tests for common/errors.c: error names and messages, cddp_fail's bounded message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>

#include "common/errors.h"

static void test_errors(void **state)
{
    (void)state;
    assert_string_equal(cddp_err_name(CDDP_ETOOBIG), "ETOOBIG");
    assert_string_equal(cddp_strerror(CDDP_EPARSE), "malformed value");
    assert_string_equal(cddp_err_name(-ECONNREFUSED), "ECONNREFUSED");
    char err[8];
    assert_int_equal(cddp_fail(err, sizeof(err), CDDP_ECONFIG, "bad %s", "value"), CDDP_ECONFIG);
    assert_string_equal(err, "bad val"); /* truncated to the buffer */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
