/* Unit tests for trainer/fault.c: --fault parsing and when a fault fires. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <string.h>
#include <sys/time.h>

#include "common/clock.h"
#include "common/errors.h"
#include "trainer/fault.h"

static void test_parse_ok(void **state)
{
    (void)state;
    struct trn_fault f;
    char err[256];
    assert_int_equal(trn_fault_parse("crash@step=5", &f, err, sizeof(err)), 0);
    assert_int_equal(f.kind, TRN_FAULT_CRASH);
    assert_int_equal(f.step, 5);
    assert_int_equal(f.rank, -1);
    assert_false(f.every);

    assert_int_equal(trn_fault_parse("hang@step=0,rank=3", &f, err, sizeof(err)), 0);
    assert_int_equal(f.kind, TRN_FAULT_HANG);
    assert_int_equal(f.step, 0);
    assert_int_equal(f.rank, 3);

    assert_int_equal(trn_fault_parse("slow@step=7,ms=250", &f, err, sizeof(err)), 0);
    assert_int_equal(f.kind, TRN_FAULT_SLOW);
    assert_int_equal(f.ms, 250);
    assert_int_equal(f.rank, -1);

    /* Fields in any order, every anywhere. */
    assert_int_equal(trn_fault_parse("slow@every,ms=1,rank=0,step=9", &f, err, sizeof(err)), 0);
    assert_int_equal(f.step, 9);
    assert_int_equal(f.rank, 0);
    assert_int_equal(f.ms, 1);
    assert_true(f.every);
    assert_string_equal(trn_fault_kind_name(f.kind), "slow");
    assert_int_equal(f.count, 1);

    /* A lasting slowdown. */
    assert_int_equal(trn_fault_parse("slow@step=3,ms=20,rank=1,for=5", &f, err, sizeof(err)), 0);
    assert_int_equal(f.count, 5);
    assert_int_equal(f.ms, 20);
    assert_int_equal(f.rank, 1);
}

static void expect_bad(const char *spec, int code, const char *needle)
{
    struct trn_fault f;
    char err[256] = "";
    int rc = trn_fault_parse(spec, &f, err, sizeof(err));
    if (rc != code || strstr(err, needle) == NULL)
        fail_msg("'%s': rc %d, err '%s' (wanted %d and '%s')", spec, rc, err, code, needle);
    assert_int_equal(f.kind, TRN_FAULT_NONE);
    assert_non_null(strstr(err, "--fault"));
}

static void test_parse_bad(void **state)
{
    (void)state;
    expect_bad("", CDDP_EPARSE, "empty");
    expect_bad("crash", CDDP_EPARSE, "missing '@'");
    expect_bad("explode@step=1", CDDP_EPARSE, "unknown fault kind 'explode'");
    expect_bad("crash@", CDDP_EPARSE, "empty field");
    expect_bad("crash@rank=1", CDDP_EPARSE, "missing step");
    expect_bad("crash@step=-1", CDDP_ERANGE_ARG, "step must be");
    expect_bad("crash@step=x", CDDP_EPARSE, "step must be");
    expect_bad("crash@step=1,step=2", CDDP_EPARSE, "'step' given twice");
    expect_bad("crash@step=1,rank=1,rank=2", CDDP_EPARSE, "'rank' given twice");
    expect_bad("hang@step=1,rank=3-2", CDDP_ERANGE_ARG, "a range R-S with R <= S, not '3-2'");
    expect_bad("hang@step=1,rank=2-", CDDP_EPARSE, "rank must be");
    expect_bad("hang@step=1,rank=-2", CDDP_EPARSE, "rank must be");
    expect_bad("crash@step=1,,every", CDDP_EPARSE, "empty field");
    expect_bad("crash@step=1,every,every", CDDP_EPARSE, "'every' given twice");
    expect_bad("crash@step=1,ms=5", CDDP_EPARSE, "ms= applies to slow only");
    expect_bad("slow@step=1", CDDP_EPARSE, "slow needs ms");
    expect_bad("slow@step=1,ms=0", CDDP_ERANGE_ARG, "ms must be");
    expect_bad("hang@step=1,often", CDDP_EPARSE, "unknown field 'often'");
    expect_bad("hang@step=1,when=2", CDDP_EPARSE, "unknown field 'when'");
    expect_bad("hang@step=1,for=2", CDDP_EPARSE, "for= applies to slow only");
    expect_bad("slow@step=1,ms=1,for=0", CDDP_ERANGE_ARG, "for must be");
    expect_bad("slow@step=1,ms=1,for=x", CDDP_EPARSE, "for must be");
    expect_bad("slow@step=1,ms=1,for=2,for=3", CDDP_EPARSE, "'for' given twice");
    expect_bad("hang@reform", CDDP_EPARSE, "reform applies to crash only");
    expect_bad("crash@reform,step=2", CDDP_EPARSE, "crash@reform takes rank= only");
    expect_bad("crash@reform,every", CDDP_EPARSE, "crash@reform takes rank= only");
    expect_bad("crash@reform,reform", CDDP_EPARSE, "'reform' given twice");
    expect_bad("nocma@step=1,rank=0", CDDP_EPARSE, "nocma takes rank= only");
    expect_bad("nocma@every,rank=0", CDDP_EPARSE, "nocma takes rank= only");
    expect_bad("nocma@reform", CDDP_EPARSE, "reform applies to crash only");
    expect_bad("nocma@ms=3", CDDP_EPARSE, "ms= applies to slow only");
    char longspec[300];
    memset(longspec, 'a', sizeof(longspec) - 1);
    longspec[sizeof(longspec) - 1] = '\0';
    expect_bad(longspec, CDDP_ERANGE_ARG, "too long");
}

static void test_due(void **state)
{
    (void)state;
    struct trn_fault f;
    char err[256];
    assert_int_equal(trn_fault_parse("crash@step=4,rank=1", &f, err, sizeof(err)), 0);
    assert_true(trn_fault_due(&f, 4, 1, 0));
    assert_false(trn_fault_due(&f, 3, 1, 0));
    assert_false(trn_fault_due(&f, 5, 1, 0));
    assert_false(trn_fault_due(&f, 4, 0, 0));
    /* A restarted attempt does not repeat it... */
    assert_false(trn_fault_due(&f, 4, 1, 1));
    assert_false(trn_fault_due(&f, 4, 1, 7));
    /* ...unless ,every. */
    assert_int_equal(trn_fault_parse("crash@step=4,rank=1,every", &f, err, sizeof(err)), 0);
    assert_true(trn_fault_due(&f, 4, 1, 1));
    assert_true(trn_fault_due(&f, 4, 1, 7));
    /* rank=R-S: each of R..S (a node's ranks), no other. */
    assert_int_equal(trn_fault_parse("hang@step=4,rank=2-3", &f, err, sizeof(err)), 0);
    assert_true(f.rank == 2 && f.rank_last == 3);
    for (int r = 0; r < 6; r++)
        assert_int_equal(trn_fault_due(&f, 4, r, 0), r == 2 || r == 3);
    /* No rank: every rank. */
    assert_int_equal(trn_fault_parse("hang@step=2", &f, err, sizeof(err)), 0);
    for (int r = 0; r < 8; r++)
        assert_true(trn_fault_due(&f, 2, r, 0));
    struct trn_fault none = {0};
    assert_false(trn_fault_due(&none, 0, 0, 0));
    /* for=K: each of the K steps from step N, and no other. */
    assert_int_equal(trn_fault_parse("slow@step=10,ms=5,rank=2,for=3", &f, err, sizeof(err)), 0);
    assert_false(trn_fault_due(&f, 9, 2, 0));
    for (long s = 10; s < 13; s++)
        assert_true(trn_fault_due(&f, s, 2, 0));
    assert_false(trn_fault_due(&f, 13, 2, 0));
    assert_false(trn_fault_due(&f, 11, 1, 0));
    assert_false(trn_fault_due(&f, 11, 2, 1));
    /* crash@reform: never at a step (trn_fault_reform fires it). */
    assert_int_equal(trn_fault_parse("crash@reform,rank=2", &f, err, sizeof(err)), 0);
    assert_true(f.at_reform && f.kind == TRN_FAULT_CRASH && f.rank == 2);
    for (long s = 0; s < 4; s++)
        assert_false(trn_fault_due(&f, s, 2, 0));
    trn_fault_reform(&f, 1, 1); /* another rank: returns */
    assert_int_equal(trn_fault_parse("crash@step=1", &f, err, sizeof(err)), 0);
    trn_fault_reform(&f, 0, 1);           /* not crash@reform: returns */
    assert_false(trn_fault_nocma(&f, 0)); /* a crash is not nocma */
    /* nocma@rank=R: never at a step; only rank R's reads are refused. */
    assert_int_equal(trn_fault_parse("nocma@rank=1", &f, err, sizeof(err)), 0);
    assert_true(f.kind == TRN_FAULT_NOCMA && f.rank == 1);
    assert_string_equal(trn_fault_kind_name(f.kind), "nocma");
    for (long s = 0; s < 4; s++)
        assert_false(trn_fault_due(&f, s, 1, 0));
    assert_true(trn_fault_nocma(&f, 1));
    assert_false(trn_fault_nocma(&f, 0));
}

static void on_alarm(int sig)
{
    (void)sig;
}

/* A slow fault sleeps at least its ms and returns, also when a signal cuts
 * the sleep short (the rest is slept). Only lower bounds: a loaded machine
 * may sleep longer, never shorter. */
static void test_fire_slow_sleeps(void **state)
{
    (void)state;
    struct trn_fault f = {.kind = TRN_FAULT_SLOW, .step = 0, .rank = -1, .ms = 40};
    uint64_t t0 = cddp_mono_ns();
    trn_fault_fire(&f, 0, 0);
    assert_true(cddp_mono_ns() - t0 >= 40 * 1000000ull);

    /* A handled signal 10 ms in (no SA_RESTART: nanosleep returns EINTR). */
    struct sigaction sa = {.sa_handler = on_alarm}, old;
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
    struct itimerval it = {.it_value = {.tv_usec = 10000}};
    t0 = cddp_mono_ns();
    assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
    trn_fault_fire(&f, 0, 0);
    assert_true(cddp_mono_ns() - t0 >= 40 * 1000000ull);
    assert_int_equal(sigaction(SIGALRM, &old, NULL), 0);

    struct trn_fault none = {0};
    trn_fault_fire(&none, 0, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_ok),
        cmocka_unit_test(test_parse_bad),
        cmocka_unit_test(test_due),
        cmocka_unit_test(test_fire_slow_sleeps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
