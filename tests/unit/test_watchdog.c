/*
 * Unit tests for agent/watchdog.c with a fake clock (the time is an
 * argument): off, fixed and initial timeouts, AUTO's warm-up, learning,
 * floor and ceiling, what a restart carries, exits, several ranks, and a
 * random walk against a direct model of the rules.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "agent/watchdog.h"

static struct watchdog wd;

static void init(enum watchdog_mode mode, uint64_t timeout, uint64_t initial, unsigned warmup,
                 double safety, int n)
{
    struct watchdog_config c = {.mode = mode,
                                .timeout_ms = timeout,
                                .initial_ms = initial,
                                .warmup = warmup,
                                .safety = safety};
    assert_int_equal(watchdog_init(&wd, &c, n), 0);
}

static void off_never_fires(void **state)
{
    (void)state;
    init(WATCHDOG_OFF, 1000, 1000, 5, 5, 2);
    watchdog_start(&wd, 0, 100);
    watchdog_report(&wd, 0, 200, true, 1);
    assert_int_equal(watchdog_timeout(&wd, 0), 0);
    assert_int_equal(watchdog_next_deadline(&wd), 0);
    assert_int_equal(watchdog_hung(&wd, UINT64_MAX), -1);
    watchdog_free(&wd);
}

static void fixed_after_first_line(void **state)
{
    (void)state;
    init(WATCHDOG_FIXED, 2000, 0, 5, 5, 1);
    watchdog_start(&wd, 0, 1000);
    /* No line yet and no initial timeout: never hung, however long. */
    assert_int_equal(watchdog_deadline(&wd, 0), 0);
    assert_int_equal(watchdog_hung(&wd, 1000000), -1);
    watchdog_report(&wd, 0, 5000, true, 0);
    assert_int_equal(watchdog_timeout(&wd, 0), 2000);
    assert_int_equal(watchdog_deadline(&wd, 0), 7000);
    assert_int_equal(watchdog_hung(&wd, 6999), -1);
    assert_int_equal(watchdog_hung(&wd, 7000), 0);
    /* A line (with or without a step) resets it. */
    watchdog_report(&wd, 0, 6500, false, 0);
    assert_int_equal(watchdog_deadline(&wd, 0), 8500);
    assert_int_equal(watchdog_hung(&wd, 7000), -1);
    watchdog_free(&wd);
}

static void initial_covers_startup(void **state)
{
    (void)state;
    init(WATCHDOG_FIXED, 2000, 10000, 5, 5, 1);
    watchdog_start(&wd, 0, 1000);
    assert_int_equal(watchdog_timeout(&wd, 0), 10000);
    assert_int_equal(watchdog_deadline(&wd, 0), 11000);
    assert_int_equal(watchdog_hung(&wd, 10999), -1);
    assert_int_equal(watchdog_hung(&wd, 11000), 0);
    /* The first line switches to the fixed timeout, from that line. */
    watchdog_report(&wd, 0, 10500, true, 0);
    assert_int_equal(watchdog_deadline(&wd, 0), 12500);
    /* A restart: the initial timeout again, from the new start. */
    watchdog_start(&wd, 0, 20000);
    assert_int_equal(watchdog_deadline(&wd, 0), 30000);
    watchdog_free(&wd);
}

static void exit_stops_watching(void **state)
{
    (void)state;
    init(WATCHDOG_FIXED, 1000, 5000, 5, 5, 2);
    watchdog_start(&wd, 0, 0);
    watchdog_start(&wd, 1, 0);
    watchdog_report(&wd, 0, 100, true, 1);
    watchdog_exit(&wd, 0);
    assert_int_equal(watchdog_deadline(&wd, 0), 0);
    /* Reports after the exit (lines drained late) are ignored. */
    assert_false(watchdog_report(&wd, 0, 200, true, 2));
    assert_int_equal(watchdog_deadline(&wd, 0), 0);
    assert_int_equal(watchdog_next_deadline(&wd), 5000);
    assert_int_equal(watchdog_hung(&wd, 5000), 1);
    /* Out-of-range ranks are ignored. */
    watchdog_start(&wd, 7, 0);
    watchdog_exit(&wd, -1);
    assert_false(watchdog_report(&wd, 2, 0, false, 0));
    assert_int_equal(watchdog_timeout(&wd, 5), 0);
    watchdog_free(&wd);
}

static void lowest_rank_and_earliest_deadline(void **state)
{
    (void)state;
    init(WATCHDOG_FIXED, 1000, 0, 5, 5, 3);
    for (int i = 0; i < 3; i++)
        watchdog_start(&wd, i, 0);
    watchdog_report(&wd, 2, 100, true, 0);
    watchdog_report(&wd, 1, 300, true, 0);
    watchdog_report(&wd, 0, 500, true, 0);
    assert_int_equal(watchdog_next_deadline(&wd), 1100);
    assert_int_equal(watchdog_hung(&wd, 1100), 2);
    assert_int_equal(watchdog_hung(&wd, 2000), 0); /* all hung: the lowest rank */
    watchdog_free(&wd);
}

static void auto_warmup_then_learned(void **state)
{
    (void)state;
    init(WATCHDOG_AUTO, 0, 0, 5, 5, 1);
    watchdog_start(&wd, 0, 0);
    uint64_t t = 1000;
    /* Four lines: still warming up, the ceiling applies. */
    for (int k = 0; k < 4; k++, t += 400) {
        assert_false(watchdog_report(&wd, 0, t, true, k));
        assert_int_equal(watchdog_timeout(&wd, 0), WATCHDOG_CEILING_MS);
    }
    /* The fifth: 400 ms x 5. */
    assert_true(watchdog_report(&wd, 0, t, true, 4));
    assert_int_equal(watchdog_timeout(&wd, 0), 2000);
    assert_int_equal(watchdog_deadline(&wd, 0), t + 2000);
    assert_int_equal(watchdog_hung(&wd, t + 1999), -1);
    assert_int_equal(watchdog_hung(&wd, t + 2000), 0);
    watchdog_free(&wd);
}

static void auto_slow_but_steady_is_never_hung(void **state)
{
    (void)state;
    init(WATCHDOG_AUTO, 0, 0, 3, 5, 1);
    watchdog_start(&wd, 0, 0);
    uint64_t t = 0, gap = 200;
    /* Intervals that grow slowly (each within the timeout learned from the
     * ones before) raise the timeout and never trip it. */
    for (int k = 0; k < 200; k++) {
        t += gap;
        assert_int_equal(watchdog_hung(&wd, t), -1);
        watchdog_report(&wd, 0, t, true, k);
        gap = gap * 11 / 10;
        if (gap > 60000)
            gap = 60000;
    }
    assert_int_equal(watchdog_timeout(&wd, 0), 300000);
    watchdog_free(&wd);
}

static void auto_learns_longest_interval_only_grows(void **state)
{
    (void)state;
    init(WATCHDOG_AUTO, 0, 0, 2, 3, 1);
    watchdog_start(&wd, 0, 0);
    watchdog_report(&wd, 0, 1000, true, 0);
    assert_true(watchdog_report(&wd, 0, 2000, true, 1)); /* 1000 x 3 */
    assert_int_equal(watchdog_timeout(&wd, 0), 3000);
    watchdog_report(&wd, 0, 2100, true, 2); /* shorter: unchanged */
    assert_int_equal(watchdog_timeout(&wd, 0), 3000);
    /* 1050 x 3 = 3150: within 10% of 3000, learned but not reported. */
    assert_false(watchdog_report(&wd, 0, 3150, true, 3));
    assert_int_equal(watchdog_timeout(&wd, 0), 3150);
    /* 2000 x 3 = 6000: reported. */
    assert_true(watchdog_report(&wd, 0, 5150, true, 4));
    assert_int_equal(watchdog_timeout(&wd, 0), 6000);
    /* Two lines in the same millisecond are no interval. */
    assert_false(watchdog_report(&wd, 0, 5150, false, 0));
    assert_int_equal(watchdog_timeout(&wd, 0), 6000);
    watchdog_free(&wd);
}

static void auto_floor_and_ceiling(void **state)
{
    (void)state;
    init(WATCHDOG_AUTO, 0, 0, 2, 5, 2);
    watchdog_start(&wd, 0, 0);
    watchdog_report(&wd, 0, 10, true, 0);
    watchdog_report(&wd, 0, 11, true, 1); /* 1 ms x 5 */
    assert_int_equal(watchdog_timeout(&wd, 0), WATCHDOG_FLOOR_MS);
    watchdog_start(&wd, 1, 0);
    watchdog_report(&wd, 1, 10, true, 0);
    watchdog_report(&wd, 1, 10 + 3000000, true, 1); /* 50 min x 5 */
    assert_int_equal(watchdog_timeout(&wd, 1), WATCHDOG_CEILING_MS);
    watchdog_free(&wd);
}

/* A configured floor (cddprun's --watchdog_floor) is the least learned
 * timeout; one below WATCHDOG_FLOOR_MS is raised to it, one above the
 * ceiling is the ceiling. */
static void auto_configured_floor(void **state)
{
    (void)state;
    const uint64_t floors[] = {60000, 500, WATCHDOG_CEILING_MS + 1};
    const uint64_t want[] = {60000, WATCHDOG_FLOOR_MS, WATCHDOG_CEILING_MS};
    for (size_t k = 0; k < 3; k++) {
        struct watchdog_config c = {
            .mode = WATCHDOG_AUTO, .warmup = 2, .safety = 5, .floor_ms = floors[k]};
        assert_int_equal(watchdog_init(&wd, &c, 1), 0);
        watchdog_start(&wd, 0, 0);
        watchdog_report(&wd, 0, 10, true, 0);
        watchdog_report(&wd, 0, 210, true, 1); /* 200 ms x 5 = 1 s */
        assert_int_equal(watchdog_timeout(&wd, 0), want[k]);
        assert_int_equal(watchdog_deadline(&wd, 0), 210 + want[k]);
        /* Within the floor, a longer interval still raises it past the floor. */
        if (k == 0) {
            watchdog_report(&wd, 0, 210 + 20000, true, 2); /* 20 s x 5 */
            assert_int_equal(watchdog_timeout(&wd, 0), 100000);
        }
        watchdog_free(&wd);
    }
}

static void auto_carried_to_next_attempt(void **state)
{
    (void)state;
    init(WATCHDOG_AUTO, 0, 7000, 5, 5, 1);
    watchdog_start(&wd, 0, 0);
    for (int k = 0; k < 5; k++)
        watchdog_report(&wd, 0, 1000 + 200u * (unsigned)k, true, k);
    assert_int_equal(watchdog_timeout(&wd, 0), 1000);
    watchdog_exit(&wd, 0);
    assert_int_equal(watchdog_timeout(&wd, 0), 0);
    /* The restart: the initial timeout until its first line, then the
     * learned one at once (no second warm-up); the start-up gap is not
     * learned from. */
    watchdog_start(&wd, 0, 50000);
    assert_int_equal(watchdog_timeout(&wd, 0), 7000);
    assert_false(watchdog_report(&wd, 0, 90000, true, 0));
    assert_int_equal(watchdog_timeout(&wd, 0), 1000);
    assert_int_equal(watchdog_deadline(&wd, 0), 91000);
    watchdog_free(&wd);
}

static void auto_warmup_one_and_bad_config(void **state)
{
    (void)state;
    /* warmup 0 is 1; safety <= 0 is 1. */
    init(WATCHDOG_AUTO, 0, 0, 0, -2, 1);
    watchdog_start(&wd, 0, 0);
    assert_false(watchdog_report(&wd, 0, 100, true, 0)); /* no interval yet */
    assert_true(watchdog_report(&wd, 0, 2100, true, 1));
    assert_int_equal(watchdog_timeout(&wd, 0), 2000);
    watchdog_free(&wd);
    assert_string_equal(watchdog_mode_name(WATCHDOG_OFF), "off");
    assert_string_equal(watchdog_mode_name(WATCHDOG_FIXED), "fixed");
    assert_string_equal(watchdog_mode_name(WATCHDOG_AUTO), "auto");
}

/* A random walk against a model of the rules written differently: the
 * deadline is recomputed from the history of lines each time. */
struct model {
    bool running;
    uint64_t start, last;
    uint64_t lines, lines_total, max_gap;
};

static uint64_t model_deadline(const struct model *m, const struct watchdog_config *c)
{
    if (!m->running || c->mode == WATCHDOG_OFF)
        return 0;
    if (m->lines == 0)
        return c->initial_ms ? m->start + c->initial_ms : 0;
    uint64_t t = c->timeout_ms;
    if (c->mode == WATCHDOG_AUTO) {
        t = WATCHDOG_CEILING_MS;
        if (m->lines_total >= c->warmup && m->max_gap > 0) {
            double v = (double)m->max_gap * c->safety;
            t = v < WATCHDOG_FLOOR_MS     ? WATCHDOG_FLOOR_MS
                : v > WATCHDOG_CEILING_MS ? WATCHDOG_CEILING_MS
                                          : (uint64_t)(v + 0.5);
        }
    }
    return m->last + t;
}

static void random_walk(void **state)
{
    (void)state;
    srand(14);
    for (int round = 0; round < 30; round++) {
        struct watchdog_config c = {
            .mode = (enum watchdog_mode)(round % 3),
            .timeout_ms = 500 + (uint64_t)(rand() % 3000),
            .initial_ms = round % 2 ? 0 : 4000,
            .warmup = 1 + (unsigned)(rand() % 6),
            .safety = 1 + rand() % 6,
        };
        enum { N = 4 };
        assert_int_equal(watchdog_init(&wd, &c, N), 0);
        struct model m[N];
        memset(m, 0, sizeof(m));
        uint64_t now = 1;
        for (int k = 0; k < 3000; k++) {
            now += (uint64_t)(rand() % 700);
            int i = rand() % N;
            int what = rand() % 10;
            if (what == 0) {
                watchdog_start(&wd, i, now);
                m[i].running = true;
                m[i].start = now;
                m[i].lines = 0;
            } else if (what == 1) {
                watchdog_exit(&wd, i);
                m[i].running = false;
            } else if (m[i].running) {
                watchdog_report(&wd, i, now, what & 1, k);
                if (m[i].lines > 0 && now - m[i].last > m[i].max_gap)
                    m[i].max_gap = now - m[i].last;
                m[i].lines++;
                m[i].lines_total++;
                m[i].last = now;
            }
            uint64_t best = 0;
            int first = -1;
            for (int j = 0; j < N; j++) {
                uint64_t d = model_deadline(&m[j], &c);
                assert_int_equal(watchdog_deadline(&wd, j), d);
                if (d && (best == 0 || d < best))
                    best = d;
                if (d && d <= now && first < 0)
                    first = j;
            }
            assert_int_equal(watchdog_next_deadline(&wd), best);
            assert_int_equal(watchdog_hung(&wd, now), first);
        }
        watchdog_free(&wd);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(off_never_fires),
        cmocka_unit_test(fixed_after_first_line),
        cmocka_unit_test(initial_covers_startup),
        cmocka_unit_test(exit_stops_watching),
        cmocka_unit_test(lowest_rank_and_earliest_deadline),
        cmocka_unit_test(auto_warmup_then_learned),
        cmocka_unit_test(auto_slow_but_steady_is_never_hung),
        cmocka_unit_test(auto_learns_longest_interval_only_grows),
        cmocka_unit_test(auto_floor_and_ceiling),
        cmocka_unit_test(auto_configured_floor),
        cmocka_unit_test(auto_carried_to_next_attempt),
        cmocka_unit_test(auto_warmup_one_and_bad_config),
        cmocka_unit_test(random_walk),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
