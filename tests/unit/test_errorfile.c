/* Unit tests for proto/errorfile.c: torchrun's error file, built, read
 * back, and given an error code; both message formats and the bad ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "proto/errorfile.h"

static void test_build(void **state)
{
    (void)state;
    char *json = proto_errorfile_build("ValueError: bad \"x\"", "line 1\nline 2", 1712345678, NULL);
    assert_non_null(json);
    assert_string_equal(json, "{\"message\":{\"message\":\"ValueError: bad \\\"x\\\"\","
                              "\"extraInfo\":{\"py_callstack\":\"line 1\\nline 2\","
                              "\"timestamp\":\"1712345678\"}}}");
    struct proto_errorfile ef;
    assert_int_equal(proto_errorfile_parse(json, &ef, NULL, 0), 0);
    assert_string_equal(ef.message, "line 1\nline 2");
    assert_true(ef.structured);
    assert_true(ef.has_timestamp);
    assert_int_equal(ef.timestamp, 1712345678);
    proto_errorfile_free(&ef);
    assert_null(ef.message);
    free(json);

    int code = -9;
    json = proto_errorfile_build("AgentError: x", "x", 5, &code);
    cJSON *root = cJSON_Parse(json);
    cJSON *msg = cJSON_GetObjectItem(root, "message");
    assert_int_equal(cJSON_GetObjectItem(msg, "errorCode")->valueint, -9);
    cJSON_Delete(root);
    free(json);
}

static void test_set_code(void **state)
{
    (void)state;
    char *json = proto_errorfile_set_code(
        "{\"message\":{\"message\":\"E: x\",\"errorCode\":1,\"extraInfo\":{}},\"other\":[1]}", 3);
    assert_string_equal(json,
                        "{\"message\":{\"message\":\"E: x\",\"extraInfo\":{},\"errorCode\":3},"
                        "\"other\":[1]}");
    free(json);
    /* Code 0 and a plain-string message change nothing but the spacing. */
    json = proto_errorfile_set_code("{\"message\": {\"message\": \"E\"}}", 0);
    assert_string_equal(json, "{\"message\":{\"message\":\"E\"}}");
    free(json);
    json = proto_errorfile_set_code("{\"message\":\"plain\",\"timestamp\":7}", 4);
    assert_string_equal(json, "{\"message\":\"plain\",\"timestamp\":7}");
    free(json);
    assert_null(proto_errorfile_set_code("not json", 1));
}

static void test_parse_formats(void **state)
{
    (void)state;
    struct proto_errorfile ef;
    /* The plain-string form: top-level timestamp, number or digits. */
    assert_int_equal(
        proto_errorfile_parse("{\"message\":\"boom\",\"timestamp\":\"42\"}", &ef, NULL, 0), 0);
    assert_string_equal(ef.message, "boom");
    assert_false(ef.structured);
    assert_true(ef.has_timestamp);
    assert_int_equal(ef.timestamp, 42);
    proto_errorfile_free(&ef);
    assert_int_equal(
        proto_errorfile_parse("{\"message\":\"boom\",\"timestamp\":43.9}", &ef, NULL, 0), 0);
    assert_int_equal(ef.timestamp, 43);
    proto_errorfile_free(&ef);
    /* A record without py_callstack shows message.message; with neither, <N/A>. */
    assert_int_equal(proto_errorfile_parse("{\"message\":{\"message\":\"E: m\"}}", &ef, NULL, 0),
                     0);
    assert_string_equal(ef.message, "E: m");
    assert_false(ef.has_timestamp);
    proto_errorfile_free(&ef);
    assert_int_equal(
        proto_errorfile_parse("{\"message\":{\"extraInfo\":{\"timestamp\":\"x\"}}}", &ef, NULL, 0),
        0);
    assert_string_equal(ef.message, "<N/A>");
    assert_false(ef.has_timestamp); /* "x" is not an integer */
    proto_errorfile_free(&ef);
}

static void test_parse_bad(void **state)
{
    (void)state;
    struct proto_errorfile ef;
    char why[64];
    assert_int_equal(proto_errorfile_parse("[1,2]", &ef, why, sizeof(why)), CDDP_EPARSE);
    assert_string_equal(why, "<error file is not a JSON object>");
    assert_null(ef.message);
    assert_int_equal(proto_errorfile_parse("{\"message\"", &ef, why, sizeof(why)), CDDP_EPARSE);
    assert_string_equal(why, "<error file is not a JSON object>");
    assert_int_equal(proto_errorfile_parse("{\"message\":3}", &ef, why, sizeof(why)), CDDP_EPARSE);
    assert_string_equal(why, "<error file has no \"message\">");
    assert_int_equal(proto_errorfile_parse("{}", &ef, why, sizeof(why)), CDDP_EPARSE);
    assert_string_equal(why, "<error file has no \"message\">");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_build),
        cmocka_unit_test(test_set_code),
        cmocka_unit_test(test_parse_formats),
        cmocka_unit_test(test_parse_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
