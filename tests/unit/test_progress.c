/* Unit tests for proto/progress.c: the worker progress channel, its parser
 * and its line writer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"
#include "proto/progress.h"

static struct progress_parser *new_parser(void)
{
    struct progress_parser *p = malloc(sizeof(*p));
    assert_non_null(p);
    progress_init(p);
    return p;
}

static unsigned feed(struct progress_parser *p, const char *s, uint64_t ms)
{
    return progress_feed(p, s, strlen(s), ms, 1000.0 + (double)ms / 1000.0);
}

static void test_one_line(void **state)
{
    (void)state;
    struct progress_parser *p = new_parser();
    assert_int_equal(
        feed(p, "{\"step\":120,\"epoch\":1,\"loss\":2.31,\"samples_per_s\":612.5}\n", 50), 1);
    const struct progress_report *r = &p->report;
    assert_int_equal(r->fields,
                     PROGRESS_STEP | PROGRESS_EPOCH | PROGRESS_LOSS | PROGRESS_SAMPLES_PER_S);
    assert_int_equal(r->step, 120);
    assert_int_equal(r->epoch, 1);
    assert_true(r->loss == 2.31);
    assert_true(r->samples_per_s == 612.5);
    assert_int_equal(r->mono_ms, 50);
    assert_int_equal(r->step_mono_ms, 50);
    assert_true(fabs(r->wall - 1000.05) < 1e-9);
    assert_int_equal(r->lines, 1);
    assert_int_equal(r->malformed, 0);
    free(p);
}

/* Lines arrive split across reads and several per read. */
static void test_split_and_batched(void **state)
{
    (void)state;
    struct progress_parser *p = new_parser();
    assert_int_equal(feed(p, "{\"st", 1), 0);
    assert_int_equal(feed(p, "ep\": 7", 2), 0);
    assert_int_equal(p->report.lines, 0);
    assert_int_equal(feed(p, "}\n{\"step\":8}\n{\"step\":9}\n{\"step\"", 3), 3);
    assert_int_equal(p->report.step, 9);
    assert_int_equal(feed(p, ":10}\r\n", 4), 1);
    assert_int_equal(p->report.step, 10);
    assert_int_equal(p->report.lines, 4);
    assert_int_equal(p->report.malformed, 0);
    free(p);
}

/* A line updates what it carries; the rest keeps its last value. */
static void test_partial_updates(void **state)
{
    (void)state;
    struct progress_parser *p = new_parser();
    feed(p, "{\"step\":1,\"loss\":4.5}\n", 10);
    feed(p, "{\"step\":2}\n", 20);
    assert_int_equal(p->report.step, 2);
    assert_true(p->report.loss == 4.5);
    assert_int_equal(p->report.fields, PROGRESS_STEP | PROGRESS_LOSS);
    /* Same step again: the line counts, the step did not move. */
    feed(p, "{\"step\":2,\"samples_per_s\":10}\n", 30);
    assert_int_equal(p->report.mono_ms, 30);
    assert_int_equal(p->report.step_mono_ms, 20);
    /* null is "not reported this time". */
    feed(p, "{\"step\":3,\"loss\":null}\n", 40);
    assert_true(p->report.loss == 4.5);
    assert_int_equal(p->report.step_mono_ms, 40);
    free(p);
}

/* Python's json.dumps writes NaN / Infinity for a diverged loss. */
static void test_python_nonfinite(void **state)
{
    (void)state;
    struct progress_parser *p = new_parser();
    assert_int_equal(feed(p, "{\"step\": 5, \"loss\": NaN}\n", 1), 1);
    assert_true(isnan(p->report.loss));
    assert_int_equal(feed(p, "{\"loss\": Infinity}\n", 2), 1);
    assert_true(isinf(p->report.loss) && p->report.loss > 0);
    assert_int_equal(feed(p, "{\"loss\": -Infinity}\n", 3), 1);
    assert_true(isinf(p->report.loss) && p->report.loss < 0);
    /* ... but not for counts and throughput. */
    assert_int_equal(feed(p, "{\"step\": NaN}\n", 4), 0);
    assert_int_equal(feed(p, "{\"samples_per_s\": Infinity}\n", 5), 0);
    assert_int_equal(p->report.malformed, 2);
    free(p);
}

static void test_unknown_keys(void **state)
{
    (void)state;
    struct progress_parser *p = new_parser();
    assert_int_equal(
        feed(p,
             "{\"lr\":0.1,\"tags\":[\"a\",{\"b\":[1,2,{}]}],\"note\":\"x\\\"y\\u00e9\","
             "\"ok\":true,\"no\":false,\"nil\":null,\"step\":4}\n",
             1),
        1);
    assert_int_equal(p->report.step, 4);
    assert_int_equal(feed(p, "{}\n", 2), 1);
    assert_int_equal(p->report.lines, 2);
    free(p);
}

static void test_malformed(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "not json",
        "[1,2]",
        "{\"step\":1",
        "{\"step\":1}}",
        "{\"step\":1} x",
        "{\"step\":-1}",
        "{\"step\":1.5}",
        "{\"step\":\"12\"}",
        "{\"step\":true}",
        "{\"epoch\":1e30}",
        "{\"loss\":\"2.3\"}",
        "{\"samples_per_s\":-1}",
        "{\"step\":01}",
        "{\"step\":1.}",
        "{\"step\":.5}",
        "{\"step\":1e}",
        "{\"step\":+1}",
        "{\"a\":\"bad \\x escape\"}",
        "{\"a\":\"\\u12\"}",
        "{\"a\":\"tab\there\"}",
        "{\"a\" 1}",
        "{\"a\":1,}",
        "{,}",
        "{\"a\":tru}",
        "{\"a\":nan}",
        "{\"step\":1,\"step\":2",
        "{'step':1}",
    };
    struct progress_parser *p = new_parser();
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct progress_report r = {0};
        unsigned f;
        bool a;
        if (progress_parse_line(bad[i], strlen(bad[i]), &r, &f, &a) == 0)
            fail_msg("accepted: %s", bad[i]);
        feed(p, bad[i], 1);
        feed(p, "\n", 1);
    }
    assert_int_equal(p->report.malformed, sizeof(bad) / sizeof(bad[0]));
    assert_int_equal(p->report.lines, 0);
    assert_int_equal(p->report.fields, 0);
    /* A bad line changes nothing, even the fields it got right before failing. */
    feed(p, "{\"step\":5}\n{\"step\":6,\"epoch\":-1}\n", 2);
    assert_int_equal(p->report.step, 5);
    /* Blank lines are not malformed. */
    uint64_t before = p->report.malformed;
    feed(p, "\n  \n\r\n", 3);
    assert_int_equal(p->report.malformed, before);
    free(p);
}

static void test_nesting_bound(void **state)
{
    (void)state;
    char line[256];
    /* {"a": [[[...]]]} nested to the limit is fine, one more is not. */
    for (int depth = PROGRESS_MAX_DEPTH - 1; depth <= PROGRESS_MAX_DEPTH; depth++) {
        size_t n = 0;
        n += (size_t)snprintf(line + n, sizeof(line) - n, "{\"a\":");
        for (int i = 0; i < depth; i++)
            line[n++] = '[';
        for (int i = 0; i < depth; i++)
            line[n++] = ']';
        line[n++] = '}';
        line[n] = '\0';
        struct progress_report r = {0};
        unsigned f;
        bool a;
        int rc = progress_parse_line(line, n, &r, &f, &a);
        assert_int_equal(rc, depth < PROGRESS_MAX_DEPTH ? 0 : CDDP_EPARSE);
    }
}

static void test_line_too_long(void **state)
{
    (void)state;
    struct progress_parser *p = new_parser();
    /* Exactly the maximum is accepted. */
    char *line = malloc(PROGRESS_LINE_MAX + 2);
    memset(line, ' ', PROGRESS_LINE_MAX);
    memcpy(line, "{\"step\":1}", 10);
    line[PROGRESS_LINE_MAX] = '\n';
    assert_int_equal(progress_feed(p, line, PROGRESS_LINE_MAX + 1, 1, 1), 1);
    /* One byte more is dropped whole, in whatever pieces it arrives, and the
     * next line is read normally. */
    memcpy(line, "{\"step\":2}", 10);
    line[PROGRESS_LINE_MAX] = ' ';
    line[PROGRESS_LINE_MAX + 1] = '\n';
    for (size_t off = 0; off < PROGRESS_LINE_MAX + 2; off += 1000) {
        size_t n = PROGRESS_LINE_MAX + 2 - off < 1000 ? PROGRESS_LINE_MAX + 2 - off : 1000;
        assert_int_equal(progress_feed(p, line + off, n, 2, 2), 0);
    }
    assert_int_equal(p->report.malformed, 1);
    assert_int_equal(p->report.step, 1);
    assert_int_equal(feed(p, "{\"step\":3}\n", 3), 1);
    assert_int_equal(p->report.step, 3);
    free(line);
    free(p);
}

static void test_eof_and_restart(void **state)
{
    (void)state;
    struct progress_parser *p = new_parser();
    feed(p, "{\"step\":1}\nbad\n{\"step\":2}", 1);
    assert_int_equal(p->report.step, 1);
    assert_int_equal(progress_eof(p, 2, 2), 1);
    assert_int_equal(p->report.step, 2);
    assert_int_equal(progress_eof(p, 3, 3), 0);
    feed(p, "{\"step\":", 4);
    progress_restart(p);
    /* Counters survive a restart, values and the partial line do not. */
    assert_int_equal(p->report.lines, 2);
    assert_int_equal(p->report.malformed, 1);
    assert_int_equal(p->report.fields, 0);
    assert_int_equal(p->report.mono_ms, 0);
    assert_int_equal(feed(p, "{\"step\":0}\n", 5), 1);
    assert_int_equal(p->report.step, 0);
    assert_int_equal(p->report.step_mono_ms, 5);
    free(p);
}

/* Random bytes and mutated valid lines never crash it and keep the counts
 * consistent (a smoke test; tests/fuzz has the libFuzzer target). */
static void test_random_input(void **state)
{
    (void)state;
    struct progress_parser *p = new_parser();
    static const char alphabet[] = "{}[]\":,0123456789.eE+-ntrufalsNaIiy \\\n";
    static const char seed[] = "{\"step\":12,\"epoch\":1,\"loss\":NaN,\"samples_per_s\":61.5}\n";
    uint32_t x = 12345;
    char buf[256];
    uint64_t newlines = 0;
    for (int round = 0; round < 20000; round++) {
        size_t n;
        if (round % 2) {
            n = sizeof(seed) - 1;
            memcpy(buf, seed, n);
            x = x * 1103515245u + 12345u;
            buf[(x >> 8) % (n - 1)] = alphabet[(x >> 20) % (sizeof(alphabet) - 1)];
        } else {
            x = x * 1103515245u + 12345u;
            n = (x >> 16) % sizeof(buf);
            for (size_t i = 0; i < n; i++) {
                x = x * 1103515245u + 12345u;
                buf[i] =
                    (x >> 24) % 3 ? alphabet[(x >> 16) % (sizeof(alphabet) - 1)] : (char)(x >> 8);
            }
        }
        for (size_t i = 0; i < n; i++)
            newlines += buf[i] == '\n';
        progress_feed(p, buf, n, (uint64_t)round, round);
    }
    assert_true(p->report.lines + p->report.malformed <= newlines);
    assert_true(p->report.lines > 0);
    assert_true(p->report.malformed > 0);
    free(p);
}

/* The writer: the format cddp-train has always written (printf's %.6g and
 * %.3f), one line, and the parser reads back what was written. */
static void test_format_line(void **state)
{
    (void)state;
    const struct {
        int64_t step, epoch;
        double loss, sps;
    } cases[] = {
        {0, 0, 2.302585093, 0.0}, {1, 0, 0.61170001, 158.4444},
        {120, 3, 1e-7, 612.5},    {(int64_t)1 << 40, 1000, 123456789.0, 1e9},
        {7, 1, -0.0, 3.0005},     {42, 2, 65504.0, 0.0004},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char want[256];
        snprintf(want, sizeof(want),
                 "{\"step\":%lld,\"epoch\":%lld,\"loss\":%.6g,\"samples_per_s\":%.3f}\n",
                 (long long)cases[i].step, (long long)cases[i].epoch, cases[i].loss, cases[i].sps);
        struct cddp_buf b;
        cddp_buf_init(&b, 256);
        struct progress_line l = {
            cases[i].step, cases[i].epoch, cases[i].loss, cases[i].sps, -1, -1, -1};
        assert_int_equal(progress_format_line(&b, &l), 0);
        assert_int_equal(b.len, strlen(want));
        assert_memory_equal(b.data, want, b.len);
        struct progress_report r = {0};
        unsigned fields = 0;
        bool is_auto = true;
        assert_int_equal(progress_parse_line(b.data, b.len - 1, &r, &fields, &is_auto), 0);
        assert_false(is_auto);
        assert_int_equal(fields,
                         PROGRESS_STEP | PROGRESS_EPOCH | PROGRESS_LOSS | PROGRESS_SAMPLES_PER_S);
        assert_true(r.step == cases[i].step && r.epoch == cases[i].epoch);
        cddp_buf_free(&b);
    }
    /* A loss that is not finite is written as 0: the line stays JSON. */
    struct cddp_buf b;
    cddp_buf_init(&b, 256);
    struct progress_line nan_loss = {5, 0, NAN, 1.0, -1, -1, -1};
    assert_int_equal(progress_format_line(&b, &nan_loss), 0);
    assert_string_equal(b.data, "{\"step\":5,\"epoch\":0,\"loss\":0,\"samples_per_s\":1.000}\n");
    cddp_buf_free(&b);
    /* The times, to the microsecond, and read back. */
    cddp_buf_init(&b, 256);
    struct progress_line timed = {9, 1, 0.5, 100.0, 0.0123456, 0.01, 0.0023456};
    assert_int_equal(progress_format_line(&b, &timed), 0);
    assert_string_equal(b.data, "{\"step\":9,\"epoch\":1,\"loss\":0.5,\"samples_per_s\":100.000,"
                                "\"step_time_s\":0.012346,\"compute_s\":0.010000,"
                                "\"wait_s\":0.002346}\n");
    struct progress_report r = {0};
    unsigned fields = 0;
    bool is_auto;
    assert_int_equal(progress_parse_line(b.data, b.len - 1, &r, &fields, &is_auto), 0);
    assert_true(fields & PROGRESS_STEP_TIME && fields & PROGRESS_COMPUTE && fields & PROGRESS_WAIT);
    assert_true(fabs(r.step_time_s - 0.012346) < 1e-12 && fabs(r.compute_s - 0.01) < 1e-12 &&
                fabs(r.wait_s - 0.002346) < 1e-12);
    cddp_buf_free(&b);
    /* Past the buffer's maximum: its error, nothing half-written counted. */
    cddp_buf_init(&b, 16);
    struct progress_line one = {5, 0, 1.0, 1.0, -1, -1, -1};
    assert_int_equal(progress_format_line(&b, &one), CDDP_ETOOBIG);
    cddp_buf_free(&b);
}

/* The times: finite numbers >= 0, or the line is dropped. */
static void test_times(void **state)
{
    (void)state;
    struct progress_parser *p = new_parser();
    assert_int_equal(feed(p,
                          "{\"step\":1,\"step_time_s\":0.25,\"compute_s\":0.2,"
                          "\"wait_s\":0.05}\n",
                          10),
                     1);
    assert_true(p->report.step_time_s == 0.25 && p->report.compute_s == 0.2 &&
                p->report.wait_s == 0.05);
    const char *bad[] = {
        "{\"step_time_s\":-1}",    "{\"compute_s\":NaN}", "{\"wait_s\":Infinity}",
        "{\"step_time_s\":\"1\"}", "{\"auto\":1}",        "{\"auto\":\"yes\"}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        feed(p, bad[i], 11);
        feed(p, "\n", 11);
    }
    assert_int_equal(p->report.malformed, sizeof(bad) / sizeof(bad[0]));
    assert_true(p->report.step_time_s == 0.25);
    free(p);
}

/* "auto" lines (cddprun's hook) count until the script sends a line of its
 * own; from then on, for the rest of the attempt, they are ignored whole. */
static void test_auto_stands_aside(void **state)
{
    (void)state;
    struct progress_parser *p = new_parser();
    assert_int_equal(feed(p, "{\"step\":1,\"auto\":true}\n", 10), 1);
    assert_int_equal(feed(p, "{\"step\":2,\"step_time_s\":0.1,\"auto\":true}\n", 20), 1);
    const struct progress_report *r = &p->report;
    assert_true(r->from_auto);
    assert_false(r->own);
    assert_int_equal(r->step, 2);
    assert_int_equal(r->fields, PROGRESS_STEP | PROGRESS_STEP_TIME);
    assert_int_equal(r->lines, 2);
    /* The script's first line: its values replace the hook's. */
    assert_int_equal(feed(p, "{\"loss\":3.5,\"auto\":false}\n", 30), 1);
    assert_true(r->own);
    assert_false(r->from_auto);
    assert_int_equal(r->fields, PROGRESS_LOSS);
    assert_int_equal(r->step_mono_ms, 20);
    /* The hook's later lines change nothing and are not counted. */
    assert_int_equal(feed(p, "{\"step\":3,\"step_time_s\":0.1,\"auto\":true}\n", 40), 0);
    assert_int_equal(r->fields, PROGRESS_LOSS);
    assert_int_equal(r->lines, 3);
    assert_int_equal(r->mono_ms, 30);
    assert_int_equal(feed(p, "{\"step\":100}\n", 50), 1);
    assert_int_equal(r->step, 100);
    assert_int_equal(r->step_mono_ms, 50);
    /* A new attempt: the hook counts again until the script speaks. */
    progress_restart(p);
    assert_false(r->own);
    assert_int_equal(feed(p, "{\"step\":1,\"auto\":true}\n", 60), 1);
    assert_true(r->from_auto && r->step == 1);
    free(p);
}

/* A blame line (cddp-train under --restart_scope=worker): counted, kept
 * across a restart of the slot; a bad rank drops the line. */
static void test_blame(void **state)
{
    (void)state;
    struct progress_parser *p = new_parser();
    const struct progress_report *r = &p->report;
    assert_int_equal(feed(p, "{\"step\":3}\n", 10), 1);
    assert_int_equal(r->blames, 0);
    assert_int_equal(feed(p, "{\"blame\":2,\"blame_gen\":1}\n{\"blame\":3}\n", 20), 2);
    assert_int_equal(r->blames, 2);
    assert_int_equal(r->blame, 3);
    assert_int_equal(r->blame_gen, 0); /* absent on the last line */
    /* both lines of the one read are kept, in order */
    assert_int_equal(r->blame_ranks[0], 2);
    assert_int_equal(r->blame_gens[0], 1);
    assert_int_equal(r->blame_ranks[1], 3);
    assert_int_equal(r->blame_gens[1], 0);
    assert_int_equal(r->step, 3);
    assert_true(r->fields & PROGRESS_BLAME);
    assert_int_equal(feed(p, "{\"blame\":-1}\n{\"blame\":1.5}\n", 30), 0);
    assert_int_equal(r->blames, 2);
    assert_int_equal(r->malformed, 2);
    progress_restart(p);
    assert_int_equal(r->blames, 2);
    assert_int_equal(feed(p, "{\"blame\":0,\"blame_gen\":4}\n", 40), 1);
    assert_int_equal(r->blames, 3);
    assert_int_equal(r->blame, 0);
    assert_int_equal(r->blame_gen, 4);
    assert_int_equal(r->blame_ranks[2], 0); /* the ring outlived the restart */
    assert_int_equal(r->blame_gens[2], 4);
    assert_int_equal(r->blame_ranks[0], 2);
    /* past PROGRESS_BLAMES_KEPT lines, the oldest go */
    for (int k = 0; k < PROGRESS_BLAMES_KEPT; k++) {
        char line[64];
        snprintf(line, sizeof(line), "{\"blame\":%d,\"blame_gen\":7}\n", 10 + k);
        assert_int_equal(feed(p, line, 50 + k), 1);
    }
    assert_int_equal(r->blames, 3 + PROGRESS_BLAMES_KEPT);
    for (uint64_t k = 3; k < r->blames; k++) {
        assert_int_equal(r->blame_ranks[k % PROGRESS_BLAMES_KEPT], 10 + (int64_t)(k - 3));
        assert_int_equal(r->blame_gens[k % PROGRESS_BLAMES_KEPT], 7);
    }
    /* cddp-train's one write of the most ranks it names at once (a
     * node's, hung together: trainer/blame.c) arrives in one read and is
     * kept whole: the agent kills every one of them */
    char all[PROGRESS_BLAMES_KEPT * 64];
    size_t at = 0;
    for (int k = 0; k < PROGRESS_BLAMES_KEPT; k++)
        at += (size_t)snprintf(all + at, sizeof(all) - at, "{\"blame\":%d,\"blame_gen\":9}\n",
                               100 + k);
    uint64_t before = r->blames;
    assert_int_equal(feed(p, all, 90), PROGRESS_BLAMES_KEPT);
    assert_int_equal(r->blames, before + PROGRESS_BLAMES_KEPT);
    for (uint64_t k = before; k < r->blames; k++)
        assert_int_equal(r->blame_ranks[k % PROGRESS_BLAMES_KEPT], 100 + (int64_t)(k - before));
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_line),          cmocka_unit_test(test_split_and_batched),
        cmocka_unit_test(test_partial_updates),   cmocka_unit_test(test_python_nonfinite),
        cmocka_unit_test(test_unknown_keys),      cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_nesting_bound),     cmocka_unit_test(test_line_too_long),
        cmocka_unit_test(test_eof_and_restart),   cmocka_unit_test(test_random_input),
        cmocka_unit_test(test_format_line),       cmocka_unit_test(test_times),
        cmocka_unit_test(test_auto_stands_aside), cmocka_unit_test(test_blame),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
