/* Unit tests for launcher/cddpctl/safe.c: what a server sends, made safe
 * for a terminal (as text, as JSON, in a parsed document). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/errors.h"
#include "launcher/cddpctl/safe.h"

/* s escaped as text (layout or not), as a NUL-terminated string the test
 * frees. */
static char *text(const char *s, size_t n, bool layout)
{
    struct cddp_buf b;
    cddp_buf_init(&b, 1 << 20);
    assert_int_equal(ctl_safe_text(s, n, layout, &b), 0);
    assert_int_equal(cddp_buf_append(&b, "", 0), 0);
    return b.data;
}

static char *json(const char *s)
{
    struct cddp_buf b;
    cddp_buf_init(&b, 1 << 20);
    assert_int_equal(ctl_safe_json(s, strlen(s), &b), 0);
    assert_int_equal(cddp_buf_append(&b, "", 0), 0);
    return b.data;
}

#define ASSERT_TEXT(in, layout, want)                                                              \
    do {                                                                                           \
        char *got_ = text(in, sizeof(in) - 1, layout);                                             \
        assert_string_equal(got_, want);                                                           \
        free(got_);                                                                                \
    } while (0)

#define ASSERT_JSON(in, want)                                                                      \
    do {                                                                                           \
        char *got_ = json(in);                                                                     \
        assert_string_equal(got_, want);                                                           \
        free(got_);                                                                                \
    } while (0)

static void test_text(void **state)
{
    (void)state;
    ASSERT_TEXT("plain host-1.example", false, "plain host-1.example");
    ASSERT_TEXT("evil\x1b[31mred\x1b]0;t\x07", false, "evil\\x1b[31mred\\x1b]0;t\\x07");
    ASSERT_TEXT("a\nb\tc\rd", false, "a\\x0ab\\x09c\\x0dd");
    ASSERT_TEXT("a\nb\tc\rd", true, "a\nb\tc\\x0dd"); /* layout: lines and tabs stay */
    ASSERT_TEXT("del\x7f", false, "del\\x7f");
    ASSERT_TEXT("csi\xc2\x9b"
                "31m",
                false, "csi\\xc2\\x9b31m"); /* C1 as UTF-8 */
    ASSERT_TEXT("nel\xc2\x85", false, "nel\\xc2\\x85");
    ASSERT_TEXT("bad\xff\xc0\xaf", false, "bad\\xff\\xc0\\xaf"); /* not UTF-8, overlong */
    ASSERT_TEXT("cut\xe6\x97", false, "cut\\xe6\\x97");          /* a sequence cut short */
    /* Letters of any script, and U+00A0 just past C1, stay as they are. */
    ASSERT_TEXT("n\xc3\xb6"
                "de \xe6\x97\xa5\xe6\x9c\xac \xc2\xa0",
                false,
                "n\xc3\xb6"
                "de \xe6\x97\xa5\xe6\x9c\xac \xc2\xa0");
    ASSERT_TEXT("nul\0x", false, "nul\\x00x");
    ASSERT_TEXT("back\\slash", false, "back\\slash"); /* not doubled */
}

static void test_bounded(void **state)
{
    (void)state;
    char buf[12];
    /* Cut to what fits, never in the middle of a raw control. */
    assert_string_equal(ctl_safe("ab\x1b[31mcdefgh", buf, sizeof(buf)), "ab\\x1b[31mc");
    assert_string_equal(ctl_safe("abcdefghi\x1b", buf, sizeof(buf)), "abcdefghi");
    char one[1];
    assert_string_equal(ctl_safe("x", one, sizeof(one)), "");
    char s[16] = "id\x1b[2J";
    ctl_safe_inplace(s, sizeof(s));
    assert_string_equal(s, "id\\x1b[2J");
    /* A full buffer is an error, and what fitted is kept. */
    struct cddp_buf b;
    cddp_buf_init(&b, 5);
    assert_int_equal(ctl_safe_text("ab\x1b", 3, false, &b), CDDP_ETOOBIG);
    assert_string_equal(b.data, "ab");
    cddp_buf_free(&b);
}

static void test_json(void **state)
{
    (void)state;
    /* A clean document: byte for byte. */
    const char *clean = "{\"a\": [1, \"x\\u001by\", \"q\\\"\"], \"b\": null}\n";
    ASSERT_JSON(clean, clean);
    /* Raw controls, C1 and DEL inside strings: JSON escapes. */
    ASSERT_JSON("{\"h\":\"a\x1b[31mb\"}", "{\"h\":\"a\\u001b[31mb\"}");
    ASSERT_JSON("{\"h\":\"a\nb\tc\"}", "{\"h\":\"a\\u000ab\\u0009c\"}");
    ASSERT_JSON("{\"h\":\"\xc2\x9b\x7f\"}", "{\"h\":\"\\u009b\\u007f\"}");
    /* An escaped quote does not end the string. */
    ASSERT_JSON("{\"h\":\"q\\\"\x1b\"}", "{\"h\":\"q\\\"\\u001b\"}");
    /* Not UTF-8: U+FFFD; letters stay. */
    ASSERT_JSON("{\"h\":\"\xff\xc3\xb6\"}", "{\"h\":\"\\ufffd\xc3\xb6\"}");
    /* Between tokens: cJSON's whitespace up to 32 becomes a space, but
     * newlines and tabs stay. */
    ASSERT_JSON("{\x1b\"a\":\r1,\n\t\"b\":2}", "{ \"a\": 1,\n\t\"b\":2}");
    /* The result parses to what the original parses to. */
    const char *doc = "{\"h\":\"a\x1b[31mb\xc2\x85\"}";
    char *safe = json(doc);
    cJSON *x = cJSON_Parse(doc), *y = cJSON_Parse(safe);
    assert_non_null(x);
    assert_non_null(y);
    assert_string_equal(cJSON_GetObjectItem(x, "h")->valuestring,
                        cJSON_GetObjectItem(y, "h")->valuestring);
    cJSON_Delete(x);
    cJSON_Delete(y);
    free(safe);
}

static void test_tree(void **state)
{
    (void)state;
    cJSON *root = cJSON_Parse("{\"k\\u001b\":\"v\\u001b[2J\",\"clean\":\"ok\","
                              "\"arr\":[\"\\u0085\",{\"deep\":\"a\\nb\"}],\"n\":1}");
    assert_non_null(root);
    const char *before = cJSON_GetObjectItem(root, "clean")->valuestring;
    assert_int_equal(ctl_safe_tree(root), 0);
    /* Clean strings are left where they were. */
    assert_ptr_equal(cJSON_GetObjectItem(root, "clean")->valuestring, before);
    assert_string_equal(cJSON_GetObjectItem(root, "k\\x1b")->valuestring, "v\\x1b[2J");
    const cJSON *arr = cJSON_GetObjectItem(root, "arr");
    assert_string_equal(cJSON_GetArrayItem(arr, 0)->valuestring, "\\xc2\\x85");
    assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(arr, 1), "deep")->valuestring,
                        "a\\x0ab");
    assert_int_equal(cJSON_GetObjectItem(root, "n")->valueint, 1);
    assert_int_equal(ctl_safe_tree(NULL), 0);
    cJSON_Delete(root);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_text),
        cmocka_unit_test(test_bounded),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_tree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
