/* Unit tests for common/strutil.c: checked number and boolean parsing, the bounded buffer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/errors.h"
#include "common/strutil.h"

static void test_parse_long(void **state)
{
    (void)state;
    long v = 0;
    assert_int_equal(cddp_parse_long("42", 0, 100, &v), 0);
    assert_int_equal(v, 42);
    assert_int_equal(cddp_parse_long("-3", -5, 5, &v), 0);
    assert_int_equal(v, -3);
    assert_int_equal(cddp_parse_long("", 0, 100, &v), CDDP_EPARSE);
    assert_int_equal(cddp_parse_long("4x", 0, 100, &v), CDDP_EPARSE);
    assert_int_equal(cddp_parse_long(" 4", 0, 100, &v), CDDP_EPARSE);
    assert_int_equal(cddp_parse_long("101", 0, 100, &v), CDDP_ERANGE_ARG);
    assert_int_equal(cddp_parse_long("99999999999999999999999", 0, 100, &v), CDDP_ERANGE_ARG);
}

static void test_parse_double_bool(void **state)
{
    (void)state;
    double d;
    bool b;
    assert_int_equal(cddp_parse_double("0.1", 0, 10, &d), 0);
    assert_true(d > 0.099 && d < 0.101);
    assert_int_equal(cddp_parse_double("nan", 0, 10, &d), CDDP_ERANGE_ARG);
    assert_int_equal(cddp_parse_double("1e", 0, 10, &d), CDDP_EPARSE);
    assert_int_equal(cddp_parse_bool("Yes", &b), 0);
    assert_true(b);
    assert_int_equal(cddp_parse_bool("0", &b), 0);
    assert_false(b);
    assert_int_equal(cddp_parse_bool("maybe", &b), CDDP_EPARSE);
}

static void test_buf_limit(void **state)
{
    (void)state;
    struct cddp_buf b;
    cddp_buf_init(&b, 8);
    assert_int_equal(cddp_buf_append(&b, "abcd", 4), 0);
    assert_int_equal(cddp_buf_printf(&b, "%d", 1234), 0);
    assert_int_equal(b.len, 8);
    assert_int_equal(cddp_buf_append(&b, "x", 1), CDDP_ETOOBIG);
    assert_string_equal(b.data, "abcd1234");
    cddp_buf_consume(&b, 3);
    assert_string_equal(b.data, "d1234");
    cddp_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_long),
        cmocka_unit_test(test_parse_double_bool),
        cmocka_unit_test(test_buf_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
