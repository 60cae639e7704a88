/* Unit tests for trainer/graph_plan.c: --cuda-graphs' warm-up, capture,
 * replay and invalidation decisions, and the host counters a replay leaves
 * to the host. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "trainer/graph_plan.h"

static const struct trn_graph_key micro = {TRN_GRAPH_MICRO, 64, 224, 224, false, 0x1000};
static const struct trn_graph_key opt = {TRN_GRAPH_OPT, 0, 0, 0, false, 0};
static const struct trn_graph_env env0 = {1, 0x7000, 1 << 20};

/* One uncaptured run of key, clean or not; asserts the plan said RUN. */
static void run_once(struct trn_graph_plan *p, const struct trn_graph_key *k, bool clean)
{
    int slot = 7;
    assert_int_equal(trn_graph_decide(p, k, true, &slot), TRN_GRAPH_RUN);
    assert_int_equal(slot, -1);
    trn_graph_ran(p, k, clean);
}

static void test_warmup_then_capture_then_replay(void **state)
{
    (void)state;
    struct trn_graph_plan p;
    trn_graph_plan_init(&p, TRN_GRAPH_WARMUP);
    assert_int_equal(trn_graph_check_env(&p, &env0), 0);
    run_once(&p, &micro, false); /* the first run builds plans: not clean */
    run_once(&p, &micro, true);
    run_once(&p, &micro, true);
    int slot = -1;
    assert_int_equal(trn_graph_decide(&p, &micro, true, &slot), TRN_GRAPH_CAPTURE);
    assert_true(slot >= 0 && slot < TRN_GRAPH_MAX);
    trn_graph_captured(&p, slot, &env0);
    for (int i = 0; i < 5; i++) {
        int again = -1;
        assert_int_equal(trn_graph_check_env(&p, &env0), 0);
        assert_int_equal(trn_graph_decide(&p, &micro, true, &again), TRN_GRAPH_REPLAY);
        assert_int_equal(again, slot);
        trn_graph_replayed(&p, again);
    }
    assert_int_equal(p.captures, 1);
    assert_int_equal(p.replays, 5);
    assert_int_equal(p.uncaptured, 3);
}

static void test_an_unclean_run_restarts_the_warmup(void **state)
{
    (void)state;
    struct trn_graph_plan p;
    trn_graph_plan_init(&p, 2);
    run_once(&p, &micro, true);
    run_once(&p, &micro, false); /* a scratch buffer grew: start over */
    run_once(&p, &micro, true);
    run_once(&p, &micro, true);
    int slot;
    assert_int_equal(trn_graph_decide(&p, &micro, true, &slot), TRN_GRAPH_CAPTURE);
}

static void test_not_eligible_runs_uncaptured_and_is_no_warmup(void **state)
{
    (void)state;
    struct trn_graph_plan p;
    trn_graph_plan_init(&p, 1);
    struct trn_graph_key short_batch = micro;
    short_batch.n = 17;
    int slot;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(trn_graph_decide(&p, &short_batch, false, &slot), TRN_GRAPH_RUN);
        trn_graph_ran(&p, &short_batch, true); /* ignored: never entered */
    }
    for (int i = 0; i < TRN_GRAPH_MAX; i++)
        assert_false(p.e[i].used);
    /* OPT before the first SGD step (momentum not filled): not eligible */
    assert_int_equal(trn_graph_decide(&p, &opt, false, &slot), TRN_GRAPH_RUN);
    run_once(&p, &opt, true);
    assert_int_equal(trn_graph_decide(&p, &opt, true, &slot), TRN_GRAPH_CAPTURE);
}

static void test_keys_are_separate(void **state)
{
    (void)state;
    struct trn_graph_plan p;
    trn_graph_plan_init(&p, 1);
    struct trn_graph_key acc = micro, other_input = micro, other_shape = micro;
    acc.accumulate = true;
    other_input.input = 0x2000;
    other_shape.h = 112;
    run_once(&p, &micro, true);
    int s1, s2;
    assert_int_equal(trn_graph_decide(&p, &micro, true, &s1), TRN_GRAPH_CAPTURE);
    trn_graph_captured(&p, s1, &env0);
    /* the accumulating variant, another input buffer, another shape: each its own warm-up */
    const struct trn_graph_key *others[] = {&acc, &other_input, &other_shape};
    for (int i = 0; i < 3; i++) {
        run_once(&p, others[i], true);
        assert_int_equal(trn_graph_decide(&p, others[i], true, &s2), TRN_GRAPH_CAPTURE);
        assert_int_not_equal(s2, s1);
        trn_graph_captured(&p, s2, &env0);
    }
    assert_int_equal(trn_graph_decide(&p, &micro, true, &s2), TRN_GRAPH_REPLAY);
    assert_int_equal(s2, s1);
}

static void test_a_changed_env_drops_every_graph(void **state)
{
    (void)state;
    struct trn_graph_plan p;
    trn_graph_plan_init(&p, 1);
    int sm, so;
    run_once(&p, &micro, true);
    assert_int_equal(trn_graph_decide(&p, &micro, true, &sm), TRN_GRAPH_CAPTURE);
    trn_graph_captured(&p, sm, &env0);
    run_once(&p, &opt, true);
    assert_int_equal(trn_graph_decide(&p, &opt, true, &so), TRN_GRAPH_CAPTURE);
    trn_graph_captured(&p, so, &env0);
    struct trn_graph_env moved[3] = {env0, env0, env0};
    moved[0].backend_gen++;
    moved[1].arena = 0x8000;
    moved[2].arena_bytes = 2 << 20;
    for (int i = 0; i < 3; i++) {
        unsigned stale = trn_graph_check_env(&p, &moved[i]);
        /* both at first; then only the MICRO graph, recaptured below */
        assert_int_equal(stale, i == 0 ? (1u << sm) | (1u << so) : 1u << sm);
        assert_int_equal(trn_graph_check_env(&p, &moved[i]), 0); /* nothing held now */
        int s;
        assert_int_equal(trn_graph_decide(&p, &micro, true, &s), TRN_GRAPH_RUN);
        trn_graph_ran(&p, &micro, true);
        assert_int_equal(trn_graph_decide(&p, &micro, true, &s), TRN_GRAPH_CAPTURE);
        assert_int_equal(s, sm);
        trn_graph_captured(&p, s, &moved[i]);
        assert_int_equal(trn_graph_check_env(&p, &moved[i]), 0);
    }
    assert_int_equal(p.invalidations, 3);
    /* the same env again: kept */
    assert_int_equal(trn_graph_check_env(&p, &moved[2]), 0);
}

static void test_full_table_runs_uncaptured(void **state)
{
    (void)state;
    struct trn_graph_plan p;
    trn_graph_plan_init(&p, 1);
    struct trn_graph_key k = micro;
    for (int i = 0; i < TRN_GRAPH_MAX; i++) {
        k.input = 0x1000 + (uint64_t)i;
        run_once(&p, &k, true);
    }
    k.input = 0x9999;
    int s;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(trn_graph_decide(&p, &k, true, &s), TRN_GRAPH_RUN);
        trn_graph_ran(&p, &k, true);
    }
    k.input = 0x1000;
    assert_int_equal(trn_graph_decide(&p, &k, true, &s), TRN_GRAPH_CAPTURE);
}

static void test_host_advance(void **state)
{
    (void)state;
    /* kind, action, step taken -> BN forwards, optimizer steps */
    static const struct {
        enum trn_graph_kind kind;
        enum trn_graph_action action;
        bool taken;
        int bn_forwards, optimizer_steps;
    } cases[] = {
        /* a replayed forward counts once in every BN's num_batches_tracked */
        {TRN_GRAPH_MICRO, TRN_GRAPH_REPLAY, true, 1, 0},
        /* a capture ran the host code (it counted); an uncaptured run counts itself */
        {TRN_GRAPH_MICRO, TRN_GRAPH_CAPTURE, true, 0, 0},
        {TRN_GRAPH_MICRO, TRN_GRAPH_RUN, true, 0, 0},
        /* OPT by a graph: the step counts when it was taken (no inf/NaN) */
        {TRN_GRAPH_OPT, TRN_GRAPH_REPLAY, true, 0, 1},
        {TRN_GRAPH_OPT, TRN_GRAPH_CAPTURE, true, 0, 1},
        {TRN_GRAPH_OPT, TRN_GRAPH_REPLAY, false, 0, 0},
        {TRN_GRAPH_OPT, TRN_GRAPH_CAPTURE, false, 0, 0},
        {TRN_GRAPH_OPT, TRN_GRAPH_RUN, true, 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct trn_graph_host_step s =
            trn_graph_host_advance(cases[i].kind, cases[i].action, cases[i].taken);
        assert_int_equal(s.bn_forwards, cases[i].bn_forwards);
        assert_int_equal(s.optimizer_steps, cases[i].optimizer_steps);
    }
}

static void test_warmup_is_at_least_one(void **state)
{
    (void)state;
    struct trn_graph_plan p;
    trn_graph_plan_init(&p, 0);
    int s;
    assert_int_equal(trn_graph_decide(&p, &micro, true, &s), TRN_GRAPH_RUN);
    trn_graph_ran(&p, &micro, true);
    assert_int_equal(trn_graph_decide(&p, &micro, true, &s), TRN_GRAPH_CAPTURE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warmup_then_capture_then_replay),
        cmocka_unit_test(test_an_unclean_run_restarts_the_warmup),
        cmocka_unit_test(test_not_eligible_runs_uncaptured_and_is_no_warmup),
        cmocka_unit_test(test_keys_are_separate),
        cmocka_unit_test(test_a_changed_env_drops_every_graph),
        cmocka_unit_test(test_full_table_runs_uncaptured),
        cmocka_unit_test(test_host_advance),
        cmocka_unit_test(test_warmup_is_at_least_one),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
