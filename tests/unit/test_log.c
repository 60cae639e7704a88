/* Unit tests for common/log.c: the level parser (LOGLEVEL's values). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/errors.h"
#include "common/log.h"

static void test_log_parse_level(void **state)
{
    (void)state;
    int level;
    assert_int_equal(cddp_log_parse_level("info", &level), 0);
    assert_int_equal(level, CDDP_LOG_INFO);
    assert_int_equal(cddp_log_parse_level("loud", &level), CDDP_EPARSE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_log_parse_level),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
