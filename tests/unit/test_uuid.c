/* Unit tests for common/uuid.c: version 4 UUIDs, their two text forms, the
 * getrandom fallback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/uuid.h"

static void assert_uuid4_shape(const char *s)
{
    assert_int_equal(strlen(s), 36);
    for (size_t i = 0; i < 36; i++) {
        if (i == 8 || i == 13 || i == 18 || i == 23)
            assert_int_equal(s[i], '-');
        else
            assert_non_null(strchr("0123456789abcdef", s[i]));
    }
    assert_int_equal(s[14], '4');           /* version 4 */
    assert_non_null(strchr("89ab", s[19])); /* RFC 4122 variant */
}

static void test_uuid(void **state)
{
    (void)state;
    /* The two forms of known bytes, as Python's str(UUID) and UUID.int. */
    const unsigned char known[16] = {0x12, 0x34, 0x56, 0x78, 0x12, 0x34, 0x46, 0x78,
                                     0x92, 0x34, 0x56, 0x78, 0x12, 0x34, 0x56, 0x78};
    char s[CDDP_UUID_STR_SIZE], n[CDDP_UUID_INT_SIZE];
    cddp_uuid_format(known, s);
    assert_string_equal(s, "12345678-1234-4678-9234-567812345678");
    cddp_uuid_format_int(known, n, sizeof(n));
    assert_string_equal(n, "24197857161011639613531485759520134776");
    unsigned char b[16];
    memset(b, 0xff, sizeof(b));
    cddp_uuid_format_int(b, n, sizeof(n));
    assert_string_equal(n, "340282366920938463463374607431768211455"); /* 39 digits fit */
    memset(b, 0, sizeof(b));
    cddp_uuid_format_int(b, n, sizeof(n));
    assert_string_equal(n, "0");
    b[15] = 10;
    cddp_uuid_format_int(b, n, 2); /* cut to the leading digit */
    assert_string_equal(n, "1");

    /* Random ones: the shape, and two calls differ. */
    char a[CDDP_UUID_STR_SIZE], c[CDDP_UUID_STR_SIZE];
    cddp_uuid4_str(a);
    cddp_uuid4_str(c);
    assert_uuid4_shape(a);
    assert_uuid4_shape(c);
    assert_string_not_equal(a, c);
    cddp_uuid4_int(n, sizeof(n));
    assert_true(strlen(n) >= 1 && strlen(n) <= 39);
    assert_int_equal(strspn(n, "0123456789"), strlen(n));

    /* The fallback (no getrandom): the same bits, and no two alike even
     * within one clock tick. */
    enum { N = 256 };
    static char seen[N][CDDP_UUID_STR_SIZE];
    for (int i = 0; i < N; i++) {
        cddp_uuid4_fallback(b);
        cddp_uuid_format(b, seen[i]);
        assert_uuid4_shape(seen[i]);
        for (int j = 0; j < i; j++)
            assert_string_not_equal(seen[i], seen[j]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uuid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
