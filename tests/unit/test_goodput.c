/* Unit tests for agent/goodput.c: the job's wall time cut into phases, the
 * steps redone after a restart, the summary line. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "agent/goodput.h"

static bool near(double a, double b)
{
    return fabs(a - b) < 1e-9 * (fabs(b) + 1);
}

static void assert_sums(const struct goodput *g, uint64_t now)
{
    struct goodput_totals t;
    goodput_totals(g, now, &t);
    double sum = 0;
    for (int i = 0; i < GOODPUT_PHASE_COUNT; i++)
        sum += t.s[i];
    assert_true(near(sum, t.wall_s));
    assert_true(near(t.wall_s, (double)(now - g->start_ms) / 1000.0));
}

/* A run without failures: rendezvous, init until the first step, then
 * productive until the group is done, then stopped. */
static void test_clean_run(void **state)
{
    (void)state;
    struct goodput g;
    goodput_init(&g, 1000);
    goodput_mode(&g, GOODPUT_MODE_RENDEZVOUS, 1500);
    goodput_mode(&g, GOODPUT_MODE_RUNNING, 2500);
    for (int s = 1; s <= 10; s++)
        goodput_step(&g, s, 4000 + (uint64_t)s * 100);
    goodput_mode(&g, GOODPUT_MODE_STOPPED, 6000);
    struct goodput_totals t;
    goodput_totals(&g, 6500, &t);
    assert_true(near(t.s[GOODPUT_INIT], 0.5 + 1.6));
    assert_true(near(t.s[GOODPUT_RENDEZVOUS], 1.0));
    assert_true(near(t.s[GOODPUT_PRODUCTIVE], 1.9));
    assert_true(near(t.s[GOODPUT_STOPPED], 0.5));
    assert_true(near(t.s[GOODPUT_LOST], 0) && near(t.s[GOODPUT_RESTART], 0));
    assert_true(near(t.wall_s, 5.5));
    assert_true(near(t.ratio, 1.9 / 5.5));
    assert_int_equal(t.lost_steps, 0);
    assert_int_equal(t.phase, GOODPUT_STOPPED);
    assert_sums(&g, 6500);
}

/* One crash at step 7 (steps 1..7 reported 1 s apart), a checkpoint at
 * step 4: the next attempt's first step is 5, so steps 5..7 were redone,
 * and the time after step 4 was reported until the stop is lost. */
static void test_crash_and_resume(void **state)
{
    (void)state;
    struct goodput g;
    goodput_init(&g, 0);
    goodput_mode(&g, GOODPUT_MODE_RENDEZVOUS, 0);
    goodput_mode(&g, GOODPUT_MODE_RUNNING, 1000);
    for (int s = 1; s <= 7; s++)
        goodput_step(&g, s, 2000 + (uint64_t)(s - 1) * 1000); /* step 7 at 8000 */
    goodput_mode(&g, GOODPUT_MODE_RESTARTING, 8500);
    goodput_mode(&g, GOODPUT_MODE_RENDEZVOUS, 9000);
    goodput_mode(&g, GOODPUT_MODE_RUNNING, 9200);
    struct goodput_totals t;
    goodput_totals(&g, 9500, &t);
    assert_int_equal(t.phase, GOODPUT_RESTART);
    goodput_step(&g, 5, 10000);
    goodput_step(&g, 5, 10010); /* another rank, the same step */
    for (int s = 6; s <= 10; s++)
        goodput_step(&g, s, 10000 + (uint64_t)(s - 5) * 1000);
    goodput_mode(&g, GOODPUT_MODE_STOPPED, 15000);
    goodput_totals(&g, 15000, &t);
    assert_int_equal(t.lost_steps, 3);
    /* step 4 was reported at 5000; the attempt ran until 8500 */
    assert_true(near(t.s[GOODPUT_LOST], 3.5));
    assert_true(near(t.s[GOODPUT_PRODUCTIVE], 3.0 + 5.0));
    assert_true(near(t.s[GOODPUT_RESTART], 0.5 + 0.8));
    assert_true(near(t.s[GOODPUT_RENDEZVOUS], 1.0 + 0.2));
    assert_true(near(t.s[GOODPUT_INIT], 1.0));
    assert_sums(&g, 15000);
    char line[256];
    goodput_summary(&t, line, sizeof(line));
    assert_string_equal(line, "goodput 53.3% of 15 s: 8.0 s productive, 1.0 s init, 1.3 s "
                              "restarting, 3.5 s redoing 3 steps, 1.2 s rendezvous");
}

/* Steps reported every 10 (a stride): the next attempt's first report, 30,
 * means it resumed from 20. A step seen while the group stopped counts. */
static void test_stride_and_steps_while_stopping(void **state)
{
    (void)state;
    struct goodput g;
    goodput_init(&g, 0);
    goodput_mode(&g, GOODPUT_MODE_RUNNING, 0);
    for (int s = 10; s <= 40; s += 10)
        goodput_step(&g, s, (uint64_t)s * 100); /* 40 at 4000 */
    goodput_mode(&g, GOODPUT_MODE_RESTARTING, 4500);
    goodput_step(&g, 50, 4600);
    goodput_mode(&g, GOODPUT_MODE_RUNNING, 5000);
    goodput_step(&g, 30, 6000);
    struct goodput_totals t;
    goodput_totals(&g, 6000, &t);
    assert_int_equal(t.lost_steps, 30); /* 21..50 */
    /* step 20 at 2000 -> 4500 */
    assert_true(near(t.s[GOODPUT_LOST], 2.5));
    assert_true(near(t.s[GOODPUT_PRODUCTIVE], 1.0));
    assert_true(near(t.s[GOODPUT_RESTART], 0.5 + 1.0));
    assert_sums(&g, 6000);
}

/* Resumed from before the failed attempt began (it was itself a redo):
 * only its own steps count again, and all its stepping time is lost. An
 * attempt that reported nothing in between changes none of that. */
static void test_resume_before_attempt(void **state)
{
    (void)state;
    struct goodput g;
    goodput_init(&g, 0);
    goodput_mode(&g, GOODPUT_MODE_RUNNING, 0);
    for (int s = 1; s <= 8; s++)
        goodput_step(&g, s, (uint64_t)s * 1000);
    goodput_mode(&g, GOODPUT_MODE_RESTARTING, 8000);
    goodput_mode(&g, GOODPUT_MODE_RUNNING, 9000);
    goodput_step(&g, 5, 10000); /* resumed from 4: 5..8 lost */
    goodput_step(&g, 6, 11000);
    goodput_mode(&g, GOODPUT_MODE_RESTARTING, 11500);
    goodput_mode(&g, GOODPUT_MODE_RUNNING, 12000); /* dies before a step */
    goodput_mode(&g, GOODPUT_MODE_RESTARTING, 13000);
    goodput_mode(&g, GOODPUT_MODE_RUNNING, 14000);
    goodput_step(&g, 3, 15000); /* resumed from 2: 5, 6 lost again */
    struct goodput_totals t;
    goodput_totals(&g, 15000, &t);
    assert_int_equal(t.lost_steps, 4 + 2);
    /* first attempt: 4000 -> 8000; second: 10000 -> 11500 */
    assert_true(near(t.s[GOODPUT_LOST], 4.0 + 1.5));
    assert_true(near(t.s[GOODPUT_PRODUCTIVE], 3.0));
    assert_true(near(t.s[GOODPUT_INIT], 1.0));
    assert_true(near(t.s[GOODPUT_RESTART], 1.0 + 1.0 + 0.5 + 1.0 + 1.0 + 1.0));
    assert_sums(&g, 15000);
}

/* A long attempt: the history is thinned, interpolation stays exact for
 * evenly spaced steps; no steps at all leaves everything in init. */
static void test_long_attempt_and_no_steps(void **state)
{
    (void)state;
    struct goodput g;
    goodput_init(&g, 0);
    goodput_mode(&g, GOODPUT_MODE_RUNNING, 0);
    for (int s = 1; s <= 10000; s++)
        goodput_step(&g, s, (uint64_t)s * 10);
    assert_true(g.nhist <= GOODPUT_HISTORY);
    goodput_mode(&g, GOODPUT_MODE_RESTARTING, 100000);
    goodput_mode(&g, GOODPUT_MODE_RUNNING, 100000);
    goodput_step(&g, 7001, 101000);
    struct goodput_totals t;
    goodput_totals(&g, 101000, &t);
    assert_int_equal(t.lost_steps, 3000);
    assert_true(fabs(t.s[GOODPUT_LOST] - 30.0) < 0.5);
    assert_sums(&g, 101000);

    goodput_init(&g, 0);
    goodput_step(&g, 1, 50); /* INIT: ignored */
    goodput_mode(&g, GOODPUT_MODE_RUNNING, 100);
    goodput_mode(&g, GOODPUT_MODE_STOPPED, 5000);
    goodput_totals(&g, 5000, &t);
    assert_true(near(t.s[GOODPUT_INIT], 5.0));
    assert_true(near(t.ratio, 0));
    assert_sums(&g, 5000);
}

static void test_summary_format(void **state)
{
    (void)state;
    struct goodput_totals t;
    memset(&t, 0, sizeof(t));
    t.s[GOODPUT_PRODUCTIVE] = 1212.2;
    t.s[GOODPUT_RESTART] = 19;
    t.s[GOODPUT_LOST] = 26;
    t.s[GOODPUT_RENDEZVOUS] = 3;
    t.wall_s = 1260.2;
    t.ratio = 1212.2 / 1260.2;
    t.lost_steps = 40;
    char line[256];
    int n = goodput_summary(&t, line, sizeof(line));
    assert_string_equal(line, "goodput 96.2% of 1,260 s: 1,212 s productive, 19 s restarting, "
                              "26 s redoing 40 steps, 3.0 s rendezvous");
    assert_int_equal(n, (int)strlen(line));
    char small[16];
    assert_int_equal(goodput_summary(&t, small, sizeof(small)), n);
    assert_int_equal(strlen(small), sizeof(small) - 1);
    for (int p = 0; p < GOODPUT_PHASE_COUNT; p++)
        assert_string_not_equal(goodput_phase_name((enum goodput_phase)p), "unknown");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean_run),
        cmocka_unit_test(test_crash_and_resume),
        cmocka_unit_test(test_stride_and_steps_while_stopping),
        cmocka_unit_test(test_resume_before_attempt),
        cmocka_unit_test(test_long_attempt_and_no_steps),
        cmocka_unit_test(test_summary_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
