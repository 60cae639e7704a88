/*
 * Unit tests for launcher/slurm.c and its place in launcher/cli.c: a Slurm
 * step's environment fills the flags left unset (command line > PET_* >
 * Slurm > default), --no_slurm and CDDP_NO_SLURM turn it off, and every
 * malformed SLURM_* value is refused by name.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "common/errors.h"
#include "launcher/cli.h"
#include "launcher/slurm.h"

static long fake_cpus(void)
{
    return 8;
}
static long fake_gpus(void)
{
    return 0;
}
static const struct launch_probe probe = {fake_cpus, fake_gpus};
static char err[1024];

/* A two-node step, seen from node 1. */
#define STEP_ENV                                                                                   \
    "SLURM_JOB_ID=4242", "SLURM_STEP_ID=1", "SLURM_NNODES=2", "SLURM_STEP_NUM_NODES=2",            \
        "SLURM_NODEID=1", "SLURM_JOB_NODELIST=gpu[07-08]", "SLURM_STEP_NODELIST=gpu[07-08]",       \
        "SLURM_STEP_TASKS_PER_NODE=1(x2)", "SLURM_NTASKS_PER_NODE=4", "SLURM_LOCALID=0"

/* Parses argv (NULL-terminated, argv[0] added) with envp, then validates. */
static int run(struct launch_config *cfg, char **envp, const char **args)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)"cddprun";
    for (; *args && argc < 31; args++)
        argv[argc++] = (char *)*args;
    argv[argc] = NULL;
    err[0] = '\0';
    launch_config_free(cfg);
    memset(cfg, 0, sizeof(*cfg));
    int rc = launch_parse(argc, argv, envp, &probe, cfg, err, sizeof(err));
    if (rc == 0)
        rc = launch_validate(cfg, err, sizeof(err));
    return rc;
}

static const char *conf_value(const struct launch_config *c, const char *key)
{
    for (int i = 0; i < c->rdzv_conf_len; i++)
        if (strcmp(c->rdzv_conf[i].key, key) == 0)
            return c->rdzv_conf[i].value;
    return NULL;
}

static bool handles(const struct launch_config *c, int sig)
{
    for (int i = 0; i < c->nsignals; i++)
        if (c->signals[i] == sig)
            return true;
    return false;
}

static void test_step_fills_flags(void **state)
{
    (void)state;
    char *env[] = {STEP_ENV, NULL};
    const char *args[] = {"train.py", NULL};
    struct launch_config c = {0};
    assert_int_equal(run(&c, env, args), 0);
    assert_int_equal(c.nnodes_min, 2);
    assert_int_equal(c.nnodes_max, 2);
    assert_int_equal(c.node_rank, 1);
    assert_string_equal(c.rdzv_backend, "c10d");
    assert_string_equal(c.rdzv_host, "gpu07");
    assert_int_equal(c.rdzv_port, 29400 + (4242 + 1) % 1000);
    assert_string_equal(c.rdzv_id, "4242.1");
    assert_int_equal(c.nproc_per_node, 4); /* SLURM_NTASKS_PER_NODE: no GPUs */
    assert_string_equal(conf_value(&c, "is_host"), "0");
    assert_true(handles(&c, SIGUSR1));
    assert_true(handles(&c, SIGUSR2));
    assert_true(handles(&c, SIGTERM));
    assert_string_equal(c.signals_arg, "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2");
    launch_config_free(&c);

    /* Node 0 hosts; GPUs on the node win over tasks per node. */
    /* (The first of two same names wins: overrides go first.) */
    char *env0b[] = {"SLURM_NODEID=0", "SLURM_GPUS_ON_NODE=8", STEP_ENV, NULL};
    assert_int_equal(run(&c, env0b, args), 0);
    assert_int_equal(c.node_rank, 0);
    assert_int_equal(c.nproc_per_node, 8);
    assert_string_equal(conf_value(&c, "is_host"), "1");
    launch_config_free(&c);

    /* GPUs 0 is no GPU: tasks per node again. */
    char *env1[] = {"SLURM_GPUS_ON_NODE=0", STEP_ENV, NULL};
    assert_int_equal(run(&c, env1, args), 0);
    assert_int_equal(c.nproc_per_node, 4);
    launch_config_free(&c);

    /* Without the step's own variables the job's are used. */
    char *env2[] = {"SLURM_JOB_ID=77", "SLURM_STEP_ID=0",      "SLURM_NNODES=3",
                    "SLURM_NODEID=2",  "SLURM_NODELIST=a,b,c", NULL};
    assert_int_equal(run(&c, env2, args), 0);
    assert_int_equal(c.nnodes_max, 3);
    assert_int_equal(c.node_rank, 2);
    assert_string_equal(c.rdzv_host, "a");
    assert_int_equal(c.rdzv_port, 29477);
    assert_string_equal(c.rdzv_id, "77.0");
    assert_int_equal(c.nproc_per_node, 1); /* torchrun's default */
    launch_config_free(&c);
}

static void test_flags_and_pet_win(void **state)
{
    (void)state;
    char *env[] = {"PET_NPROC_PER_NODE=2", "PET_RDZV_ID=pet", STEP_ENV, NULL};
    const char *args[] = {"--nnodes=1:4", "--rdzv_endpoint=head:1234", "train.py", NULL};
    struct launch_config c = {0};
    assert_int_equal(run(&c, env, args), 0);
    assert_int_equal(c.nnodes_min, 1);
    assert_int_equal(c.nnodes_max, 4);
    assert_string_equal(c.rdzv_host, "head");
    assert_int_equal(c.rdzv_port, 1234);
    assert_string_equal(c.rdzv_id, "pet");
    assert_int_equal(c.nproc_per_node, 2);
    /* The endpoint was the user's: whether to host is the usual guess. */
    assert_null(conf_value(&c, "is_host"));
    assert_int_equal(c.node_rank, 1);
    launch_config_free(&c);

    /* A --rdzv_conf of the user's is left alone. */
    const char *args2[] = {"--rdzv_conf=join_timeout=5", "--signals_to_handle=SIGTERM", "train.py",
                           NULL};
    char *env2[] = {STEP_ENV, NULL};
    assert_int_equal(run(&c, env2, args2), 0);
    assert_null(conf_value(&c, "is_host"));
    assert_string_equal(conf_value(&c, "join_timeout"), "5");
    assert_false(handles(&c, SIGUSR1));
    launch_config_free(&c);

    /* --rdzv_backend=static: the derived endpoint names the master, node
     * ranks are Slurm's. */
    const char *args3[] = {"--rdzv_backend=static", "train.py", NULL};
    assert_int_equal(run(&c, env2, args3), 0);
    assert_string_equal(c.static_addr, "gpu07");
    assert_int_equal(c.static_port, 29400 + 4243 % 1000);
    assert_int_equal(c.node_rank, 1);
    launch_config_free(&c);

    /* --standalone: only the workers and the signals come from Slurm. */
    char *env4[] = {"SLURM_STEP_NUM_NODES=1", "SLURM_NODEID=0", STEP_ENV, NULL};
    const char *args4[] = {"--standalone", "train.py", NULL};
    assert_int_equal(run(&c, env4, args4), 0);
    assert_int_equal(c.nnodes_max, 1);
    assert_int_equal(c.nproc_per_node, 4);
    assert_true(handles(&c, SIGUSR1));
    assert_string_equal(c.rdzv_host, "127.0.0.1");
    launch_config_free(&c);
}

static void test_off_and_outside(void **state)
{
    (void)state;
    const char *args[] = {"train.py", NULL};
    const char *args_off[] = {"--no_slurm", "train.py", NULL};
    const char *args_off2[] = {"--no-slurm", "train.py", NULL};
    struct launch_config c = {0};
    char *env[] = {STEP_ENV, NULL};
    assert_int_equal(run(&c, env, args_off), 0);
    assert_int_equal(c.nnodes_max, 1);
    assert_string_equal(c.rdzv_backend, "static");
    assert_int_equal(c.nproc_per_node, 1);
    assert_false(handles(&c, SIGUSR1));
    assert_int_equal(run(&c, env, args_off2), 0);
    assert_int_equal(c.nnodes_max, 1);
    char *env_off[] = {"CDDP_NO_SLURM=1", STEP_ENV, NULL};
    assert_int_equal(run(&c, env_off, args), 0);
    assert_int_equal(c.nnodes_max, 1);
    char *env_on[] = {"CDDP_NO_SLURM=0", STEP_ENV, NULL};
    assert_int_equal(run(&c, env_on, args), 0);
    assert_int_equal(c.nnodes_max, 2);
    char *env_bad[] = {"CDDP_NO_SLURM=yes", STEP_ENV, NULL};
    assert_int_equal(run(&c, env_bad, args), CDDP_EPARSE);
    assert_non_null(strstr(err, "CDDP_NO_SLURM"));

    /* A batch script or salloc's shell: a job but no step. */
    char *batch[] = {"SLURM_JOB_ID=9", "SLURM_NNODES=2", "SLURM_NODEID=0",
                     "SLURM_JOB_NODELIST=n[1-2]", NULL};
    assert_int_equal(run(&c, batch, args), 0);
    assert_int_equal(c.nnodes_max, 1);
    assert_string_equal(c.rdzv_backend, "static");
    launch_config_free(&c);
}

static void test_refusals(void **state)
{
    (void)state;
    const char *args[] = {"train.py", NULL};
    struct {
        const char *var;
        const char *want;
    } bad[] = {
        {"SLURM_STEP_NUM_NODES=two", "SLURM_STEP_NUM_NODES='two' is not a number of nodes"},
        {"SLURM_STEP_NUM_NODES=0", "SLURM_STEP_NUM_NODES='0' is not a number of nodes"},
        {"SLURM_NODEID=2", "SLURM_NODEID='2' is not a node index (0-1)"},
        {"SLURM_NODEID=-1", "SLURM_NODEID='-1' is not a node index"},
        {"SLURM_STEP_NODELIST=gpu[07-", "SLURM_STEP_NODELIST: host list 'gpu[07-'"},
        {"SLURM_STEP_NODELIST=gpu 1", "SLURM_STEP_NODELIST: host list 'gpu 1': ' ' at offset 3"},
        {"SLURM_JOB_ID=4 2", "SLURM_JOB_ID='4 2' is not a Slurm job id"},
        {"SLURM_STEP_ID=a;b", "SLURM_STEP_ID='a;b' is not a Slurm step id"},
        {"SLURM_GPUS_ON_NODE=lots", "SLURM_GPUS_ON_NODE='lots' is not a number of GPUs"},
        {"SLURM_NTASKS_PER_NODE=0", "SLURM_NTASKS_PER_NODE='0' is not a number of tasks"},
        {"SLURM_STEP_TASKS_PER_NODE=1(x", "SLURM_STEP_TASKS_PER_NODE (for SLURM_NODEID=1)"},
        {"SLURM_STEP_TASKS_PER_NODE=1", "SLURM_STEP_TASKS_PER_NODE (for SLURM_NODEID=1): count "
                                        "list '1': has 1 entries, no entry 1"},
        {"SLURM_STEP_TASKS_PER_NODE=1,4",
         "srun started 4 tasks of this step on this node (SLURM_STEP_TASKS_PER_NODE=1,4)"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char *env[] = {(char *)bad[i].var, STEP_ENV, NULL};
        struct launch_config c = {0};
        int rc = run(&c, env, args);
        if (rc >= 0 || strstr(err, bad[i].want) == NULL)
            fail_msg("%s: rc=%d err='%s', want '%s'", bad[i].var, rc, err, bad[i].want);
        if (strchr(err, '\n'))
            fail_msg("%s: the error is more than one line", bad[i].var);
        launch_config_free(&c);
    }
    /* Several tasks here, but --no_slurm: the user lays the job out. */
    char *env[] = {"SLURM_STEP_TASKS_PER_NODE=2(x2)", STEP_ENV, NULL};
    const char *off[] = {"--no_slurm", "train.py", NULL};
    struct launch_config c = {0};
    assert_int_equal(run(&c, env, off), 0);
    launch_config_free(&c);
}

static void test_derive_direct(void **state)
{
    (void)state;
    struct launch_slurm sl;
    char *none[] = {"HOME=/root", NULL};
    assert_int_equal(launch_slurm_derive(none, &sl, err, sizeof(err)), 0);
    assert_false(sl.in_job);
    char *env[] = {"SLURM_JOBID=12", "SLURM_STEPID=3",           "SLURM_NODEID=0",
                   "SLURM_NNODES=1", "SLURM_NODELIST=login[01]", NULL};
    assert_int_equal(launch_slurm_derive(env, &sl, err, sizeof(err)), 0);
    assert_true(sl.in_step);
    assert_string_equal(sl.first_host, "login01");
    assert_string_equal(sl.endpoint.text, "login01:29415");
    assert_string_equal(sl.rdzv_id.text, "12.3");
    assert_null(sl.nproc.var);
    /* A job id that is not a number still gives every node the same port. */
    char *env2[] = {"SLURM_JOB_ID=abc", "SLURM_STEP_ID=0", "SLURM_NODELIST=x", NULL};
    assert_int_equal(launch_slurm_derive(env2, &sl, err, sizeof(err)), 0);
    int port = sl.port;
    assert_true(port >= 29400 && port < 30400);
    assert_int_equal(launch_slurm_derive(env2, &sl, err, sizeof(err)), 0);
    assert_int_equal(sl.port, port);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_fills_flags), cmocka_unit_test(test_flags_and_pet_win),
        cmocka_unit_test(test_off_and_outside),  cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_derive_direct),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
