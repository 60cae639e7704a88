/* Unit tests for common/jsonw.c: the streaming JSON writer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/errors.h"
#include "common/jsonw.h"

static void test_document(void **state)
{
    (void)state;
    struct cddp_buf b;
    cddp_buf_init(&b, 4096);
    struct jsonw w;
    jsonw_init(&w, &b);
    jsonw_object_begin(&w, NULL);
    jsonw_string(&w, "s", "a\"b\\c\nd\te\x01");
    jsonw_int(&w, "i", -42);
    jsonw_int(&w, "big", INT64_MAX);
    jsonw_number(&w, "x", 612.5);
    jsonw_number(&w, "third", 1.0 / 3.0);
    jsonw_number(&w, "nan", NAN);
    jsonw_seconds(&w, "t", 1712345678.1234);
    jsonw_seconds(&w, "neg", -0.5);
    jsonw_seconds(&w, "inf", INFINITY);
    jsonw_bool(&w, "yes", true);
    jsonw_null(&w, "none");
    jsonw_string(&w, "nul", NULL);
    jsonw_array_begin(&w, "a");
    jsonw_int(&w, NULL, 1);
    jsonw_object_begin(&w, NULL);
    jsonw_object_end(&w);
    jsonw_array_begin(&w, NULL);
    jsonw_array_end(&w);
    jsonw_array_end(&w);
    jsonw_object_end(&w);
    assert_int_equal(jsonw_finish(&w), 0);
    assert_string_equal(b.data, "{\"s\":\"a\\\"b\\\\c\\nd\\te\\u0001\",\"i\":-42,"
                                "\"big\":9223372036854775807,\"x\":612.5,"
                                "\"third\":0.3333333333333333,\"nan\":null,"
                                "\"t\":1712345678.123,\"neg\":-0.500,\"inf\":null,\"yes\":true,"
                                "\"none\":null,\"nul\":null,\"a\":[1,{},[]]}");
    cJSON *root = cJSON_Parse(b.data);
    assert_non_null(root);
    assert_string_equal(cJSON_GetObjectItem(root, "s")->valuestring, "a\"b\\c\nd\te\x01");
    assert_true(cJSON_GetObjectItem(root, "third")->valuedouble == 1.0 / 3.0);
    cJSON_Delete(root);
    cddp_buf_free(&b);
}

static void test_utf8(void **state)
{
    (void)state;
    struct cddp_buf b;
    cddp_buf_init(&b, 256);
    struct jsonw w;
    jsonw_init(&w, &b);
    /* Valid multi-byte passes; a lone continuation byte, an overlong form and
     * a surrogate become U+FFFD. */
    jsonw_string(&w, NULL, "\xc3\xa9\xe2\x82\xac|\x80|\xc0\xaf|\xed\xa0\x80");
    assert_int_equal(jsonw_finish(&w), 0);
    assert_string_equal(b.data, "\"\xc3\xa9\xe2\x82\xac|\xef\xbf\xbd|\xef\xbf\xbd\xef\xbf\xbd|"
                                "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\"");
    cddp_buf_free(&b);
}

static void test_misuse(void **state)
{
    (void)state;
    struct cddp_buf b;
    cddp_buf_init(&b, 256);
    struct jsonw w;

    jsonw_init(&w, &b); /* a value without a key in an object */
    jsonw_object_begin(&w, NULL);
    jsonw_int(&w, NULL, 1);
    assert_int_equal(jsonw_finish(&w), CDDP_EPARSE);

    cddp_buf_reset(&b); /* a key in an array */
    jsonw_init(&w, &b);
    jsonw_array_begin(&w, NULL);
    jsonw_int(&w, "k", 1);
    assert_int_equal(jsonw_finish(&w), CDDP_EPARSE);

    cddp_buf_reset(&b); /* unbalanced */
    jsonw_init(&w, &b);
    jsonw_object_begin(&w, NULL);
    assert_int_equal(jsonw_finish(&w), CDDP_EPARSE);
    jsonw_array_end(&w);
    assert_int_equal(jsonw_finish(&w), CDDP_EPARSE);

    cddp_buf_reset(&b); /* two top-level values */
    jsonw_init(&w, &b);
    jsonw_int(&w, NULL, 1);
    assert_int_equal(jsonw_finish(&w), 0);
    jsonw_int(&w, NULL, 2);
    assert_int_equal(jsonw_finish(&w), CDDP_EPARSE);

    cddp_buf_reset(&b); /* too deep */
    jsonw_init(&w, &b);
    for (int i = 0; i <= JSONW_MAX_DEPTH; i++)
        jsonw_array_begin(&w, NULL);
    assert_int_equal(jsonw_finish(&w), CDDP_EPARSE);

    cddp_buf_reset(&b); /* nothing written */
    jsonw_init(&w, &b);
    assert_int_equal(jsonw_finish(&w), CDDP_EPARSE);
    cddp_buf_free(&b);

    cddp_buf_init(&b, 8); /* the buffer's maximum */
    jsonw_init(&w, &b);
    jsonw_string(&w, NULL, "longer than eight");
    assert_int_equal(jsonw_finish(&w), CDDP_ETOOBIG);
    cddp_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_document),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_misuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
