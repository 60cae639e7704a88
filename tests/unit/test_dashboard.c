/* Unit tests for status/dashboard.c: which clients of `/` get the dashboard
 * (HTML) and which keep the plain-text index; and the embedded page. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "status/dashboard.h"

static void test_browsers_get_html(void **state)
{
    (void)state;
    /* Chromium's and Firefox's Accept for a page load. */
    assert_true(status_dashboard_wants_html(
        "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,"
        "image/apng,*/*;q=0.8,application/signed-exchange;v=b3;q=0.7"));
    assert_true(status_dashboard_wants_html(
        "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"));
    assert_true(status_dashboard_wants_html("text/html"));
    assert_true(status_dashboard_wants_html("application/xhtml+xml"));
    assert_true(status_dashboard_wants_html("TEXT/HTML"));
    assert_true(status_dashboard_wants_html("  text/html ; charset=utf-8 ; q=0.9 , */*;q=0.1"));
    /* A tie goes to HTML: the client named it. */
    assert_true(status_dashboard_wants_html("text/plain, text/html"));
    assert_true(status_dashboard_wants_html("text/plain;q=0.5, text/html;q=0.5"));
    /* text/plain's own range counts, not the wildcard above it. */
    assert_true(status_dashboard_wants_html("*/*;q=1, text/plain;q=0.1, text/html;q=0.5"));
    assert_true(status_dashboard_wants_html("text/html;q=1.000"));
}

static void test_plain_clients_get_text(void **state)
{
    (void)state;
    assert_false(status_dashboard_wants_html(NULL));
    assert_false(status_dashboard_wants_html(""));
    assert_false(status_dashboard_wants_html("*/*"));        /* curl, wget */
    assert_false(status_dashboard_wants_html("text/plain")); /* asked for text */
    assert_false(status_dashboard_wants_html("text/*"));
    assert_false(status_dashboard_wants_html("application/json"));
    assert_false(status_dashboard_wants_html(",,, ;;"));
    /* Prometheus' scrape Accept (it names no HTML). */
    assert_false(status_dashboard_wants_html(
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
        "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"));
    /* HTML ranked below text, or refused. */
    assert_false(status_dashboard_wants_html("text/plain, text/html;q=0.9"));
    assert_false(status_dashboard_wants_html("text/html;q=0.5, text/*"));
    assert_false(status_dashboard_wants_html("text/html;q=0.5, */*"));
    assert_false(status_dashboard_wants_html("text/html;q=0"));
    /* "text/htmlx" and "xtext/html" are other types. */
    assert_false(status_dashboard_wants_html("text/htmlx"));
    assert_false(status_dashboard_wants_html("xtext/html"));
}

static void test_malformed_quality_never_wins(void **state)
{
    (void)state;
    assert_false(status_dashboard_wants_html("text/html;q=abc"));
    assert_false(status_dashboard_wants_html("text/html;q=2"));
    assert_false(status_dashboard_wants_html("text/html;q=-1"));
    assert_false(status_dashboard_wants_html("text/html;q="));
    assert_false(status_dashboard_wants_html("text/html;q=0.500000000001"));
    assert_false(status_dashboard_wants_html("text/html;q=nan"));
    /* Other parameters are not q. */
    assert_true(status_dashboard_wants_html("text/html;quality=0;level=1"));
}

static void test_huge_header_gets_text(void **state)
{
    (void)state;
    size_t n = STATUS_ACCEPT_MAX + 100;
    char *big = malloc(n + 1);
    assert_non_null(big);
    memset(big, ' ', n);
    memcpy(big, "text/html", 9);
    big[n] = '\0';
    assert_false(status_dashboard_wants_html(big));
    big[STATUS_ACCEPT_MAX] = '\0';
    assert_true(status_dashboard_wants_html(big));
    free(big);
}

static void test_page_is_embedded_and_self_contained(void **state)
{
    (void)state;
    assert_true(status_dashboard_html_len > 1000);
    assert_int_equal(strlen(status_dashboard_html), status_dashboard_html_len);
    assert_memory_equal(status_dashboard_html, "<!doctype html>", 15);
    assert_non_null(strstr(status_dashboard_html, "</html>"));
    /* It polls its own /status, relative to where it is served. */
    assert_non_null(strstr(status_dashboard_html, "fetch(\"status\""));
    /* No external assets: nothing is loaded from elsewhere. */
    assert_null(strstr(status_dashboard_html, "src=\""));
    assert_null(strstr(status_dashboard_html, "https://"));
    assert_null(strstr(status_dashboard_html, "<link rel=\"stylesheet\""));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_browsers_get_html),
        cmocka_unit_test(test_plain_clients_get_text),
        cmocka_unit_test(test_malformed_quality_never_wins),
        cmocka_unit_test(test_huge_header_gets_text),
        cmocka_unit_test(test_page_is_embedded_and_self_contained),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
