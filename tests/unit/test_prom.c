/* Unit tests for status/prom.c: the Prometheus text format writer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/errors.h"
#include "status/prom.h"

static void test_page(void **state)
{
    (void)state;
    struct cddp_buf b;
    cddp_buf_init(&b, 4096);
    struct prom_writer w;
    prom_init(&w, &b);
    assert_int_equal(prom_family(&w, "cddp_agent_restarts_total", PROM_COUNTER,
                                 "Worker group restarts, by reason."),
                     0);
    assert_int_equal(prom_sample1(&w, "reason", "worker_failure", 2), 0);
    assert_int_equal(prom_sample1(&w, "reason", "membership_change", 0), 0);
    assert_int_equal(prom_family(&w, "cddp_agent_rdzv_round", PROM_GAUGE, "Round."), 0);
    assert_int_equal(prom_sample0(&w, 3), 0);
    struct prom_label two[] = {{"local_rank", "0"}, {"run_id", "job7"}};
    assert_int_equal(prom_family(&w, "cddp_worker_loss", PROM_GAUGE, "Loss."), 0);
    assert_int_equal(prom_sample(&w, two, 2, 2.31), 0);
    assert_int_equal(prom_finish(&w), 0);
    assert_string_equal(b.data,
                        "# HELP cddp_agent_restarts_total Worker group restarts, by reason.\n"
                        "# TYPE cddp_agent_restarts_total counter\n"
                        "cddp_agent_restarts_total{reason=\"worker_failure\"} 2\n"
                        "cddp_agent_restarts_total{reason=\"membership_change\"} 0\n"
                        "# HELP cddp_agent_rdzv_round Round.\n"
                        "# TYPE cddp_agent_rdzv_round gauge\n"
                        "cddp_agent_rdzv_round 3\n"
                        "# HELP cddp_worker_loss Loss.\n"
                        "# TYPE cddp_worker_loss gauge\n"
                        "cddp_worker_loss{local_rank=\"0\",run_id=\"job7\"} 2.31\n");
    cddp_buf_free(&b);
}

static void test_escaping(void **state)
{
    (void)state;
    struct cddp_buf b;
    cddp_buf_init(&b, 4096);
    struct prom_writer w;
    prom_init(&w, &b);
    assert_int_equal(prom_family(&w, "x", PROM_GAUGE, "a \\ back\nslash \"q\""), 0);
    assert_int_equal(prom_sample1(&w, "run_id", "a\"b\\c\nd", 1), 0);
    /* Not UTF-8: 0xff and a lone continuation byte become U+FFFD; valid
     * multi-byte sequences pass through. */
    assert_int_equal(prom_sample1(&w, "run_id", "\xff-\x80-\xc3\xa9", 2), 0);
    assert_int_equal(prom_finish(&w), 0);
    assert_string_equal(b.data, "# HELP x a \\\\ back\\nslash \"q\"\n"
                                "# TYPE x gauge\n"
                                "x{run_id=\"a\\\"b\\\\c\\nd\"} 1\n"
                                "x{run_id=\"\xef\xbf\xbd-\xef\xbf\xbd-\xc3\xa9\"} 2\n");
    cddp_buf_free(&b);
}

static void test_values(void **state)
{
    (void)state;
    char buf[64];
    struct {
        double v;
        const char *want;
    } cases[] = {
        {0, "0"},
        {3, "3"},
        {-2, "-2"},
        {0.1, "0.1"},
        {612.5, "612.5"},
        {1712345678.123, "1712345678.123"},
        {1.0 / 3.0, "0.3333333333333333"},
        {0.1 + 0.2, "0.30000000000000004"},
        {1e300, "1e+300"},
        {NAN, "NaN"},
        {INFINITY, "+Inf"},
        {-INFINITY, "-Inf"},
        {9007199254740993.0, "9007199254740992"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        prom_format_value(cases[i].v, buf, sizeof(buf));
        assert_string_equal(buf, cases[i].want);
    }
}

static void test_names(void **state)
{
    (void)state;
    assert_true(prom_valid_metric_name("cddp_agent_ready"));
    assert_true(prom_valid_metric_name("a:b_c9"));
    assert_true(prom_valid_metric_name("_x"));
    assert_false(prom_valid_metric_name("9x"));
    assert_false(prom_valid_metric_name("a-b"));
    assert_false(prom_valid_metric_name(""));
    assert_false(prom_valid_metric_name("a b"));
    assert_true(prom_valid_label_name("local_rank"));
    assert_false(prom_valid_label_name("__name__"));
    assert_false(prom_valid_label_name("a:b"));
    assert_false(prom_valid_label_name("1a"));
    assert_false(prom_valid_label_name(""));
}

/* Each misuse fails, and the failure sticks: nothing more is written. */
static void check_sticky(int (*misuse)(struct prom_writer *), int want)
{
    struct cddp_buf b;
    cddp_buf_init(&b, 4096);
    struct prom_writer w;
    prom_init(&w, &b);
    assert_int_equal(misuse(&w), want);
    size_t len = b.len;
    assert_int_equal(prom_family(&w, "fine", PROM_GAUGE, "ok"), want);
    assert_int_equal(prom_sample0(&w, 1), want);
    assert_int_equal(prom_finish(&w), want);
    assert_int_equal(b.len, len);
    cddp_buf_free(&b);
}

static int counter_without_total(struct prom_writer *w)
{
    return prom_family(w, "cddp_restarts", PROM_COUNTER, "x");
}
static int bad_metric_name(struct prom_writer *w)
{
    return prom_family(w, "cddp-restarts", PROM_GAUGE, "x");
}
static int sample_before_family(struct prom_writer *w)
{
    return prom_sample0(w, 1);
}
static int family_twice(struct prom_writer *w)
{
    prom_family(w, "a", PROM_GAUGE, "x");
    prom_sample0(w, 1);
    prom_family(w, "b", PROM_GAUGE, "x");
    return prom_family(w, "a", PROM_GAUGE, "x");
}
static int reserved_label(struct prom_writer *w)
{
    prom_family(w, "a", PROM_GAUGE, "x");
    return prom_sample1(w, "__name__", "b", 1);
}
static int duplicate_label(struct prom_writer *w)
{
    struct prom_label l[] = {{"a", "1"}, {"a", "2"}};
    prom_family(w, "a", PROM_GAUGE, "x");
    return prom_sample(w, l, 2, 1);
}

static void test_misuse(void **state)
{
    (void)state;
    check_sticky(counter_without_total, CDDP_EPARSE);
    check_sticky(bad_metric_name, CDDP_EPARSE);
    check_sticky(sample_before_family, CDDP_EPARSE);
    check_sticky(family_twice, CDDP_EEXISTS);
    check_sticky(reserved_label, CDDP_EPARSE);
    check_sticky(duplicate_label, CDDP_EPARSE);
}

static void test_buffer_limit(void **state)
{
    (void)state;
    struct cddp_buf b;
    cddp_buf_init(&b, 64);
    struct prom_writer w;
    prom_init(&w, &b);
    prom_family(&w, "cddp_a_rather_long_metric_name", PROM_GAUGE, "a rather long help text");
    prom_sample0(&w, 1);
    assert_int_equal(prom_finish(&w), CDDP_ETOOBIG);
    cddp_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_page),   cmocka_unit_test(test_escaping),
        cmocka_unit_test(test_values), cmocka_unit_test(test_names),
        cmocka_unit_test(test_misuse), cmocka_unit_test(test_buffer_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
