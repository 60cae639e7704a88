/* Unit tests for common/straggler.c: a rank's step-time window, the
 * members' median and who is named a straggler. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "common/straggler.h"

static bool near(double a, double b)
{
    return fabs(a - b) < 1e-9 * (fabs(b) + 1);
}

/* Lines with step_time_s: one sample a line from the second on; the mean
 * is known once 20 steps are covered. */
static void test_window_reported(void **state)
{
    (void)state;
    struct straggler_window w;
    straggler_window_reset(&w);
    double s, c;
    assert_false(straggler_window_mean(&w, STRAGGLER_MIN_STEPS, &s, &c));
    assert_true(s == -1 && c == -1);
    for (int step = 1; step <= 20; step++)
        straggler_window_line(&w, (uint64_t)step * 1000, true, step, 0.1, 0.08);
    assert_false(straggler_window_mean(&w, STRAGGLER_MIN_STEPS, &s, &c)); /* 19 steps */
    straggler_window_line(&w, 21000, true, 21, 0.1, 0.08);
    assert_true(straggler_window_mean(&w, STRAGGLER_MIN_STEPS, &s, &c));
    assert_true(near(s, 0.1) && near(c, 0.08));
    /* The line's own step time wins over when it arrived (1 s apart). */
    assert_false(near(s, 1.0));
}

/* Lines without step_time_s: measured by when they arrive. */
static void test_window_derived(void **state)
{
    (void)state;
    struct straggler_window w;
    straggler_window_reset(&w);
    for (int step = 0; step <= 20; step++)
        straggler_window_line(&w, 5000 + (uint64_t)step * 250, true, step, -1, -1);
    double s, c;
    assert_true(straggler_window_mean(&w, STRAGGLER_MIN_STEPS, &s, &c));
    assert_true(near(s, 0.25));
    assert_true(c == -1);
    /* A line that repeats the step (a loss report) adds nothing and does
     * not move the interval's start. */
    straggler_window_line(&w, 10100, true, 20, -1, -1);
    straggler_window_line(&w, 10250, true, 21, -1, -1);
    assert_true(straggler_window_mean(&w, STRAGGLER_MIN_STEPS, &s, &c));
    assert_true(near(s, 0.25));
    /* Lines without a step are not samples. */
    straggler_window_line(&w, 99999, false, 0, 5.0, 5.0);
    assert_true(straggler_window_mean(&w, STRAGGLER_MIN_STEPS, &s, &c));
    assert_true(near(s, 0.25));
}

/* A line every 10 steps covers 10 steps; the mean is over the newest
 * samples that reach 20 steps, not over all the window keeps. */
static void test_window_coarse_and_newest(void **state)
{
    (void)state;
    struct straggler_window w;
    straggler_window_reset(&w);
    straggler_window_line(&w, 0, true, 0, -1, -1);
    straggler_window_line(&w, 1000, true, 10, 0.1, -1);
    double s, c;
    assert_false(straggler_window_mean(&w, STRAGGLER_MIN_STEPS, &s, &c));
    straggler_window_line(&w, 2000, true, 20, 0.1, -1);
    assert_true(straggler_window_mean(&w, STRAGGLER_MIN_STEPS, &s, &c));
    assert_true(near(s, 0.1));
    /* Slower now: the newest 20 steps are the slow ones. */
    straggler_window_line(&w, 3000, true, 30, 0.4, -1);
    straggler_window_line(&w, 4000, true, 40, 0.4, -1);
    assert_true(straggler_window_mean(&w, STRAGGLER_MIN_STEPS, &s, &c));
    assert_true(near(s, 0.4));
    /* Half of each: the mean of the 20 steps. */
    straggler_window_line(&w, 5000, true, 50, 0.1, -1);
    assert_true(straggler_window_mean(&w, STRAGGLER_MIN_STEPS, &s, &c));
    assert_true(near(s, 0.25));
    /* More samples than the ring holds: the oldest go. */
    for (int k = 0; k < 3 * STRAGGLER_WINDOW; k++)
        straggler_window_line(&w, 6000 + (uint64_t)k, true, 51 + k, 0.02, 0.01);
    assert_int_equal(w.n, STRAGGLER_WINDOW);
    assert_true(straggler_window_mean(&w, STRAGGLER_MIN_STEPS, &s, &c));
    assert_true(near(s, 0.02) && near(c, 0.01));
    /* A compute time missing from one sample in the window: no mean of it. */
    straggler_window_line(&w, 9000, true, 51 + 3 * STRAGGLER_WINDOW, 0.02, -1);
    assert_true(straggler_window_mean(&w, STRAGGLER_MIN_STEPS, &s, &c));
    assert_true(c == -1);
}

/* A step that goes back (the script's own count after the hook's) starts
 * the window again. */
static void test_window_step_back(void **state)
{
    (void)state;
    struct straggler_window w;
    straggler_window_reset(&w);
    for (int step = 0; step <= 30; step++)
        straggler_window_line(&w, (uint64_t)step * 10, true, step, 0.5, -1);
    double s, c;
    assert_true(straggler_window_mean(&w, STRAGGLER_MIN_STEPS, &s, &c));
    straggler_window_line(&w, 400, true, 3, 0.1, -1);
    assert_false(straggler_window_mean(&w, STRAGGLER_MIN_STEPS, &s, &c));
    assert_int_equal(w.n, 0);
    assert_int_equal(w.last_step, 3);
    for (int step = 4; step <= 23; step++)
        straggler_window_line(&w, 400 + (uint64_t)step, true, step, 0.1, -1);
    assert_true(straggler_window_mean(&w, STRAGGLER_MIN_STEPS, &s, &c));
    assert_true(near(s, 0.1));
}

static void values(struct straggler_member *m, const double *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        m[i].value = v[i];
}

static void test_median(void **state)
{
    (void)state;
    struct straggler_member m[6];
    double scratch[6];
    memset(m, 0, sizeof(m));
    assert_true(straggler_median(m, 6, scratch) == 0);
    values(m, (double[]){0.1, 0, -1, NAN, 0, 0}, 6);
    assert_true(straggler_median(m, 6, scratch) == 0); /* one measured */
    values(m, (double[]){0.3, 0.1}, 2);
    assert_true(near(straggler_median(m, 2, scratch), 0.1)); /* the lower of two */
    values(m, (double[]){0.3, 0.1, 0.2}, 3);
    assert_true(near(straggler_median(m, 3, scratch), 0.2));
    values(m, (double[]){0.9, 0.1, 0.1, 0.1}, 4);
    assert_true(near(straggler_median(m, 4, scratch), 0.1));
    values(m, (double[]){0.4, 0, 0.2, 0.3, NAN, 0.1}, 6);
    assert_true(near(straggler_median(m, 6, scratch), 0.2)); /* of 0.1 0.2 0.3 0.4 */
    /* Of plain values: one is its own median, none is 0. */
    assert_true(near(straggler_lower_median((double[]){-1, 0.3, 0}, 3, scratch), 0.3));
    assert_true(straggler_lower_median((double[]){-1, 0, NAN}, 3, scratch) == 0);
    assert_true(near(straggler_lower_median((double[]){0.3, 0.1, 0.2, 0.4}, 4, scratch), 0.2));
    /* The members themselves are not reordered. */
    assert_true(m[0].value == 0.4 && m[5].value == 0.1);
}

static void test_mark(void **state)
{
    (void)state;
    struct straggler_member m[4];
    struct straggler_change ch[4];
    double scratch[4];
    memset(m, 0, sizeof(m));
    values(m, (double[]){0.10, 0.11, 0.10, 0.30}, 4);
    double med = straggler_median(m, 4, scratch);
    assert_true(near(med, 0.10));
    size_t n = straggler_mark(m, 4, med, 1.5, 1000, ch);
    assert_int_equal(n, 1);
    assert_int_equal(ch[0].index, 3);
    assert_true(ch[0].slow);
    assert_true(m[3].slow && m[3].since_ms == 1000 && near(m[3].ratio, 3.0));
    assert_false(m[1].slow);
    assert_true(near(m[1].ratio, 1.1));
    /* Still slow: no change, since kept. */
    assert_int_equal(straggler_mark(m, 4, med, 1.5, 2000, ch), 0);
    assert_int_equal(m[3].since_ms, 1000);
    /* Hysteresis: below factor but above 0.9 x factor it stays named... */
    m[3].value = 0.14;
    assert_int_equal(straggler_mark(m, 4, med, 1.5, 3000, ch), 0);
    assert_true(m[3].slow);
    /* ...and below that it is cleared. */
    m[3].value = 0.13;
    n = straggler_mark(m, 4, med, 1.5, 4000, ch);
    assert_int_equal(n, 1);
    assert_false(ch[0].slow);
    assert_false(m[3].slow);
    /* ...and a value just under factor does not name it again. */
    m[3].value = 0.149;
    assert_int_equal(straggler_mark(m, 4, med, 1.5, 5000, ch), 0);
    /* No longer measured (a restarted rank): cleared. */
    m[3].value = 0.5;
    assert_int_equal(straggler_mark(m, 4, med, 1.5, 6000, ch), 1);
    m[3].value = -1;
    n = straggler_mark(m, 4, med, 1.5, 7000, ch);
    assert_int_equal(n, 1);
    assert_false(ch[0].slow);
    assert_true(m[3].ratio == 0);
    /* No median (fewer than two measured): every one cleared. */
    m[0].value = 0.5;
    assert_int_equal(straggler_mark(m, 4, med, 1.5, 8000, ch), 1);
    assert_int_equal(straggler_mark(m, 4, 0, 1.5, 9000, ch), 1);
    assert_false(m[0].slow);
}

/* Two ranks: the slower is named when it is factor times the faster. */
static void test_two_members(void **state)
{
    (void)state;
    struct straggler_member m[2];
    struct straggler_change ch[2];
    double scratch[2];
    memset(m, 0, sizeof(m));
    values(m, (double[]){0.2, 0.31}, 2);
    assert_int_equal(straggler_mark(m, 2, straggler_median(m, 2, scratch), 1.5, 1, ch), 1);
    assert_int_equal(ch[0].index, 1);
    values(m, (double[]){0.2, 0.29}, 2);
    memset(m, 0, sizeof(m));
    values(m, (double[]){0.2, 0.29}, 2);
    assert_int_equal(straggler_mark(m, 2, straggler_median(m, 2, scratch), 1.5, 1, ch), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_reported),
        cmocka_unit_test(test_window_derived),
        cmocka_unit_test(test_window_coarse_and_newest),
        cmocka_unit_test(test_window_step_back),
        cmocka_unit_test(test_median),
        cmocka_unit_test(test_mark),
        cmocka_unit_test(test_two_members),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
