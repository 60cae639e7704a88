/*
 * Tests for agent/agent.c's seams, with real workers: the hooks the status
 * server and the progress channel plug into (start/stop with the loop,
 * state_changed snapshots through a run with a restart, prepare_worker's
 * extra environment and inherited fds), and agent_run's exit statuses.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/log.h"
#include "launcher/cli.h"

extern char **environ;

struct record {
    int calls;
    int started, stopped;
    uv_timer_t ticker; /* a handle the "status server" owns */
    enum agent_state states[256];
    int nstates;
    struct agent_snapshot last;
    struct agent_worker_info last_workers[4];
    pid_t pids_seen[16];
    int npids;
    int pipe_w[4];
    int prepared;
};

static void tick(uv_timer_t *t)
{
    (void)t;
}

static int on_start(void *arg, uv_loop_t *loop)
{
    struct record *r = arg;
    r->started++;
    uv_timer_init(loop, &r->ticker);
    return uv_timer_start(&r->ticker, tick, 5, 5); /* keeps the loop alive until stop() */
}

static void on_stop(void *arg)
{
    struct record *r = arg;
    r->stopped++;
    uv_close((uv_handle_t *)&r->ticker, NULL);
}

static void on_change(void *arg, const struct agent_snapshot *s)
{
    struct record *r = arg;
    r->calls++;
    if (r->nstates == 0 || r->states[r->nstates - 1] != s->state)
        r->states[r->nstates++ % 256] = s->state;
    r->last = *s;
    assert_true(s->nworkers <= 4);
    memcpy(r->last_workers, s->workers, sizeof(s->workers[0]) * (size_t)s->nworkers);
    for (int i = 0; i < s->nworkers; i++) {
        pid_t p = s->workers[i].pid;
        bool seen = p == 0;
        for (int k = 0; k < r->npids; k++)
            seen |= r->pids_seen[k] == p;
        if (!seen && r->npids < 16)
            r->pids_seen[r->npids++] = p;
    }
    assert_non_null(s->run_id);
    assert_string_equal(s->role, "default");
}

static int on_prepare(void *arg, int local_rank, int restart_count, struct agent_worker_extras *x)
{
    struct record *r = arg;
    r->prepared++;
    snprintf(x->storage, sizeof(x->storage), "rank%d-attempt%d", local_rank, restart_count);
    x->env[0].key = "CDDP_TEST_EXTRA";
    x->env[0].value = x->storage;
    x->env[1].key = "CDDP_TEST_FD";
    x->env[1].value = "3";
    x->nenv = 2;
    x->fds[0] = r->pipe_w[local_rank];
    x->nfds = 1;
    return 0;
}

static int run_cddprun(struct record *r, ...)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)"cddprun";
    va_list ap;
    va_start(ap, r);
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL)
        argv[argc++] = (char *)a;
    va_end(ap);
    argv[argc] = NULL;
    struct launch_config cfg;
    char err[512];
    int rc = launch_parse(argc, argv, environ, &launch_system_probe, &cfg, err, sizeof(err));
    if (rc == 0)
        rc = launch_validate(&cfg, err, sizeof(err));
    if (rc == 0)
        rc = launch_resolve(&cfg, environ, err, sizeof(err));
    if (rc != 0)
        fail_msg("bad test command line: %s", err);
    struct agent_hooks hooks = {
        .arg = r,
        .start = on_start,
        .stop = on_stop,
        .state_changed = on_change,
        .prepare_worker = on_prepare,
    };
    int code = agent_run(&cfg, &hooks);
    launch_config_free(&cfg);
    return code;
}

static void open_pipes(struct record *r, int rd[2])
{
    for (int i = 0; i < 2; i++) {
        int p[2];
        assert_int_equal(pipe(p), 0);
        rd[i] = p[0];
        r->pipe_w[i] = p[1];
    }
}

static void close_writers(struct record *r)
{
    for (int i = 0; i < 2; i++)
        close(r->pipe_w[i]);
}

static void test_hooks_success(void **state)
{
    (void)state;
    struct record *r = calloc(1, sizeof(*r));
    int rd[2];
    open_pipes(r, rd);
    cddp_log_set_level(CDDP_LOG_ERROR);
    int code = run_cddprun(r, "--nproc_per_node=2", "--log_dir=/dev/null", "--no_python", "/bin/sh",
                           "-c", "echo \"$CDDP_TEST_EXTRA $RANK\" >&$CDDP_TEST_FD", NULL);
    close_writers(r);
    assert_int_equal(code, 0);
    assert_int_equal(r->started, 1);
    assert_int_equal(r->stopped, 1);
    assert_int_equal(r->prepared, 2);
    for (int i = 0; i < 2; i++) {
        char buf[64] = "", want[64];
        ssize_t n = read(rd[i], buf, sizeof(buf) - 1);
        assert_true(n > 0);
        buf[n] = '\0';
        snprintf(want, sizeof(want), "rank%d-attempt0 %d\n", i, i);
        assert_string_equal(buf, want); /* the extra env and fd reached the worker */
        close(rd[i]);
    }
    /* the run as the status page saw it */
    assert_true(r->calls >= 3);
    assert_int_equal(r->states[r->nstates - 1], AGENT_SUCCEEDED);
    bool saw_running = false;
    for (int i = 0; i < r->nstates; i++)
        saw_running |= r->states[i] == AGENT_RUNNING;
    assert_true(saw_running);
    assert_int_equal(r->last.round, 1);
    assert_int_equal(r->last.world_size, 2);
    assert_int_equal(r->last.restart_count, 0);
    assert_int_equal(r->npids, 2);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(r->last_workers[i].state, WORKER_SUCCEEDED);
        assert_int_equal(r->last_workers[i].exitcode, 0);
        assert_int_equal(r->last_workers[i].rank, i);
        assert_true(r->last_workers[i].start_time > 0);
        assert_true(r->last_workers[i].exit_time >= r->last_workers[i].start_time);
    }
    free(r);
}

static void test_hooks_restart_then_fail(void **state)
{
    (void)state;
    struct record *r = calloc(1, sizeof(*r));
    int rd[2];
    open_pipes(r, rd);
    cddp_log_set_level(CDDP_LOG_CRITICAL);
    int code = run_cddprun(r, "--nproc_per_node=2", "--max_restarts=1", "--log_dir=/dev/null",
                           "--no_python", "/bin/sh", "-c",
                           "echo \"$CDDP_TEST_EXTRA\" >&$CDDP_TEST_FD; "
                           "if [ $LOCAL_RANK = 1 ]; then exit 3; fi; exec sleep 30",
                           NULL);
    close_writers(r);
    /* the table goes to stderr; the status is 1 */
    assert_int_equal(code, 1);
    assert_int_equal(r->prepared, 4);
    assert_int_equal(r->last.restart_count, 1);
    assert_int_equal(r->last.round, 2);
    assert_int_equal(r->states[r->nstates - 1], AGENT_FAILED);
    assert_int_equal(r->npids, 4); /* new processes on the restart */
    for (int i = 0; i < 2; i++) {
        assert_int_equal(r->last_workers[i].restarts, 1);
        assert_true(r->last_workers[i].state == WORKER_FAILED ||
                    r->last_workers[i].state == WORKER_STOPPED);
    }
    /* rank 1 fails on its own, after writing; rank 0 may be stopped before */
    char buf[128] = "";
    ssize_t n = read(rd[1], buf, sizeof(buf) - 1);
    buf[n > 0 ? n : 0] = '\0';
    assert_string_equal(buf, "rank1-attempt0\nrank1-attempt1\n");
    close(rd[0]);
    close(rd[1]);
    free(r);
}

int main(void)
{
    /* The table of the failing run is expected on stderr; keep test output readable. */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hooks_success),
        cmocka_unit_test(test_hooks_restart_then_fail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
