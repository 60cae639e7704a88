/* Unit tests for common/utf8.h: UTF-8 sequence lengths and validation. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/utf8.h"

static void test_utf8(void **state)
{
    (void)state;
    const unsigned char *euro = (const unsigned char *)"\xe2\x82\xac";
    assert_int_equal(cddp_utf8_seq(euro, 3), 3);
    assert_int_equal(cddp_utf8_seq(euro, 2), 0); /* cut short by the bound */
    assert_int_equal(cddp_utf8_seq(euro, 0), 0);
    assert_int_equal(cddp_utf8_len(euro), 3);
    assert_int_equal(cddp_utf8_len((const unsigned char *)"a"), 1);
    assert_int_equal(cddp_utf8_len((const unsigned char *)"\xe2\x82"), 0); /* cut by the NUL */
    assert_int_equal(cddp_utf8_len((const unsigned char *)"\xf0\x9f\x98\x80"), 4);
    assert_true(cddp_utf8_valid(""));
    assert_true(cddp_utf8_valid("caf\xc3\xa9 \xf4\x8f\xbf\xbf")); /* U+10FFFF */
    assert_false(cddp_utf8_valid("\xc0\x80"));                    /* overlong NUL */
    assert_false(cddp_utf8_valid("\xe0\x80\xaf"));                /* overlong '/' */
    assert_false(cddp_utf8_valid("\xed\xa0\x80"));                /* surrogate */
    assert_false(cddp_utf8_valid("\xf4\x90\x80\x80"));            /* past U+10FFFF */
    assert_false(cddp_utf8_valid("\xf8\x88\x80\x80\x80"));        /* 5 bytes */
    assert_false(cddp_utf8_valid("a\x80"));                       /* lone continuation */
    assert_false(cddp_utf8_valid("\xc3"));                        /* truncated */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
