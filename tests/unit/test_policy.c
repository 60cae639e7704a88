/*
 * Unit tests for agent/policy.c: every state with every event, the restart
 * budget, the stop sequence (SIGTERM, deadline, SIGKILL, empty groups),
 * signals (forwarded, second one kills, exit 128+N), success with processes
 * left behind, membership restarts and a closed rendezvous; then a long
 * random walk that checks the invariants after every step.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <string.h>

#include "agent/policy.h"
#include "common/exitcodes.h"

#define TIMEOUT 30000

static struct policy_action acts[POLICY_MAX_ACTIONS];
static int nacts;

static int step(struct agent_policy *p, enum policy_event_type type, int rank, int code,
                uint64_t now)
{
    struct policy_event ev = {.type = type, .local_rank = rank, .exitcode = code};
    if (type == POLICY_EV_SIGNAL)
        ev.sig = code;
    memset(acts, 0xab, sizeof(acts));
    nacts = policy_step(p, &ev, now, acts);
    assert_true(nacts >= 0 && nacts <= POLICY_MAX_ACTIONS);
    return nacts;
}

/* A worker exit whose group has nothing else in it. */
static int exit_clean(struct agent_policy *p, int rank, int code, uint64_t now)
{
    struct policy_event ev = {
        .type = POLICY_EV_WORKER_EXIT, .local_rank = rank, .exitcode = code, .group_empty = true};
    nacts = policy_step(p, &ev, now, acts);
    return nacts;
}

static const struct policy_action *find(enum policy_action_type t)
{
    for (int i = 0; i < nacts; i++) {
        if (acts[i].type == t)
            return &acts[i];
    }
    return NULL;
}

static void expect(const enum policy_action_type *types, int n)
{
    if (nacts != n)
        fail_msg("expected %d actions, got %d", n, nacts);
    for (int i = 0; i < n; i++) {
        if (acts[i].type != types[i])
            fail_msg("action %d: expected type %d, got %d", i, types[i], acts[i].type);
    }
}
#define EXPECT(...)                                                                                \
    do {                                                                                           \
        const enum policy_action_type t_[] = {__VA_ARGS__};                                        \
        expect(t_, (int)(sizeof(t_) / sizeof(t_[0])));                                             \
    } while (0)
#define EXPECT_NONE() assert_int_equal(nacts, 0)

/* A policy with n workers, running (START, ROUND done). */
static void running(struct agent_policy *p, int n, int max_restarts)
{
    assert_int_equal(policy_init(p, n, max_restarts, TIMEOUT), 0);
    step(p, POLICY_EV_START, 0, 0, 0);
    EXPECT(POLICY_ACT_JOIN);
    assert_int_equal(acts[0].reason, STOP_NONE);
    assert_int_equal(p->state, AGENT_RENDEZVOUS);
    step(p, POLICY_EV_ROUND, 0, 0, 0);
    EXPECT(POLICY_ACT_START_WORKERS);
    assert_int_equal(p->state, AGENT_RUNNING);
    for (int i = 0; i < n; i++) {
        assert_int_equal(p->workers[i].state, WORKER_RUNNING);
        assert_true(p->workers[i].group_alive);
    }
}

/* A hung worker (the watchdog) fails the group as an exit would: the same
 * stop and restart budget; it counts as failed, the others as stopped. */
static void test_watchdog_fails_group(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 2, 1);
    step(&p, POLICY_EV_WATCHDOG, 1, 0, 100);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    assert_int_equal(acts[1].sig, SIGTERM);
    assert_int_equal(acts[1].reason, STOP_FAILURE);
    assert_int_equal(p.state, AGENT_STOPPING);
    assert_true(p.workers[1].hung);
    /* a second verdict while stopping is stale */
    step(&p, POLICY_EV_WATCHDOG, 0, 0, 101);
    EXPECT_NONE();
    exit_clean(&p, 0, -SIGTERM, 110);
    EXPECT_NONE();
    assert_int_equal(p.workers[0].state, WORKER_STOPPED);
    exit_clean(&p, 1, -SIGTERM, 120);
    assert_int_equal(p.workers[1].state, WORKER_FAILED);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_JOIN);
    assert_int_equal(acts[1].reason, STOP_FAILURE);
    assert_int_equal(policy_restart_count(&p), 1);
    step(&p, POLICY_EV_ROUND, 0, 0, 130);
    EXPECT(POLICY_ACT_START_WORKERS);
    assert_false(p.workers[1].hung);
    /* out of restarts: the failure table, exit 3: hung (even if it exits 0 on SIGTERM) */
    step(&p, POLICY_EV_WATCHDOG, 0, 0, 200);
    exit_clean(&p, 1, -SIGTERM, 210);
    exit_clean(&p, 0, 0, 220);
    assert_int_equal(p.workers[0].state, WORKER_FAILED);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_FAILURE_REPORT, POLICY_ACT_EXIT);
    assert_int_equal(acts[2].exit_code, CDDP_EXIT_HUNG);
    /* stale outside RUNNING, and for ranks out of range */
    step(&p, POLICY_EV_WATCHDOG, 0, 0, 300);
    EXPECT_NONE();
    policy_free(&p);
    running(&p, 1, 0);
    step(&p, POLICY_EV_WATCHDOG, 5, 0, 1);
    EXPECT_NONE();
    step(&p, POLICY_EV_WATCHDOG, -1, 0, 1);
    EXPECT_NONE();
    policy_free(&p);
}

static void progress(struct agent_policy *p, int64_t s)
{
    struct policy_event ev = {.type = POLICY_EV_PROGRESS, .step = s};
    nacts = policy_step(p, &ev, 0, acts);
    assert_int_equal(nacts, 0);
}

/* One failed attempt of one worker that restarts: returns after the JOIN
 * and the next ROUND, or with the EXIT when the run ended. */
static void fail_attempt(struct agent_policy *p, uint64_t now)
{
    exit_clean(p, 0, 1, now);
    if (p->state == AGENT_RENDEZVOUS) {
        step(p, POLICY_EV_ROUND, 0, 0, now + 1);
        EXPECT(POLICY_ACT_START_WORKERS);
    }
}

/* --max_no_progress_restarts: N restarts in a row that fail before a step
 * beyond the best seen before them end the run; progress resets the count;
 * the first attempt never counts; off (0) changes nothing. */
static void test_no_progress_stop(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 1, 10);
    p.max_no_progress = 2;
    progress(&p, 0);
    progress(&p, 100);
    fail_attempt(&p, 10); /* attempt 0: not a restart */
    assert_int_equal(p.no_progress_streak, 0);
    progress(&p, 90);
    progress(&p, 100); /* not beyond 100 */
    fail_attempt(&p, 20);
    assert_int_equal(p.no_progress_streak, 1);
    progress(&p, 101); /* progress: the count starts again */
    fail_attempt(&p, 30);
    assert_int_equal(p.no_progress_streak, 0);
    fail_attempt(&p, 40);
    assert_int_equal(p.no_progress_streak, 1);
    assert_int_equal(p.state, AGENT_RUNNING);
    exit_clean(&p, 0, 1, 50);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_FAILURE_REPORT, POLICY_ACT_EXIT);
    assert_int_equal(acts[2].exit_code, CDDP_EXIT_NO_PROGRESS);
    assert_true(acts[2].end_job);
    assert_true(p.no_progress_stop);
    assert_int_equal(p.state, AGENT_FAILED);
    assert_int_equal(policy_restart_count(&p), 4);
    policy_free(&p);

    /* off: the budget alone decides */
    running(&p, 1, 3);
    for (int k = 0; k < 3; k++)
        fail_attempt(&p, 10 + (uint64_t)k * 10);
    exit_clean(&p, 0, 1, 100);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_FAILURE_REPORT, POLICY_ACT_EXIT);
    assert_false(p.no_progress_stop);
    policy_free(&p);

    /* no steps at all: no progress; a membership round is a restart too */
    running(&p, 1, 5);
    p.max_no_progress = 1;
    step(&p, POLICY_EV_RDZV_RESTART, 0, 0, 5);
    exit_clean(&p, 0, -SIGTERM, 6);
    step(&p, POLICY_EV_ROUND, 0, 0, 7);
    EXPECT(POLICY_ACT_START_WORKERS);
    exit_clean(&p, 0, 1, 8);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_FAILURE_REPORT, POLICY_ACT_EXIT);
    assert_true(p.no_progress_stop);
    assert_int_equal(policy_restart_count(&p), 0);
    policy_free(&p);
}

/* policy_will_restart while the group stops: a failure with restarts left
 * restarts, the last one and the no-progress restart too many do not (the
 * answer /status's "restarting" and the goodput's restart phase share). */
static void test_will_restart(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 2, 1);
    assert_false(policy_will_restart(&p)); /* running */
    exit_clean(&p, 0, 1, 10);
    assert_int_equal(p.state, AGENT_STOPPING);
    assert_true(policy_will_restart(&p));
    exit_clean(&p, 1, -SIGTERM, 11);
    assert_int_equal(p.state, AGENT_RENDEZVOUS);
    step(&p, POLICY_EV_ROUND, 0, 0, 12);
    exit_clean(&p, 1, 1, 20); /* the budget is spent */
    assert_int_equal(p.state, AGENT_STOPPING);
    assert_false(policy_will_restart(&p));
    exit_clean(&p, 0, -SIGTERM, 21);
    assert_int_equal(p.state, AGENT_FAILED);
    policy_free(&p);

    /* restarts left, but the restart too many of --max_no_progress_restarts */
    running(&p, 2, 5);
    p.max_no_progress = 1;
    step(&p, POLICY_EV_RDZV_RESTART, 0, 0, 5);
    assert_true(policy_will_restart(&p)); /* a new round: always */
    exit_clean(&p, 0, -SIGTERM, 6);
    exit_clean(&p, 1, -SIGTERM, 6);
    step(&p, POLICY_EV_ROUND, 0, 0, 7);
    EXPECT(POLICY_ACT_START_WORKERS);
    exit_clean(&p, 0, 1, 8); /* no step in this attempt */
    assert_int_equal(p.state, AGENT_STOPPING);
    assert_false(policy_will_restart(&p));
    exit_clean(&p, 1, -SIGTERM, 9);
    assert_int_equal(p.state, AGENT_FAILED);
    assert_true(p.no_progress_stop);
    policy_free(&p);
}

static void test_start_and_round(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 4, 0);
    /* a second START or ROUND is stale */
    step(&p, POLICY_EV_START, 0, 0, 1);
    EXPECT_NONE();
    step(&p, POLICY_EV_ROUND, 0, 0, 1);
    EXPECT_NONE();
    assert_int_equal(policy_restart_count(&p), 0);
    policy_free(&p);
}

static void test_success_clean(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 3, 2);
    exit_clean(&p, 1, 0, 10);
    EXPECT_NONE(); /* an early success is simply awaited */
    assert_int_equal(p.workers[1].state, WORKER_SUCCEEDED);
    exit_clean(&p, 0, 0, 11);
    EXPECT_NONE();
    exit_clean(&p, 2, 0, 12);
    EXPECT(POLICY_ACT_EXIT_BARRIER);
    assert_int_equal(p.state, AGENT_EXIT_BARRIER);
    step(&p, POLICY_EV_BARRIER_DONE, 0, 0, 13);
    EXPECT(POLICY_ACT_EXIT);
    assert_int_equal(acts[0].exit_code, CDDP_EXIT_OK);
    assert_int_equal(p.state, AGENT_SUCCEEDED);
    assert_true(policy_finished(&p));
    policy_free(&p);
}

static void test_success_leaves_processes(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 2, 0);
    exit_clean(&p, 0, 0, 10);
    EXPECT_NONE();
    /* rank 1 exits 0 but left a child in its group: stop it first */
    step(&p, POLICY_EV_WORKER_EXIT, 1, 0, 20);
    EXPECT(POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    assert_int_equal(acts[0].sig, SIGTERM);
    assert_int_equal(acts[0].reason, STOP_SUCCESS);
    assert_int_equal(acts[1].deadline_ms, 20 + TIMEOUT);
    assert_int_equal(p.state, AGENT_STOPPING);
    step(&p, POLICY_EV_GROUP_EMPTY, 1, 0, 30);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_EXIT_BARRIER);
    step(&p, POLICY_EV_BARRIER_DONE, 0, 0, 31);
    EXPECT(POLICY_ACT_EXIT);
    assert_int_equal(p.exit_code, 0);
    policy_free(&p);
}

static void test_failure_restarts_then_fails(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 3, 2);
    for (int attempt = 0; attempt < 3; attempt++) {
        uint64_t t = 1000u * (uint64_t)(attempt + 1);
        assert_int_equal(policy_restart_count(&p), attempt);
        exit_clean(&p, 1, 3, t);
        EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
        assert_int_equal(acts[1].sig, SIGTERM);
        assert_int_equal(acts[1].reason, STOP_FAILURE);
        assert_int_equal(acts[2].deadline_ms, t + TIMEOUT);
        assert_int_equal(p.state, AGENT_STOPPING);
        assert_int_equal(p.workers[1].state, WORKER_FAILED);
        /* peers die of the SIGTERM: STOPPED, not FAILED */
        exit_clean(&p, 0, -SIGTERM, t + 1);
        EXPECT_NONE();
        assert_int_equal(p.workers[0].state, WORKER_STOPPED);
        assert_int_equal(p.workers[0].exitcode, -SIGTERM);
        step(&p, POLICY_EV_WORKER_EXIT, 2, 0, t + 2); /* exited 0 on SIGTERM; group busy */
        EXPECT_NONE();
        assert_int_equal(p.workers[2].state, WORKER_SUCCEEDED);
        step(&p, POLICY_EV_GROUP_EMPTY, 2, 0, t + 3);
        if (attempt < 2) {
            EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_JOIN);
            assert_int_equal(acts[1].reason, STOP_FAILURE);
            assert_int_equal(acts[1].attempts_left, 1 - attempt);
            assert_int_equal(p.state, AGENT_RENDEZVOUS);
            assert_int_equal(policy_restart_count(&p), attempt + 1);
            step(&p, POLICY_EV_ROUND, 0, 0, t + 4);
            EXPECT(POLICY_ACT_START_WORKERS);
            for (int i = 0; i < 3; i++)
                assert_int_equal(p.workers[i].state, WORKER_RUNNING);
        } else {
            EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_FAILURE_REPORT, POLICY_ACT_EXIT);
            assert_int_equal(acts[2].exit_code, CDDP_EXIT_FAILURE);
            assert_int_equal(p.state, AGENT_FAILED);
            assert_int_equal(policy_restart_count(&p), 2);
        }
    }
    policy_free(&p);
}

static void test_no_restarts(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 1, 0);
    exit_clean(&p, 0, -SIGKILL, 5);
    /* the only worker is gone with its group: report at once */
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_FAILURE_REPORT, POLICY_ACT_EXIT);
    assert_int_equal(p.exit_code, CDDP_EXIT_FAILURE);
    policy_free(&p);
}

static void test_deadline_then_kill(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 2, 1);
    exit_clean(&p, 0, 1, 100);
    assert_int_equal(p.deadline_ms, 100 + TIMEOUT);
    /* an early or repeated timer is ignored */
    step(&p, POLICY_EV_DEADLINE, 0, 0, 100 + TIMEOUT - 1);
    EXPECT_NONE();
    step(&p, POLICY_EV_DEADLINE, 0, 0, 100 + TIMEOUT);
    EXPECT(POLICY_ACT_SIGNAL_GROUPS);
    assert_int_equal(acts[0].sig, SIGKILL);
    assert_int_equal(p.state, AGENT_KILLING);
    step(&p, POLICY_EV_DEADLINE, 0, 0, 100 + TIMEOUT + 5);
    EXPECT_NONE();
    exit_clean(&p, 1, -SIGKILL, 100 + TIMEOUT + 6);
    EXPECT(POLICY_ACT_JOIN); /* no deadline left to clear */
    assert_int_equal(policy_restart_count(&p), 1);
    policy_free(&p);
}

static void test_zero_shutdown_timeout(void **state)
{
    (void)state;
    struct agent_policy p;
    assert_int_equal(policy_init(&p, 2, 0, 0), 0);
    step(&p, POLICY_EV_START, 0, 0, 0);
    step(&p, POLICY_EV_ROUND, 0, 0, 0);
    exit_clean(&p, 0, 2, 0);
    const struct policy_action *d = find(POLICY_ACT_SET_DEADLINE);
    assert_non_null(d);
    assert_true(d->deadline_ms > 0); /* a real deadline, due now */
    step(&p, POLICY_EV_DEADLINE, 0, 0, d->deadline_ms);
    EXPECT(POLICY_ACT_SIGNAL_GROUPS);
    assert_int_equal(acts[0].sig, SIGKILL);
    policy_free(&p);
}

static void test_signal_forwarded(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 2, 3);
    step(&p, POLICY_EV_SIGNAL, 0, SIGINT, 50);
    EXPECT(POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    assert_int_equal(acts[0].sig, SIGINT); /* the same signal */
    assert_int_equal(acts[0].reason, STOP_SIGNAL);
    exit_clean(&p, 0, -SIGINT, 51);
    EXPECT_NONE();
    exit_clean(&p, 1, -SIGINT, 52);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_EXIT);
    assert_int_equal(acts[1].exit_code, 128 + SIGINT);
    assert_int_equal(p.state, AGENT_TERMINATED);
    /* no restart was spent, none will be */
    assert_int_equal(policy_restart_count(&p), 0);
    policy_free(&p);
}

static void test_second_signal_kills(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 2, 0);
    step(&p, POLICY_EV_SIGNAL, 0, SIGTERM, 1);
    step(&p, POLICY_EV_SIGNAL, 0, SIGINT, 2);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_SIGNAL_GROUPS);
    assert_int_equal(acts[1].sig, SIGKILL);
    assert_int_equal(p.state, AGENT_KILLING);
    /* a third changes nothing */
    step(&p, POLICY_EV_SIGNAL, 0, SIGHUP, 3);
    EXPECT_NONE();
    exit_clean(&p, 0, -SIGKILL, 4);
    exit_clean(&p, 1, -SIGKILL, 5);
    EXPECT(POLICY_ACT_EXIT);
    assert_int_equal(acts[0].exit_code, 128 + SIGTERM); /* the first signal decides */
    policy_free(&p);
}

static void test_signal_during_failure_stop(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 2, 5);
    exit_clean(&p, 0, 1, 10);
    step(&p, POLICY_EV_SIGNAL, 0, SIGTERM, 11);
    EXPECT(POLICY_ACT_SIGNAL_GROUPS); /* forwarded; the deadline keeps running */
    assert_int_equal(acts[0].sig, SIGTERM);
    assert_int_equal(p.deadline_ms, 10 + TIMEOUT);
    exit_clean(&p, 1, -SIGTERM, 12);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_EXIT);
    assert_int_equal(acts[1].exit_code, 128 + SIGTERM);
    assert_int_equal(policy_restart_count(&p), 0);
    policy_free(&p);
}

static void test_signal_in_other_states(void **state)
{
    (void)state;
    struct agent_policy p;
    /* before workers exist */
    assert_int_equal(policy_init(&p, 2, 0, TIMEOUT), 0);
    step(&p, POLICY_EV_SIGNAL, 0, SIGHUP, 0);
    EXPECT(POLICY_ACT_EXIT);
    assert_int_equal(acts[0].exit_code, 128 + SIGHUP);
    policy_free(&p);
    assert_int_equal(policy_init(&p, 2, 0, TIMEOUT), 0);
    step(&p, POLICY_EV_START, 0, 0, 0);
    step(&p, POLICY_EV_SIGNAL, 0, SIGQUIT, 0);
    EXPECT(POLICY_ACT_EXIT);
    assert_int_equal(acts[0].exit_code, 128 + SIGQUIT);
    assert_int_equal(p.state, AGENT_TERMINATED);
    policy_free(&p);
    /* at the exit barrier */
    running(&p, 1, 0);
    exit_clean(&p, 0, 0, 1);
    EXPECT(POLICY_ACT_EXIT_BARRIER);
    step(&p, POLICY_EV_SIGNAL, 0, SIGTERM, 2);
    EXPECT(POLICY_ACT_EXIT);
    assert_int_equal(acts[0].exit_code, 128 + SIGTERM);
    policy_free(&p);
}

static void test_membership_restart(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 2, 1);
    step(&p, POLICY_EV_RDZV_RESTART, 0, 0, 5);
    EXPECT(POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    assert_int_equal(acts[0].reason, STOP_MEMBERSHIP);
    exit_clean(&p, 0, -SIGTERM, 6);
    exit_clean(&p, 1, -SIGTERM, 7);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_JOIN);
    assert_int_equal(acts[1].reason, STOP_MEMBERSHIP);
    assert_int_equal(policy_restart_count(&p), 0); /* not counted */
    /* a worker failing because its peers went away does not count either */
    step(&p, POLICY_EV_ROUND, 0, 0, 8);
    step(&p, POLICY_EV_RDZV_RESTART, 0, 0, 9);
    exit_clean(&p, 0, 1, 10);
    EXPECT_NONE();
    assert_int_equal(p.workers[0].state, WORKER_STOPPED);
    exit_clean(&p, 1, 0, 11);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_JOIN);
    assert_int_equal(policy_restart_count(&p), 0);
    /* while waiting for a round, a restart request is moot */
    step(&p, POLICY_EV_RDZV_RESTART, 0, 0, 12);
    EXPECT_NONE();
    policy_free(&p);
}

static void test_rendezvous_closed(void **state)
{
    (void)state;
    struct agent_policy p;
    /* while running: stop, then fail (no table: nobody failed) */
    running(&p, 1, 3);
    step(&p, POLICY_EV_RDZV_CLOSED, 0, 0, 1);
    EXPECT(POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    exit_clean(&p, 0, -SIGTERM, 2);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_EXIT);
    assert_int_equal(acts[1].exit_code, CDDP_EXIT_INFRA);
    policy_free(&p);
    /* during a failure stop: no restart is possible any more */
    running(&p, 2, 3);
    exit_clean(&p, 0, 4, 1);
    step(&p, POLICY_EV_RDZV_CLOSED, 0, 0, 2);
    EXPECT_NONE();
    exit_clean(&p, 1, -SIGTERM, 3);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_FAILURE_REPORT, POLICY_ACT_EXIT);
    policy_free(&p);
    /* while waiting for a round; and a round that cannot form */
    running(&p, 1, 1);
    exit_clean(&p, 0, 1, 1);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_JOIN);
    step(&p, POLICY_EV_RDZV_CLOSED, 0, 0, 2);
    EXPECT(POLICY_ACT_FAILURE_REPORT, POLICY_ACT_EXIT); /* the failure that led here */
    assert_int_equal(acts[1].exit_code, CDDP_EXIT_INFRA);
    assert_int_equal(p.state, AGENT_FAILED);
    assert_false(acts[1].end_job);
    policy_free(&p);
    assert_int_equal(policy_init(&p, 1, 0, TIMEOUT), 0);
    step(&p, POLICY_EV_START, 0, 0, 0);
    step(&p, POLICY_EV_ROUND_FAILED, 0, 0, 1);
    EXPECT(POLICY_ACT_EXIT);
    assert_int_equal(acts[0].exit_code, CDDP_EXIT_INFRA);
    policy_free(&p);
    /* a join refused for the job's own reason (a token, its configuration) */
    assert_int_equal(policy_init(&p, 1, 0, TIMEOUT), 0);
    step(&p, POLICY_EV_START, 0, 0, 0);
    step(&p, POLICY_EV_ROUND_FAILED, 0, 1, 1);
    EXPECT(POLICY_ACT_EXIT);
    assert_int_equal(acts[0].exit_code, CDDP_EXIT_FAILURE);
    policy_free(&p);
    /* at the exit barrier the workers already succeeded */
    running(&p, 1, 0);
    exit_clean(&p, 0, 0, 1);
    step(&p, POLICY_EV_RDZV_CLOSED, 0, 0, 2);
    EXPECT(POLICY_ACT_EXIT);
    assert_int_equal(acts[0].exit_code, CDDP_EXIT_OK);
    policy_free(&p);
}

static void test_stale_events(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 2, 1);
    step(&p, POLICY_EV_WORKER_EXIT, 7, 1, 1);
    EXPECT_NONE();
    step(&p, POLICY_EV_WORKER_EXIT, -1, 1, 1);
    EXPECT_NONE();
    step(&p, POLICY_EV_GROUP_EMPTY, 0, 0, 1); /* its leader runs: impossible, ignored */
    EXPECT_NONE();
    assert_true(p.workers[0].group_alive);
    step(&p, POLICY_EV_GROUP_EMPTY, 9, 0, 1);
    EXPECT_NONE();
    step(&p, POLICY_EV_BARRIER_DONE, 0, 0, 1);
    EXPECT_NONE();
    step(&p, POLICY_EV_ROUND_FAILED, 0, 0, 1);
    EXPECT_NONE();
    step(&p, POLICY_EV_DEADLINE, 0, 0, 1);
    EXPECT_NONE();
    exit_clean(&p, 0, 0, 2);
    exit_clean(&p, 0, 5, 3); /* a second exit of the same worker */
    EXPECT_NONE();
    assert_int_equal(p.workers[0].state, WORKER_SUCCEEDED);
    policy_free(&p);
}

/* ---- coordinated (multi-node) mode ---- */

static int step_round(struct agent_policy *p, int64_t restart_count, uint64_t now)
{
    struct policy_event ev = {.type = POLICY_EV_ROUND, .restart_count = restart_count};
    nacts = policy_step(p, &ev, now, acts);
    return nacts;
}

static void running_coordinated(struct agent_policy *p, int n, int max_restarts)
{
    assert_int_equal(policy_init(p, n, max_restarts, TIMEOUT), 0);
    p->coordinated = true;
    step(p, POLICY_EV_START, 0, 0, 0);
    EXPECT(POLICY_ACT_JOIN);
    step_round(p, 0, 0);
    EXPECT(POLICY_ACT_START_WORKERS);
    assert_int_equal(p->state, AGENT_RUNNING);
}

static void test_coordinated_failure_counted_by_round(void **state)
{
    (void)state;
    struct agent_policy p;
    running_coordinated(&p, 2, 1);
    /* A local failure is reported, and always goes back to the rendezvous. */
    exit_clean(&p, 0, 3, 1);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    exit_clean(&p, 1, -SIGTERM, 2);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_JOIN);
    assert_int_equal(acts[1].reason, STOP_FAILURE);
    assert_int_equal(acts[1].attempts_left, 0);
    assert_int_equal(policy_restart_count(&p), 0); /* not decided here */
    /* The round counts it: restart 1 of 1. */
    step_round(&p, 1, 3);
    EXPECT(POLICY_ACT_START_WORKERS);
    assert_int_equal(policy_restart_count(&p), 1);
    assert_int_equal(p.group_restarts, 1);
    /* Again: no attempt is expected to be left, but the rendezvous decides. */
    exit_clean(&p, 1, 1, 4);
    exit_clean(&p, 0, -SIGTERM, 5);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_JOIN);
    assert_int_equal(acts[1].attempts_left, -1);
    /* Not counted (a lost node had ended the round first): the job goes on. */
    step_round(&p, 1, 6);
    EXPECT(POLICY_ACT_START_WORKERS);
    assert_int_equal(policy_restart_count(&p), 1);
    assert_int_equal(p.group_restarts, 1); /* (nor by scope) */
    exit_clean(&p, 1, 1, 7);
    exit_clean(&p, 0, -SIGTERM, 8);
    /* Counted: past --max_restarts. The table (our workers failed), exit 1,
     * and the job is over for every node. */
    step_round(&p, 2, 9);
    EXPECT(POLICY_ACT_FAILURE_REPORT, POLICY_ACT_EXIT);
    assert_int_equal(acts[1].exit_code, CDDP_EXIT_FAILURE);
    assert_int_equal(acts[1].reason, STOP_FAILURE);
    assert_true(acts[1].end_job);
    assert_int_equal(p.state, AGENT_FAILED);
    assert_int_equal(policy_restart_count(&p), 2);
    policy_free(&p);
}

static void test_coordinated_peer_failure(void **state)
{
    (void)state;
    struct agent_policy p;
    running_coordinated(&p, 2, 1);
    /* Another node's group failed: the rendezvous asks everyone to restart. */
    step(&p, POLICY_EV_RDZV_RESTART, 0, 0, 1);
    EXPECT(POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    assert_int_equal(acts[0].reason, STOP_MEMBERSHIP);
    exit_clean(&p, 0, -SIGTERM, 2);
    exit_clean(&p, 1, 1, 3); /* failing because its peers went away: not a failure */
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_JOIN);
    assert_int_equal(acts[1].reason, STOP_MEMBERSHIP);
    step_round(&p, 1, 4);
    EXPECT(POLICY_ACT_START_WORKERS);
    assert_int_equal(policy_restart_count(&p), 1);
    /* Its workers restarted as a group for the job's failure: by scope a
     * group restart here too, as on the node that failed. */
    assert_int_equal(p.group_restarts, 1);
    step(&p, POLICY_EV_RDZV_RESTART, 0, 0, 5);
    exit_clean(&p, 0, -SIGTERM, 6);
    exit_clean(&p, 1, -SIGTERM, 7);
    /* Past the budget: no table (nothing failed here), still the job's end. */
    step_round(&p, 2, 8);
    EXPECT(POLICY_ACT_EXIT);
    assert_int_equal(acts[0].exit_code, CDDP_EXIT_FAILURE);
    assert_true(acts[0].end_job);
    policy_free(&p);
    /* A huge count cannot wrap. */
    running_coordinated(&p, 1, 3);
    step(&p, POLICY_EV_RDZV_RESTART, 0, 0, 1);
    exit_clean(&p, 0, -SIGTERM, 2);
    step_round(&p, INT64_MAX, 3);
    EXPECT(POLICY_ACT_EXIT);
    assert_true(policy_restart_count(&p) > 3);
    policy_free(&p);
}

static void test_coordinated_restart_at_barrier(void **state)
{
    (void)state;
    struct agent_policy p;
    running_coordinated(&p, 1, 0);
    exit_clean(&p, 0, 0, 1);
    EXPECT(POLICY_ACT_EXIT_BARRIER);
    /* A node was lost before every node reached the barrier: new round. */
    step(&p, POLICY_EV_RDZV_RESTART, 0, 0, 2);
    EXPECT(POLICY_ACT_JOIN);
    assert_int_equal(acts[0].reason, STOP_MEMBERSHIP);
    assert_int_equal(p.state, AGENT_RENDEZVOUS);
    step(&p, POLICY_EV_BARRIER_DONE, 0, 0, 3); /* the old barrier: stale */
    EXPECT_NONE();
    step_round(&p, 0, 4);
    EXPECT(POLICY_ACT_START_WORKERS);
    policy_free(&p);

    /* While stopping what a successful group left behind: rejoin, no barrier. */
    running_coordinated(&p, 2, 0);
    exit_clean(&p, 0, 0, 1);
    step(&p, POLICY_EV_WORKER_EXIT, 1, 0, 2); /* left a process in its group */
    EXPECT(POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    step(&p, POLICY_EV_RDZV_RESTART, 0, 0, 3);
    EXPECT_NONE();
    step(&p, POLICY_EV_GROUP_EMPTY, 1, 0, 4);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_JOIN);
    assert_int_equal(acts[1].reason, STOP_MEMBERSHIP);
    policy_free(&p);

    /* During a failure stop a restart changes nothing: the stop goes on to
     * a join either way. */
    running_coordinated(&p, 2, 2);
    exit_clean(&p, 0, 1, 1);
    step(&p, POLICY_EV_RDZV_RESTART, 0, 0, 2);
    EXPECT_NONE();
    assert_int_equal(p.stop_reason, STOP_FAILURE);
    policy_free(&p);
}

static void test_end_job(void **state)
{
    (void)state;
    struct agent_policy p;
    /* success: the job is over */
    running_coordinated(&p, 1, 0);
    exit_clean(&p, 0, 0, 1);
    step(&p, POLICY_EV_BARRIER_DONE, 0, 0, 2);
    assert_true(find(POLICY_ACT_EXIT)->end_job);
    policy_free(&p);
    /* a signal: this node leaves, the others may go on */
    running_coordinated(&p, 1, 0);
    step(&p, POLICY_EV_SIGNAL, 0, SIGTERM, 1);
    exit_clean(&p, 0, -SIGTERM, 2);
    assert_false(find(POLICY_ACT_EXIT)->end_job);
    policy_free(&p);
    /* the rendezvous closed under us, or no round could form: leave */
    running_coordinated(&p, 1, 0);
    step(&p, POLICY_EV_RDZV_CLOSED, 0, 0, 1);
    exit_clean(&p, 0, -SIGTERM, 2);
    assert_false(find(POLICY_ACT_EXIT)->end_job);
    policy_free(&p);
    assert_int_equal(policy_init(&p, 1, 0, TIMEOUT), 0);
    p.coordinated = true;
    step(&p, POLICY_EV_START, 0, 0, 0);
    step(&p, POLICY_EV_ROUND_FAILED, 0, 0, 1);
    EXPECT(POLICY_ACT_EXIT);
    assert_false(acts[0].end_job);
    policy_free(&p);
    /* one node, restarts used up: the job is over */
    running(&p, 1, 0);
    exit_clean(&p, 0, 1, 1);
    assert_true(find(POLICY_ACT_EXIT)->end_job);
    assert_false(find(POLICY_ACT_EXIT)->finished);
    policy_free(&p);
    /* our workers succeeded but the barrier timed out: leave as finished,
     * the others go on undisturbed */
    running_coordinated(&p, 1, 0);
    exit_clean(&p, 0, 0, 1);
    struct policy_event ev = {.type = POLICY_EV_BARRIER_DONE, .exitcode = -4009};
    nacts = policy_step(&p, &ev, 2, acts);
    EXPECT(POLICY_ACT_EXIT);
    assert_int_equal(acts[0].exit_code, CDDP_EXIT_OK);
    assert_false(acts[0].end_job);
    assert_true(acts[0].finished);
    policy_free(&p);
    /* a signal at the barrier: the same */
    running_coordinated(&p, 1, 0);
    exit_clean(&p, 0, 0, 1);
    step(&p, POLICY_EV_SIGNAL, 0, SIGTERM, 2);
    EXPECT(POLICY_ACT_EXIT);
    assert_int_equal(acts[0].exit_code, 128 + SIGTERM);
    assert_true(acts[0].finished);
    policy_free(&p);
    /* ... but not after the next round started */
    running_coordinated(&p, 1, 0);
    exit_clean(&p, 0, 0, 1);
    step(&p, POLICY_EV_RDZV_RESTART, 0, 0, 2);
    step_round(&p, 0, 3);
    step(&p, POLICY_EV_SIGNAL, 0, SIGTERM, 4);
    exit_clean(&p, 0, -SIGTERM, 5);
    assert_false(find(POLICY_ACT_EXIT)->finished);
    policy_free(&p);
}

static void test_graceful_exit_from_wait_list(void **state)
{
    (void)state;
    struct agent_policy p;
    assert_int_equal(policy_init(&p, 2, 0, TIMEOUT), 0);
    p.coordinated = true;
    step(&p, POLICY_EV_START, 0, 0, 0);
    struct policy_event ev = {.type = POLICY_EV_ROUND_FAILED, .graceful = true};
    nacts = policy_step(&p, &ev, 1, acts);
    EXPECT(POLICY_ACT_EXIT);
    assert_int_equal(acts[0].exit_code, CDDP_EXIT_OK);
    assert_int_equal(p.state, AGENT_SUCCEEDED);
    policy_free(&p);
}

/* Every event in every finished state does nothing. */
static void test_finished_states_are_final(void **state)
{
    (void)state;
    for (int which = 0; which < 3; which++) {
        struct agent_policy p;
        running(&p, 1, 0);
        if (which == 0) {
            exit_clean(&p, 0, 0, 1);
            step(&p, POLICY_EV_BARRIER_DONE, 0, 0, 2);
            assert_int_equal(p.state, AGENT_SUCCEEDED);
        } else if (which == 1) {
            exit_clean(&p, 0, 1, 1);
            assert_int_equal(p.state, AGENT_FAILED);
        } else {
            step(&p, POLICY_EV_SIGNAL, 0, SIGTERM, 1);
            exit_clean(&p, 0, -SIGTERM, 2);
            assert_int_equal(p.state, AGENT_TERMINATED);
        }
        enum agent_state final = p.state;
        for (int t = POLICY_EV_START; t <= POLICY_EV_BARRIER_DONE; t++) {
            step(&p, (enum policy_event_type)t, 0, t == POLICY_EV_SIGNAL ? SIGINT : 1, 99999999);
            EXPECT_NONE();
            assert_int_equal(p.state, final);
        }
        policy_free(&p);
    }
}

static void test_names(void **state)
{
    (void)state;
    assert_string_equal(agent_state_name(AGENT_RUNNING), "HEALTHY");
    assert_string_equal(agent_state_name(AGENT_TERMINATED), "TERMINATED");
    assert_string_equal(worker_state_name(WORKER_STOPPED), "STOPPED");
    assert_string_equal(stop_reason_name(STOP_MEMBERSHIP), "membership");
}

/* Random walks: whatever happens, the invariants hold. */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static unsigned next_rand(unsigned n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng % n);
}

/* policy_will_restart foresees what the stop leads to: when a worker's exit
 * or the deadline ends a stop (no signal or progress line changing the
 * reason on the way), the group rejoins exactly when it said it would. */
static void check_will_restart(enum agent_state before, bool said, const struct policy_event *ev,
                               const struct agent_policy *p)
{
    if (before != AGENT_STOPPING && before != AGENT_KILLING)
        return;
    if (ev->type != POLICY_EV_WORKER_EXIT && ev->type != POLICY_EV_DEADLINE)
        return;
    if (p->state == AGENT_STOPPING || p->state == AGENT_KILLING)
        return;
    if (said != (p->state == AGENT_RENDEZVOUS))
        fail_msg("policy_will_restart said %d, the stop (%s) ended in %s", said,
                 stop_reason_name(p->stop_reason), agent_state_name(p->state));
}

static void test_random_walk_invariants(void **state)
{
    (void)state;
    for (int run = 0; run < 2000; run++) {
        struct agent_policy p;
        int n = 1 + (int)next_rand(4);
        int budget = (int)next_rand(3);
        assert_int_equal(policy_init(&p, n, budget, (uint64_t)next_rand(3) * 10), 0);
        p.max_no_progress = (int)next_rand(3);
        uint64_t now = 0;
        int exits = 0, starts = 0;
        bool deadline_set = false;
        step(&p, POLICY_EV_START, 0, 0, now);
        for (int k = 0; k < 200 && !policy_finished(&p); k++) {
            now += next_rand(20);
            struct policy_event ev = {.type = (enum policy_event_type)next_rand(10),
                                      .local_rank = (int)next_rand((unsigned)n + 1) - (k % 7 == 0),
                                      .exitcode = (int)next_rand(3) - 1,
                                      .group_empty = next_rand(2) == 0,
                                      .sig = next_rand(2) ? SIGTERM : SIGINT};
            if (ev.type == POLICY_EV_DEADLINE && p.deadline_ms)
                now = p.deadline_ms;
            enum agent_state before = p.state;
            bool said = policy_will_restart(&p);
            nacts = policy_step(&p, &ev, now, acts);
            assert_true(nacts <= POLICY_MAX_ACTIONS);
            check_will_restart(before, said, &ev, &p);
            for (int i = 0; i < nacts; i++) {
                switch (acts[i].type) {
                case POLICY_ACT_START_WORKERS:
                    assert_int_equal(before, AGENT_RENDEZVOUS);
                    starts++;
                    break;
                case POLICY_ACT_EXIT:
                    exits++;
                    assert_true(policy_finished(&p));
                    break;
                case POLICY_ACT_SET_DEADLINE:
                    assert_true(acts[i].deadline_ms >= now);
                    deadline_set = true;
                    break;
                case POLICY_ACT_CLEAR_DEADLINE:
                    deadline_set = false;
                    break;
                case POLICY_ACT_SIGNAL_GROUPS:
                    assert_true(p.state == AGENT_STOPPING || p.state == AGENT_KILLING);
                    break;
                default:
                    break;
                }
            }
            (void)deadline_set;
            assert_true(policy_restart_count(&p) >= 0);
            assert_true(policy_restart_count(&p) <= budget);
            /* a failure restart needs a spent unit of budget: starts bounded */
            if (p.state == AGENT_RUNNING) {
                bool any = false;
                for (int i = 0; i < n; i++)
                    any |= p.workers[i].state == WORKER_RUNNING;
                assert_true(any);
            }
            if (p.state == AGENT_RENDEZVOUS || p.state == AGENT_EXIT_BARRIER) {
                for (int i = 0; i < n; i++)
                    assert_int_not_equal(p.workers[i].state, WORKER_RUNNING);
            }
        }
        assert_true(exits <= 1);
        if (policy_finished(&p))
            assert_int_equal(exits, 1);
        policy_free(&p);
    }
}

/* Coordinated random walks: rounds carry arbitrary counts; workers only
 * start in a round within the budget, the count always comes from the last
 * round, and the run ends at most once. */
static void test_random_walk_coordinated(void **state)
{
    (void)state;
    for (int run = 0; run < 2000; run++) {
        struct agent_policy p;
        int n = 1 + (int)next_rand(3);
        int budget = (int)next_rand(3);
        assert_int_equal(policy_init(&p, n, budget, (uint64_t)next_rand(3) * 10), 0);
        p.coordinated = true;
        uint64_t now = 0;
        int exits = 0;
        int64_t last_count = 0;
        step(&p, POLICY_EV_START, 0, 0, now);
        for (int k = 0; k < 200 && !policy_finished(&p); k++) {
            now += next_rand(20);
            struct policy_event ev = {.type = (enum policy_event_type)next_rand(10),
                                      .local_rank = (int)next_rand((unsigned)n),
                                      .exitcode = (int)next_rand(3) - 1,
                                      .group_empty = next_rand(2) == 0,
                                      .sig = SIGTERM,
                                      .restart_count = (int64_t)next_rand(5),
                                      .graceful = next_rand(4) == 0};
            if (ev.type == POLICY_EV_DEADLINE && p.deadline_ms)
                now = p.deadline_ms;
            enum agent_state before = p.state;
            bool said = policy_will_restart(&p);
            nacts = policy_step(&p, &ev, now, acts);
            check_will_restart(before, said, &ev, &p);
            if (ev.type == POLICY_EV_ROUND && before == AGENT_RENDEZVOUS)
                last_count = ev.restart_count;
            for (int i = 0; i < nacts; i++) {
                if (acts[i].type == POLICY_ACT_START_WORKERS)
                    assert_true(last_count <= budget);
                if (acts[i].type == POLICY_ACT_EXIT) {
                    exits++;
                    assert_true(policy_finished(&p));
                }
            }
            assert_int_equal(policy_restart_count(&p), last_count);
            if (p.state == AGENT_RENDEZVOUS || p.state == AGENT_EXIT_BARRIER) {
                for (int i = 0; i < n; i++)
                    assert_int_not_equal(p.workers[i].state, WORKER_RUNNING);
            }
        }
        assert_true(exits <= 1);
        if (policy_finished(&p))
            assert_int_equal(exits, 1);
        policy_free(&p);
    }
}

/* Random walks under worker scope on several nodes, with the rendezvous
 * answering only joins that were made: one join at a time, workers never
 * started over running ones, a generation only over running workers, one
 * exit at most. */
static void test_random_walk_node_in_place(void **state)
{
    (void)state;
    static const enum policy_event_type kinds[] = {
        POLICY_EV_ROUND,    POLICY_EV_ROUND_FAILED, POLICY_EV_WORKER_EXIT,  POLICY_EV_GROUP_EMPTY,
        POLICY_EV_DEADLINE, POLICY_EV_SIGNAL,       POLICY_EV_RDZV_RESTART, POLICY_EV_RDZV_CLOSED,
        POLICY_EV_WATCHDOG, POLICY_EV_GENERATION,   POLICY_EV_WORKER_BLAMED};
    for (int run = 0; run < 2000; run++) {
        struct agent_policy p;
        int n = 1 + (int)next_rand(3);
        assert_int_equal(policy_init(&p, n, (int)next_rand(3), (uint64_t)next_rand(3) * 10), 0);
        p.coordinated = true;
        p.scope = RESTART_SCOPE_WORKER;
        p.rdzv_generations = next_rand(2) == 0;
        uint64_t now = 0;
        int exits = 0;
        step(&p, POLICY_EV_START, 0, 0, now);
        bool join_pending = true;
        for (int k = 0; k < 200 && !policy_finished(&p); k++) {
            now += next_rand(20);
            struct policy_event ev = {
                .type = kinds[next_rand(sizeof(kinds) / sizeof(kinds[0]))],
                .local_rank = (int)next_rand((unsigned)n),
                .exitcode = (int)next_rand(3) - 1,
                .group_empty = next_rand(2) == 0,
                .sig = SIGTERM,
                .nnodes = 1 + (int)next_rand(3),
                .kept = next_rand(2) == 0,
                .generation = (int64_t)next_rand(3),
                .counted = next_rand(3) == 0,
            };
            bool answer = ev.type == POLICY_EV_ROUND || ev.type == POLICY_EV_ROUND_FAILED;
            if (answer && !join_pending)
                continue; /* the rendezvous answers joins only */
            if (answer)
                join_pending = false;
            if (ev.type == POLICY_EV_DEADLINE && p.deadline_ms)
                now = p.deadline_ms;
            bool running = false;
            for (int i = 0; i < n; i++) {
                /* (the worker whose last process this event reports is not) */
                bool gone =
                    i == ev.local_rank &&
                    ((ev.type == POLICY_EV_WORKER_EXIT && ev.group_empty) ||
                     (ev.type == POLICY_EV_GROUP_EMPTY && p.workers[i].state != WORKER_RUNNING));
                running |=
                    !gone && (p.workers[i].state == WORKER_RUNNING || p.workers[i].group_alive);
            }
            nacts = policy_step(&p, &ev, now, acts);
            for (int i = 0; i < nacts; i++) {
                if (acts[i].type == POLICY_ACT_JOIN) {
                    assert_false(join_pending);
                    join_pending = true;
                    if (acts[i].keep)
                        assert_true(running);
                }
                if (acts[i].type == POLICY_ACT_START_WORKERS)
                    assert_false(running);
                if (acts[i].type == POLICY_ACT_NEW_GENERATION)
                    assert_true(running && p.state == AGENT_RUNNING);
                if (acts[i].type == POLICY_ACT_RESTART_WORKER) {
                    /* the workers it starts: its local rank among them, all running */
                    int starts = 0;
                    for (int w = 0; w < n; w++) {
                        if (p.workers[w].replaced_gen != acts[i].generation)
                            continue;
                        starts++;
                        assert_int_equal(p.workers[w].state, WORKER_RUNNING);
                    }
                    assert_true(starts >= 1 && starts <= n);
                    assert_int_equal(p.workers[acts[i].local_rank].replaced_gen,
                                     acts[i].generation);
                }
                if (acts[i].type == POLICY_ACT_EXIT) {
                    exits++;
                    assert_true(policy_finished(&p));
                }
            }
            if (p.state == AGENT_RENDEZVOUS) {
                assert_true(join_pending);
                for (int i = 0; i < n; i++)
                    assert_int_not_equal(p.workers[i].state, WORKER_RUNNING);
            }
            /* a blamed worker that exited waits only for one still to exit */
            bool waiting = false, to_exit = false;
            for (int i = 0; i < n; i++) {
                waiting |= p.workers[i].blamed && p.workers[i].state != WORKER_RUNNING;
                to_exit |= p.workers[i].blamed && p.workers[i].state == WORKER_RUNNING;
            }
            if (p.state == AGENT_RUNNING && waiting)
                assert_true(to_exit);
        }
        assert_true(exits <= 1);
        if (policy_finished(&p))
            assert_int_equal(exits, 1);
        policy_free(&p);
    }
}

/* ---- --restart_scope=worker ---- */

static void progress_of(struct agent_policy *p, int rank, int64_t stepno, uint64_t now)
{
    struct policy_event ev = {.type = POLICY_EV_PROGRESS, .local_rank = rank, .step = stepno};
    nacts = policy_step(p, &ev, now, acts);
}

/* One failure: only that worker starts again, a new generation, one
 * restart of the budget; once it has reported a step and the settle window
 * is over, the next failure is again one worker's. */
static void test_worker_scope_replaces_one(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 4, 3);
    p.scope = RESTART_SCOPE_WORKER;
    exit_clean(&p, 2, 1, 100);
    EXPECT(POLICY_ACT_RESTART_WORKER);
    assert_int_equal(acts[0].local_rank, 2);
    assert_int_equal(acts[0].generation, 1);
    assert_int_equal(acts[0].attempts_left, 2);
    assert_int_equal(p.state, AGENT_RUNNING);
    assert_int_equal(p.workers[2].state, WORKER_RUNNING);
    assert_true(p.workers[2].replacing);
    assert_int_equal(p.workers[2].restarts, 1);
    assert_int_equal(p.workers[1].restarts, 0);
    assert_int_equal(policy_restart_count(&p), 1);
    assert_int_equal(p.worker_restarts, 1);
    assert_int_equal(p.group_restarts, 0);
    /* its first step: re-formed */
    progress_of(&p, 2, 7, 300);
    EXPECT_NONE();
    assert_false(p.workers[2].replacing);
    /* (a signal-killed worker, later: one worker again, generation 2) */
    exit_clean(&p, 0, -SIGKILL, 100 + POLICY_DEFAULT_SETTLE_MS + 1);
    EXPECT(POLICY_ACT_RESTART_WORKER);
    assert_int_equal(acts[0].local_rank, 0);
    assert_int_equal(acts[0].generation, 2);
    assert_int_equal(policy_restart_count(&p), 2);
    /* the workers succeed: the usual end */
    progress_of(&p, 0, 9, 5000);
    for (int i = 0; i < 4; i++)
        exit_clean(&p, i, 0, 6000);
    EXPECT(POLICY_ACT_EXIT_BARRIER);
    policy_free(&p);
}

static void blame(struct agent_policy *p, int rank, int64_t gen, uint64_t now)
{
    struct policy_event ev = {
        .type = POLICY_EV_WORKER_BLAMED, .local_rank = rank, .generation = gen};
    nacts = policy_step(p, &ev, now, acts);
}

/* Two ranks of one node hang together: the agent kills both (blamed in
 * the current generation); the first exit waits for the second, and both
 * are replaced in one generation, one restart of the budget. A blame for
 * another generation is ignored; a crash while a blamed worker is still
 * to exit falls back to the group. */
static void test_worker_scope_blamed_together(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 4, 3);
    p.scope = RESTART_SCOPE_WORKER;
    blame(&p, 1, 0, 100);
    blame(&p, 3, 0, 100);
    blame(&p, 2, 7, 100); /* (a stale generation's: not killed, not waited for) */
    EXPECT_NONE();
    assert_true(p.workers[1].blamed && p.workers[3].blamed && !p.workers[2].blamed);
    exit_clean(&p, 3, -SIGKILL, 110);
    EXPECT_NONE(); /* waits for rank 1 */
    assert_int_equal(p.workers[3].state, WORKER_FAILED);
    exit_clean(&p, 1, -SIGKILL, 111);
    EXPECT(POLICY_ACT_RESTART_WORKER);
    assert_int_equal(acts[0].local_rank, 1);
    assert_int_equal(acts[0].generation, 1);
    assert_int_equal(acts[0].attempts_left, 2);
    for (int i = 0; i < 4; i++) {
        bool replaced = i == 1 || i == 3;
        assert_int_equal(p.workers[i].replaced_gen, replaced ? 1 : 0);
        assert_int_equal(p.workers[i].replacing, replaced);
        assert_int_equal(p.workers[i].restarts, replaced ? 1 : 0);
        assert_int_equal(p.workers[i].state, WORKER_RUNNING);
        assert_false(p.workers[i].blamed);
    }
    assert_int_equal(policy_restart_count(&p), 1);
    assert_int_equal(p.worker_restarts, 1);
    assert_int_equal(p.scope_fallbacks, 0);
    /* re-formed; later one rank hangs alone: one generation, one worker */
    progress_of(&p, 1, 5, 400);
    progress_of(&p, 3, 5, 400);
    blame(&p, 0, 1, 5000);
    exit_clean(&p, 0, -SIGKILL, 5001);
    EXPECT(POLICY_ACT_RESTART_WORKER);
    assert_int_equal(acts[0].local_rank, 0);
    assert_int_equal(acts[0].generation, 2);
    assert_int_equal(p.workers[1].replaced_gen, 1);
    policy_free(&p);

    /* a crash while a blamed worker has not exited: the group restarts */
    running(&p, 4, 3);
    p.scope = RESTART_SCOPE_WORKER;
    blame(&p, 2, 0, 100);
    exit_clean(&p, 0, 1, 101);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    assert_int_equal(p.scope_fallbacks, 1);
    policy_free(&p);

    /* blamed inside a replacement's settle window: the group restarts */
    running(&p, 4, 3);
    p.scope = RESTART_SCOPE_WORKER;
    exit_clean(&p, 2, 1, 100);
    EXPECT(POLICY_ACT_RESTART_WORKER);
    blame(&p, 1, 1, 200);
    exit_clean(&p, 1, -SIGKILL, 201);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    assert_int_equal(p.scope_fallbacks, 1);
    assert_false(p.workers[1].blamed);
    policy_free(&p);

    /* every worker named (nobody left to hold the state), or no restart
     * left: the group restarts, or the run ends */
    running(&p, 2, 3);
    p.scope = RESTART_SCOPE_WORKER;
    blame(&p, 0, 0, 100);
    blame(&p, 1, 0, 100);
    exit_clean(&p, 0, -SIGKILL, 101);
    EXPECT_NONE();
    exit_clean(&p, 1, -SIGKILL, 102);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_JOIN); /* (nothing left to stop) */
    assert_int_equal(acts[1].reason, STOP_FAILURE);
    assert_int_equal(p.scope_fallbacks, 1);
    policy_free(&p);
}

/* A second failure within the settle window: the whole group restarts (an
 * unmodified PyTorch script's ranks all die), counted once more; the new
 * round starts at generation 0. */
static void test_worker_scope_falls_back_in_window(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 4, 3);
    p.scope = RESTART_SCOPE_WORKER;
    exit_clean(&p, 1, 1, 1000);
    EXPECT(POLICY_ACT_RESTART_WORKER);
    exit_clean(&p, 3, 1, 1000 + POLICY_DEFAULT_SETTLE_MS - 1);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    assert_int_equal(p.scope_fallbacks, 1);
    assert_int_equal(p.workers[3].state, WORKER_FAILED);
    for (int i = 0; i < 3; i++)
        exit_clean(&p, i, -SIGTERM, 1200);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_JOIN);
    assert_int_equal(acts[1].reason, STOP_FAILURE);
    assert_int_equal(policy_restart_count(&p), 2);
    assert_int_equal(p.group_restarts, 1);
    assert_int_equal(p.worker_restarts, 1);
    step(&p, POLICY_EV_ROUND, 0, 0, 1300);
    EXPECT(POLICY_ACT_START_WORKERS);
    assert_int_equal(p.generation, 0);
    assert_false(p.workers[1].replacing);
    /* the new group: a failure is one worker's again */
    exit_clean(&p, 2, 75, 9000);
    EXPECT(POLICY_ACT_RESTART_WORKER);
    assert_int_equal(acts[0].generation, 1);
    policy_free(&p);
}

/* A replacement that fails before its first step could not re-form (it
 * exits 75), however late: the group restarts. So does any other worker
 * failing before the replacement reports a step. */
static void test_worker_scope_replacement_fails(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 2, 5);
    p.scope = RESTART_SCOPE_WORKER;
    exit_clean(&p, 0, 1, 10);
    EXPECT(POLICY_ACT_RESTART_WORKER);
    exit_clean(&p, 0, CDDP_EXIT_COLLECTIVE_TIMEOUT, 60000);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    assert_int_equal(p.scope_fallbacks, 1);
    policy_free(&p);

    running(&p, 2, 5);
    p.scope = RESTART_SCOPE_WORKER;
    exit_clean(&p, 0, 1, 10);
    EXPECT(POLICY_ACT_RESTART_WORKER);
    exit_clean(&p, 1, 75, 60000); /* the survivor gave up waiting */
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    policy_free(&p);
}

/* A rendezvous of one node (--standalone: coordinated): a worker restarted
 * alone counts here, and the next round's job count is taken plus it. */
static void test_worker_scope_one_node_coordinated(void **state)
{
    (void)state;
    struct agent_policy p;
    assert_int_equal(policy_init(&p, 2, 3, TIMEOUT), 0);
    p.coordinated = true;
    p.scope = RESTART_SCOPE_WORKER;
    step(&p, POLICY_EV_START, 0, 0, 0);
    struct policy_event ev = {.type = POLICY_EV_ROUND, .restart_count = 0, .nnodes = 1};
    nacts = policy_step(&p, &ev, 0, acts);
    EXPECT(POLICY_ACT_START_WORKERS);
    exit_clean(&p, 1, 1, 10);
    EXPECT(POLICY_ACT_RESTART_WORKER);
    assert_int_equal(policy_restart_count(&p), 1);
    /* the replacement fails: the group goes back to the rendezvous */
    exit_clean(&p, 1, 75, 20);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    exit_clean(&p, 0, -SIGTERM, 30);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_JOIN);
    ev.restart_count = 1; /* the rendezvous counted the group's failure */
    nacts = policy_step(&p, &ev, 40, acts);
    EXPECT(POLICY_ACT_START_WORKERS);
    assert_int_equal(policy_restart_count(&p), 2);
    assert_int_equal(p.group_restarts, 1);
    assert_int_equal(p.worker_restarts, 1);
    /* one node still: one worker again, the job's count plus both */
    exit_clean(&p, 0, 1, 5000);
    EXPECT(POLICY_ACT_RESTART_WORKER);
    assert_int_equal(policy_restart_count(&p), 3);
    /* the budget is spent: the next failure ends the run as under group */
    progress_of(&p, 0, 5, 6000);
    exit_clean(&p, 1, 1, 9000);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    policy_free(&p);
}

/* ---- worker scope, several nodes: a node replaced in place ---- */

static void ev_round(struct agent_policy *p, bool kept, int64_t generation, uint64_t now)
{
    struct policy_event ev = {
        .type = POLICY_EV_ROUND, .nnodes = 2, .kept = kept, .generation = generation};
    nacts = policy_step(p, &ev, now, acts);
}

static void ev_restart(struct agent_policy *p, bool counted, uint64_t now)
{
    struct policy_event ev = {.type = POLICY_EV_RDZV_RESTART, .counted = counted};
    nacts = policy_step(p, &ev, now, acts);
}

static void running_two_nodes(struct agent_policy *p)
{
    assert_int_equal(policy_init(p, 2, 1, TIMEOUT), 0);
    p->coordinated = true;
    p->scope = RESTART_SCOPE_WORKER;
    step(p, POLICY_EV_START, 0, 0, 0);
    ev_round(p, false, 0, 0);
    EXPECT(POLICY_ACT_START_WORKERS);
    assert_int_equal(p->generation, 0);
}

/* A node lost: this node joins with its workers running; a round that
 * goes on in place keeps them in the round's generation; a later lost
 * node again. */
static void test_node_lost_workers_kept(void **state)
{
    (void)state;
    struct agent_policy p;
    running_two_nodes(&p);
    ev_restart(&p, false, 10);
    EXPECT(POLICY_ACT_JOIN);
    assert_true(acts[0].keep);
    assert_int_equal(acts[0].reason, STOP_MEMBERSHIP);
    assert_int_equal(p.state, AGENT_RUNNING);
    ev_round(&p, true, 1, 20);
    EXPECT(POLICY_ACT_NEW_GENERATION);
    assert_int_equal(acts[0].generation, 1);
    assert_int_equal(p.generation, 1);
    assert_int_equal(p.node_replacements, 1);
    assert_int_equal(p.state, AGENT_RUNNING);
    assert_int_equal(policy_restart_count(&p), 0); /* not a failure */
    ev_restart(&p, false, 30);
    EXPECT(POLICY_ACT_JOIN);
    ev_round(&p, true, 2, 40);
    EXPECT(POLICY_ACT_NEW_GENERATION);
    assert_int_equal(p.generation, 2);
    /* the workers finish as ever */
    exit_clean(&p, 0, 0, 50);
    exit_clean(&p, 1, 0, 50);
    EXPECT(POLICY_ACT_EXIT_BARRIER);
    policy_free(&p);
}

/* The round does not go on in place (no spare: the world changed): the
 * workers are stopped, then the round's start at once (no second join). */
static void test_node_lost_round_changed(void **state)
{
    (void)state;
    struct agent_policy p;
    running_two_nodes(&p);
    ev_restart(&p, false, 10);
    EXPECT(POLICY_ACT_JOIN);
    ev_round(&p, false, 0, 20);
    EXPECT(POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    exit_clean(&p, 0, -SIGTERM, 30);
    EXPECT_NONE();
    exit_clean(&p, 1, -SIGTERM, 30);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_START_WORKERS);
    assert_int_equal(p.state, AGENT_RUNNING);
    assert_int_equal(p.generation, 0);
    assert_int_equal(p.node_replacements, 0);
    policy_free(&p);
}

/* A survivor's worker gives up waiting meanwhile (exit 75): the others
 * are stopped without a failure report, and the pending join's round
 * starts the group; the round that comes during the stop waits for it. */
static void test_node_lost_worker_gives_up(void **state)
{
    (void)state;
    struct agent_policy p;
    running_two_nodes(&p);
    ev_restart(&p, false, 10);
    EXPECT(POLICY_ACT_JOIN);
    exit_clean(&p, 0, 75, 20);
    EXPECT(POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    assert_int_equal(p.stop_reason, STOP_MEMBERSHIP);
    exit_clean(&p, 1, 75, 30);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE); /* no second join: one is pending */
    assert_int_equal(p.state, AGENT_RENDEZVOUS);
    ev_round(&p, true, 1, 40);
    EXPECT(POLICY_ACT_START_WORKERS);
    assert_int_equal(p.generation, 0); /* not to be kept: a new group here */
    /* ...and a round that comes while they stop */
    ev_restart(&p, false, 50);
    EXPECT(POLICY_ACT_JOIN);
    exit_clean(&p, 0, 75, 60);
    EXPECT(POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    ev_round(&p, true, 2, 70);
    EXPECT_NONE();
    exit_clean(&p, 1, -SIGTERM, 80);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_START_WORKERS);
    assert_int_equal(p.generation, 0); /* its workers start afresh */
    /* a node the server took for a new one (its ranks replaced) while its
     * workers ran: they stop, and start again as replacements */
    ev_restart(&p, false, 90);
    EXPECT(POLICY_ACT_JOIN);
    ev_round(&p, false, 3, 100);
    EXPECT(POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    exit_clean(&p, 0, -SIGTERM, 110);
    exit_clean(&p, 1, -SIGTERM, 110);
    EXPECT(POLICY_ACT_CLEAR_DEADLINE, POLICY_ACT_START_WORKERS);
    assert_int_equal(p.generation, 3);
    policy_free(&p);
}

/* Where it does not apply: a counted restart (a worker group failed),
 * group scope, and the node taking a lost one's place (its generation). */
static void test_node_lost_not_kept(void **state)
{
    (void)state;
    struct agent_policy p;
    running_two_nodes(&p);
    ev_restart(&p, true, 10);
    EXPECT(POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    policy_free(&p);
    running_two_nodes(&p);
    p.scope = RESTART_SCOPE_GROUP;
    ev_restart(&p, false, 10);
    EXPECT(POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    policy_free(&p);
    assert_int_equal(policy_init(&p, 2, 1, TIMEOUT), 0);
    p.coordinated = true;
    p.scope = RESTART_SCOPE_WORKER;
    step(&p, POLICY_EV_START, 0, 0, 0);
    ev_round(&p, false, 3, 0);
    EXPECT(POLICY_ACT_START_WORKERS);
    assert_int_equal(p.generation, 3);
    /* the rendezvous fails the pending join: the workers stop, the run ends */
    ev_restart(&p, false, 10);
    EXPECT(POLICY_ACT_JOIN);
    step(&p, POLICY_EV_ROUND_FAILED, 0, 0, 20);
    EXPECT(POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    exit_clean(&p, 0, -SIGTERM, 30);
    exit_clean(&p, 1, -SIGTERM, 30);
    assert_int_equal(p.state, AGENT_FAILED);
    policy_free(&p);
}

/* ---- worker scope, several nodes: one worker restarted alone ---- */

static void ev_generation(struct agent_policy *p, int local_rank, int64_t gen, int64_t count,
                          uint64_t now)
{
    struct policy_event ev = {.type = POLICY_EV_GENERATION,
                              .local_rank = local_rank,
                              .generation = gen,
                              .restart_count = count};
    nacts = policy_step(p, &ev, now, acts);
}

static void running_two_nodes_asking(struct agent_policy *p)
{
    assert_int_equal(policy_init(p, 2, 3, TIMEOUT), 0);
    p->coordinated = true;
    p->scope = RESTART_SCOPE_WORKER;
    p->rdzv_generations = true;
    step(p, POLICY_EV_START, 0, 0, 0);
    ev_round(p, false, 0, 0);
    EXPECT(POLICY_ACT_START_WORKERS);
}

/* The failure is asked of the rendezvous; granted, the worker restarts
 * alone in the job's generation; another node's grant moves this node's
 * generation and starts its settle window. */
static void test_several_nodes_worker_granted(void **state)
{
    (void)state;
    struct agent_policy p;
    running_two_nodes_asking(&p);
    exit_clean(&p, 1, 1, 10);
    EXPECT(POLICY_ACT_REQUEST_GENERATION);
    assert_int_equal(acts[0].local_rank, 1);
    assert_int_equal(p.state, AGENT_RUNNING);
    assert_int_equal(p.workers[1].state, WORKER_FAILED);
    assert_int_equal(policy_restart_count(&p), 0); /* not yet */
    /* the answer: generation 3 (the server's; a second failure while
     * asking is test_several_nodes_worker_refused's) */
    ev_generation(&p, 1, 3, 1, 20);
    EXPECT(POLICY_ACT_RESTART_WORKER);
    assert_int_equal(acts[0].local_rank, 1);
    assert_int_equal(acts[0].generation, 3);
    assert_int_equal(p.generation, 3);
    assert_int_equal(p.workers[1].state, WORKER_RUNNING);
    assert_int_equal(p.worker_restarts, 1);
    assert_int_equal(policy_restart_count(&p), 1);
    progress_of(&p, 1, 5, 3000); /* it re-formed */
    /* another node's worker: generation 4 here too, nothing to do */
    ev_generation(&p, -1, 4, 2, 5000);
    EXPECT_NONE();
    assert_int_equal(p.generation, 4);
    assert_int_equal(p.worker_restarts, 1);
    /* the job's count, the other node's restart included */
    assert_int_equal(policy_restart_count(&p), 2);
    /* a failure here within the settle window of that grant: the group */
    exit_clean(&p, 0, 1, 5500);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    assert_int_equal(p.scope_fallbacks, 1);
    policy_free(&p);
}

/* Several nodes: this node's two ranks hang together (every rank of it);
 * once both have exited, one replace asks for both (the workers marked
 * asked, REQUEST_GENERATION naming the first); granted, both restart in
 * the one generation, one restart. Refused: the group restarts, nothing
 * left asked. */
static void test_several_nodes_blamed_together(void **state)
{
    (void)state;
    struct agent_policy p;
    running_two_nodes_asking(&p);
    blame(&p, 0, 0, 10);
    blame(&p, 1, 0, 10);
    exit_clean(&p, 1, -SIGKILL, 11);
    EXPECT_NONE();
    exit_clean(&p, 0, -SIGKILL, 12);
    EXPECT(POLICY_ACT_REQUEST_GENERATION);
    assert_int_equal(acts[0].local_rank, 0);
    assert_true(p.workers[0].asked && p.workers[1].asked);
    assert_int_equal(p.workers[0].state, WORKER_FAILED);
    assert_int_equal(p.workers[1].state, WORKER_FAILED);
    ev_generation(&p, 0, 2, 1, 20);
    EXPECT(POLICY_ACT_RESTART_WORKER);
    assert_int_equal(acts[0].local_rank, 0);
    assert_int_equal(acts[0].generation, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(p.workers[i].replaced_gen, 2);
        assert_int_equal(p.workers[i].state, WORKER_RUNNING);
        assert_false(p.workers[i].asked);
    }
    assert_int_equal(p.worker_restarts, 1);
    assert_int_equal(policy_restart_count(&p), 1);
    policy_free(&p);

    running_two_nodes_asking(&p);
    blame(&p, 0, 0, 10);
    blame(&p, 1, 0, 10);
    exit_clean(&p, 0, -SIGKILL, 11);
    exit_clean(&p, 1, -SIGKILL, 12);
    EXPECT(POLICY_ACT_REQUEST_GENERATION);
    ev_generation(&p, -1, 0, 0, 20); /* refused */
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_JOIN);
    assert_false(p.workers[0].asked || p.workers[1].asked);
    assert_int_equal(p.scope_fallbacks, 1);
    policy_free(&p);

    /* a rendezvous that cannot number generations: the group, at once */
    running_two_nodes_asking(&p);
    p.rdzv_generations = false;
    blame(&p, 1, 0, 10);
    exit_clean(&p, 1, -SIGKILL, 11);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    policy_free(&p);
}

/* Refused (another node's replacement settling, a round that ended): the
 * group restarts as under group scope; a second failure while asking
 * does too, and the late answer changes nothing. */
static void test_several_nodes_worker_refused(void **state)
{
    (void)state;
    struct agent_policy p;
    running_two_nodes_asking(&p);
    exit_clean(&p, 0, 1, 10);
    EXPECT(POLICY_ACT_REQUEST_GENERATION);
    ev_generation(&p, -1, 0, 0, 20);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    assert_int_equal(p.scope_fallbacks, 1);
    assert_int_equal(p.worker_restarts, 0);
    policy_free(&p);

    running_two_nodes_asking(&p);
    exit_clean(&p, 0, 1, 10);
    EXPECT(POLICY_ACT_REQUEST_GENERATION);
    exit_clean(&p, 1, 1, 15);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_JOIN);
    ev_generation(&p, 0, 1, 1, 20);
    EXPECT_NONE();
    assert_int_equal(p.worker_restarts, 0);
    policy_free(&p);

    /* a lost node while asking: the workers are not kept (one is dead) */
    running_two_nodes_asking(&p);
    exit_clean(&p, 0, 1, 10);
    EXPECT(POLICY_ACT_REQUEST_GENERATION);
    ev_restart(&p, false, 20);
    EXPECT(POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    ev_generation(&p, 0, 1, 1, 30);
    EXPECT_NONE();
    policy_free(&p);
}

/* Where worker scope does not apply it behaves as group: no restart left,
 * one worker, several nodes (the rendezvous counts restarts), a hung
 * worker. */
static void test_worker_scope_not_taken(void **state)
{
    (void)state;
    struct agent_policy p;
    running(&p, 4, 0);
    p.scope = RESTART_SCOPE_WORKER;
    exit_clean(&p, 1, 1, 10);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    policy_free(&p);

    running(&p, 1, 3);
    p.scope = RESTART_SCOPE_WORKER;
    exit_clean(&p, 0, 1, 10);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_JOIN);
    policy_free(&p);

    running(&p, 4, 3);
    p.scope = RESTART_SCOPE_WORKER;
    p.coordinated = true;
    p.one_node = false; /* a round of several nodes */
    exit_clean(&p, 1, 1, 10);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    policy_free(&p);

    running(&p, 4, 3);
    p.scope = RESTART_SCOPE_WORKER;
    step(&p, POLICY_EV_WATCHDOG, 2, 0, 10);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    policy_free(&p);

    /* group scope, the default: unchanged */
    running(&p, 4, 3);
    assert_int_equal(p.scope, RESTART_SCOPE_GROUP);
    exit_clean(&p, 1, 1, 10);
    EXPECT(POLICY_ACT_REPORT_FAILURE, POLICY_ACT_SIGNAL_GROUPS, POLICY_ACT_SET_DEADLINE);
    assert_string_equal(restart_scope_name(RESTART_SCOPE_WORKER), "worker");
    assert_string_equal(restart_scope_name(RESTART_SCOPE_GROUP), "group");
    policy_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start_and_round),
        cmocka_unit_test(test_watchdog_fails_group),
        cmocka_unit_test(test_no_progress_stop),
        cmocka_unit_test(test_success_clean),
        cmocka_unit_test(test_success_leaves_processes),
        cmocka_unit_test(test_failure_restarts_then_fails),
        cmocka_unit_test(test_no_restarts),
        cmocka_unit_test(test_deadline_then_kill),
        cmocka_unit_test(test_zero_shutdown_timeout),
        cmocka_unit_test(test_signal_forwarded),
        cmocka_unit_test(test_second_signal_kills),
        cmocka_unit_test(test_signal_during_failure_stop),
        cmocka_unit_test(test_signal_in_other_states),
        cmocka_unit_test(test_membership_restart),
        cmocka_unit_test(test_rendezvous_closed),
        cmocka_unit_test(test_stale_events),
        cmocka_unit_test(test_coordinated_failure_counted_by_round),
        cmocka_unit_test(test_coordinated_peer_failure),
        cmocka_unit_test(test_coordinated_restart_at_barrier),
        cmocka_unit_test(test_end_job),
        cmocka_unit_test(test_graceful_exit_from_wait_list),
        cmocka_unit_test(test_random_walk_coordinated),
        cmocka_unit_test(test_finished_states_are_final),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_random_walk_invariants),
        cmocka_unit_test(test_will_restart),
        cmocka_unit_test(test_worker_scope_replaces_one),
        cmocka_unit_test(test_worker_scope_blamed_together),
        cmocka_unit_test(test_worker_scope_falls_back_in_window),
        cmocka_unit_test(test_worker_scope_replacement_fails),
        cmocka_unit_test(test_worker_scope_not_taken),
        cmocka_unit_test(test_worker_scope_one_node_coordinated),
        cmocka_unit_test(test_several_nodes_worker_granted),
        cmocka_unit_test(test_several_nodes_worker_refused),
        cmocka_unit_test(test_several_nodes_blamed_together),
        cmocka_unit_test(test_node_lost_workers_kept),
        cmocka_unit_test(test_node_lost_round_changed),
        cmocka_unit_test(test_node_lost_worker_gives_up),
        cmocka_unit_test(test_node_lost_not_kept),
        cmocka_unit_test(test_random_walk_node_in_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
