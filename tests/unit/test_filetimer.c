/*
 * Unit tests for agent/filetimer_core.c: torch's FileTimerClient lines
 * (the bytes FileTimerRequest.to_json writes), malformed ones, and the
 * timer table's rules (torch's FileTimerServer: the earliest expired timer
 * with a signal chooses it; every timer of a reaped pid goes; release).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "agent/filetimer_core.h"
#include "common/errors.h"

static int parse(const char *s, struct filetimer_request *r)
{
    char err[256] = "";
    int rc = filetimer_parse(s, strlen(s), r, err, sizeof(err));
    if (rc)
        assert_true(err[0] != '\0'); /* every refusal says why */
    return rc;
}

static void parses_torch_lines(void **state)
{
    (void)state;
    struct filetimer_request r;
    /* torch 1.13's FileTimerRequest.to_json, as json.dumps writes it */
    assert_int_equal(parse("{\"version\": 1, \"pid\": 4242, \"scope_id\": \"train.py#12\", "
                           "\"expiration_time\": 1764592000.25, \"signal\": 9}",
                           &r),
                     0);
    assert_int_equal(r.pid, 4242);
    assert_string_equal(r.scope, "train.py#12");
    assert_true(r.expiration == 1764592000.25);
    assert_int_equal(r.signal, 9);
    /* a release */
    assert_int_equal(parse("{\"version\": 1, \"pid\": 7, \"scope_id\": \"s\", "
                           "\"expiration_time\": -1, \"signal\": 0}",
                           &r),
                     0);
    assert_true(r.expiration < 0);
    assert_int_equal(r.signal, 0);
    /* a negative signal kills nothing; escapes decoded; version not required */
    assert_int_equal(parse("{\"pid\": 7, \"scope_id\": \"a\\\"b\\u00e9\", "
                           "\"expiration_time\": 5, \"signal\": -3}",
                           &r),
                     0);
    assert_int_equal(r.signal, 0);
    assert_string_equal(r.scope, "a\"b\xc3\xa9");
}

static void refuses_malformed(void **state)
{
    (void)state;
    struct filetimer_request r;
    assert_int_equal(parse("", &r), CDDP_EPARSE);
    assert_int_equal(parse("garbage", &r), CDDP_EPARSE);
    assert_int_equal(parse("[1,2]", &r), CDDP_EPARSE);
    assert_int_equal(parse("{\"pid\": 1, \"scope_id\": \"s\", \"expiration_time\": 1", &r),
                     CDDP_EPARSE);
    assert_int_equal(parse("{\"scope_id\": \"s\", \"expiration_time\": 1, \"signal\": 9}", &r),
                     CDDP_EPROTO_FIELD);
    assert_int_equal(
        parse("{\"pid\": \"1\", \"scope_id\": \"s\", \"expiration_time\": 1, \"signal\": 9}", &r),
        CDDP_EPROTO_FIELD);
    assert_int_equal(
        parse("{\"pid\": 1.5, \"scope_id\": \"s\", \"expiration_time\": 1, \"signal\": 9}", &r),
        CDDP_EPROTO_FIELD);
    assert_int_equal(
        parse("{\"pid\": 1, \"scope_id\": 3, \"expiration_time\": 1, \"signal\": 9}", &r),
        CDDP_EPROTO_FIELD);
    assert_int_equal(
        parse("{\"pid\": 1, \"scope_id\": \"s\", \"expiration_time\": \"x\", \"signal\": 9}", &r),
        CDDP_EPROTO_FIELD);
    assert_int_equal(parse("{\"pid\": 1, \"scope_id\": \"s\", \"expiration_time\": 1}", &r),
                     CDDP_EPROTO_FIELD);
    assert_int_equal(
        parse("{\"pid\": 0, \"scope_id\": \"s\", \"expiration_time\": 1, \"signal\": 9}", &r),
        CDDP_ERANGE_ARG);
    assert_int_equal(
        parse("{\"pid\": -5, \"scope_id\": \"s\", \"expiration_time\": 1, \"signal\": 9}", &r),
        CDDP_ERANGE_ARG);
    assert_int_equal(
        parse("{\"pid\": 1, \"scope_id\": \"s\", \"expiration_time\": 1, \"signal\": 65}", &r),
        CDDP_ERANGE_ARG);
    char big[FILETIMER_MAX_LINE + 2];
    memset(big, ' ', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(parse(big, &r), CDDP_ETOOBIG);
    char scope[FILETIMER_MAX_SCOPE + 1];
    memset(scope, 'x', sizeof(scope) - 1);
    scope[sizeof(scope) - 1] = '\0';
    char line[FILETIMER_MAX_LINE];
    snprintf(line, sizeof(line),
             "{\"pid\": 1, \"scope_id\": \"%s\", \"expiration_time\": 1, \"signal\": 9}", scope);
    assert_int_equal(parse(line, &r), CDDP_ETOOBIG);
}

static struct filetimer_request req(int64_t pid, const char *scope, double exp, int sig)
{
    struct filetimer_request r = {.pid = pid, .expiration = exp, .signal = sig};
    snprintf(r.scope, sizeof(r.scope), "%s", scope);
    return r;
}

static void arms_releases_expires(void **state)
{
    (void)state;
    struct filetimer_table t;
    filetimer_table_init(&t, 3);
    struct filetimer_request r;
    assert_true(filetimer_next(&t) == 0);
    r = req(10, "a", 100, 9);
    assert_int_equal(filetimer_apply(&t, &r), 0);
    r = req(10, "b", 90, 0);
    assert_int_equal(filetimer_apply(&t, &r), 0);
    r = req(20, "a", 200, 15);
    assert_int_equal(filetimer_apply(&t, &r), 0);
    assert_true(filetimer_next(&t) == 90);
    /* full: a fourth is refused, a re-arm of one armed is not */
    r = req(30, "a", 1, 9);
    assert_int_equal(filetimer_apply(&t, &r), CDDP_ETOOBIG);
    r = req(20, "a", 150, 15);
    assert_int_equal(filetimer_apply(&t, &r), 0);
    struct filetimer_kill k[4];
    /* nothing expired yet */
    assert_int_equal(filetimer_expired(&t, 89, k, 4), 0);
    /* pid 10's "b" expired but has no signal: torch does not reap, drops both */
    assert_int_equal(filetimer_expired(&t, 95, k, 4), 1);
    assert_int_equal(k[0].pid, 10);
    assert_int_equal(k[0].signal, 0);
    assert_string_equal(k[0].scope, "b");
    assert_int_equal(t.n, 1);
    /* release, then a release of nothing */
    r = req(20, "a", -1, 0);
    assert_int_equal(filetimer_apply(&t, &r), 0);
    assert_int_equal(filetimer_apply(&t, &r), 0);
    assert_int_equal(t.n, 0);
    assert_true(filetimer_next(&t) == 0);
    filetimer_table_free(&t);
}

static void earliest_signal_wins(void **state)
{
    (void)state;
    struct filetimer_table t;
    filetimer_table_init(&t, 16);
    struct filetimer_request r = req(5, "late", 50, 15);
    filetimer_apply(&t, &r);
    r = req(5, "nosig", 10, 0);
    filetimer_apply(&t, &r);
    r = req(5, "early", 20, 9);
    filetimer_apply(&t, &r);
    r = req(5, "future", 500, 6);
    filetimer_apply(&t, &r);
    r = req(6, "other", 30, 9);
    filetimer_apply(&t, &r);
    struct filetimer_kill k[1];
    /* at most max pids per call; the rest stay */
    assert_int_equal(filetimer_expired(&t, 60, k, 1), 1);
    int64_t first = k[0].pid;
    if (first == 5) {
        assert_int_equal(k[0].signal, 9);
        assert_string_equal(k[0].scope, "early");
        assert_true(k[0].expiration == 20);
    }
    assert_int_equal(filetimer_expired(&t, 60, k, 1), 1);
    assert_true(k[0].pid != first);
    if (k[0].pid == 5)
        assert_int_equal(k[0].signal, 9);
    /* every timer of pid 5 went, the unexpired "future" too (torch's clear_timers) */
    assert_int_equal(t.n, 0);
    assert_int_equal(filetimer_expired(&t, 1e12, k, 1), 0);
    filetimer_table_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(parses_torch_lines),
        cmocka_unit_test(refuses_malformed),
        cmocka_unit_test(arms_releases_expires),
        cmocka_unit_test(earliest_signal_wins),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
