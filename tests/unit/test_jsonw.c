/* Unit tests for common/jsonw.c: the string escaping and the streaming JSON
 * writer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
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

static const char *escaped(struct cddp_buf *b, const char *s, enum cddp_json_escape how)
{
    cddp_buf_reset(b);
    assert_int_equal(cddp_json_put_string(b, s, how), 0);
    return b->data;
}

static void test_escape_modes(void **state)
{
    (void)state;
    struct cddp_buf b;
    cddp_buf_init(&b, 256);
    /* What both modes escape: quote, backslash, the named controls, the
     * other controls as \u00XX; DEL and '/' pass. */
    const char *all = "q\"b\\ \b\f\n\r\t \x01\x1f \x7f/";
    const char *want = "\"q\\\"b\\\\ \\b\\f\\n\\r\\t \\u0001\\u001f \x7f/\"";
    assert_string_equal(escaped(&b, all, CDDP_JSON_STRICT), want);
    assert_string_equal(escaped(&b, all, CDDP_JSON_LOSSY), want);
    /* Bytes that are not UTF-8: kept by STRICT, U+FFFD (one per byte) by LOSSY. */
    assert_string_equal(escaped(&b, "a\xff\xc3(\xc3\xa9", CDDP_JSON_STRICT),
                        "\"a\xff\xc3(\xc3\xa9\"");
    assert_string_equal(escaped(&b, "a\xff\xc3(\xc3\xa9", CDDP_JSON_LOSSY),
                        "\"a\xef\xbf\xbd\xef\xbf\xbd(\xc3\xa9\"");
    assert_string_equal(escaped(&b, "", CDDP_JSON_STRICT), "\"\"");
    /* What a parser reads back is the input. */
    const char *text = "tab\there \"quoted\" \\ \x02 caf\xc3\xa9";
    cJSON *v = cJSON_Parse(escaped(&b, text, CDDP_JSON_STRICT));
    assert_non_null(v);
    assert_string_equal(v->valuestring, text);
    cJSON_Delete(v);
    /* Appends: what was in the buffer stays. */
    cddp_buf_reset(&b);
    cddp_buf_append(&b, "x:", 2);
    assert_int_equal(cddp_json_put_string(&b, "y", CDDP_JSON_STRICT), 0);
    assert_string_equal(b.data, "x:\"y\"");
    cddp_buf_free(&b);
    /* The buffer's maximum. */
    cddp_buf_init(&b, 4);
    assert_int_equal(cddp_json_put_string(&b, "abcdef", CDDP_JSON_LOSSY), CDDP_ETOOBIG);
    cddp_buf_free(&b);
}

static void test_numbers(void **state)
{
    (void)state;
    struct cddp_buf b;
    cddp_buf_init(&b, 256);
    struct jsonw w;
    jsonw_init(&w, &b);
    jsonw_object_begin(&w, NULL);
    jsonw_number_digits(&w, "loss", 2.302585093, 6);
    jsonw_number_fixed(&w, "rate", 1234.56789, 3);
    jsonw_number_fixed(&w, "whole", 7, 0);
    jsonw_number_digits(&w, "nan", NAN, 6);
    jsonw_object_end(&w);
    assert_int_equal(jsonw_finish(&w), 0);
    assert_string_equal(b.data, "{\"loss\":2.30259,\"rate\":1234.568,\"whole\":7,\"nan\":null}");
    cddp_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_document), cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_misuse),   cmocka_unit_test(test_escape_modes),
        cmocka_unit_test(test_numbers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
