/*
 * Unit tests for launcher/cli.c: every torchrun flag in both spellings and
 * both value forms, PET_* defaults and their precedence, argparse details
 * (prefixes, short clusters, --), every class of bad input (each error must
 * name what was wrong), what this build refuses, and entrypoint resolution.
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
#include <sys/stat.h>
#include <unistd.h>

#include "launcher/cli.h"

static long gpus;
static long fake_cpus(void)
{
    return 8;
}
static long fake_gpus(void)
{
    return gpus;
}
static const struct launch_probe probe = {fake_cpus, fake_gpus};

static char err[1024];
static char *no_env[] = {NULL};

/* parse(cfg, envp, "arg", ..., NULL): argv[0] is added. */
static int parsev(struct launch_config *cfg, char **envp, va_list ap)
{
    static char *argv[64];
    int argc = 0;
    argv[argc++] = (char *)"cddprun";
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL && argc < 63)
        argv[argc++] = (char *)a;
    argv[argc] = NULL;
    err[0] = '\0';
    launch_config_free(cfg);
    return launch_parse(argc, argv, envp, &probe, cfg, err, sizeof(err));
}

static int parse_env(struct launch_config *cfg, char **envp, ...)
{
    va_list ap;
    va_start(ap, envp);
    int rc = parsev(cfg, envp, ap);
    va_end(ap);
    return rc;
}

#define parse(cfg, ...) parse_env(cfg, no_env, __VA_ARGS__, NULL)

/* The call fails and the message names `what`. */
#define assert_bad(what, ...)                                                                      \
    do {                                                                                           \
        struct launch_config c_ = {0};                                                             \
        int rc_ = parse_env(&c_, no_env, __VA_ARGS__, NULL);                                       \
        if (rc_ >= 0 || strstr(err, what) == NULL)                                                 \
            fail_msg("expected an error naming '%s', got rc=%d err='%s'", what, rc_, err);         \
        launch_config_free(&c_);                                                                   \
    } while (0)

static void test_defaults(void **state)
{
    (void)state;
    struct launch_config c = {0};
    assert_int_equal(parse(&c, "train.py"), 0);
    assert_int_equal(c.nnodes_min, 1);
    assert_int_equal(c.nnodes_max, 1);
    assert_int_equal(c.nproc_per_node, 1);
    assert_string_equal(c.rdzv_backend, "static");
    assert_string_equal(c.rdzv_endpoint, "");
    assert_string_equal(c.rdzv_id, "none");
    assert_int_equal(c.rdzv_conf_len, 0);
    assert_false(c.standalone);
    assert_int_equal(c.max_restarts, 0);
    assert_true(c.monitor_interval > 0.0999 && c.monitor_interval < 0.1001);
    assert_string_equal(c.start_method, "spawn");
    assert_string_equal(c.event_log_handler, "null");
    assert_string_equal(c.role, "default");
    assert_false(c.module);
    assert_false(c.no_python);
    assert_false(c.run_path);
    assert_null(c.log_dir);
    assert_false(c.redirects.is_map);
    assert_int_equal(c.redirects.all, 0);
    assert_int_equal(c.tee.all, 0);
    assert_null(c.ranks_filter);
    assert_int_equal(c.node_rank, 0);
    assert_string_equal(c.master_addr, "127.0.0.1");
    assert_int_equal(c.master_port, 29500);
    assert_null(c.local_addr);
    assert_null(c.logs_specs);
    assert_null(c.numa_binding);
    assert_int_equal(c.nsignals, 4);
    assert_int_equal(c.signals[0], SIGTERM);
    assert_int_equal(c.signals[1], SIGINT);
    assert_int_equal(c.signals[2], SIGHUP);
    assert_int_equal(c.signals[3], SIGQUIT);
    assert_string_equal(c.signals_arg, "SIGTERM,SIGINT,SIGHUP,SIGQUIT");
    assert_string_equal(c.entrypoint, "train.py");
    assert_int_equal(c.nentry_args, 0);
    assert_int_equal(c.shutdown_timeout_ms, 30000);
    assert_null(c.prefix_template);
    assert_null(c.error_file);
    assert_int_equal(c.status_port, -1); /* no status port unless asked */
    assert_string_equal(c.status_addr, "127.0.0.1");
    assert_true(c.status_linger_s == 0);
    launch_config_free(&c);
}

/* One flag, checked through a callback in all four forms. */
struct flag_case {
    const char *dashed;
    const char *underscore; /* NULL: one spelling */
    const char *value;      /* NULL: a boolean flag */
    void (*check)(const struct launch_config *c);
};

static void chk_nnodes(const struct launch_config *c)
{
    assert_int_equal(c->nnodes_min, 2);
    assert_int_equal(c->nnodes_max, 3);
}
static void chk_nproc(const struct launch_config *c)
{
    assert_int_equal(c->nproc_per_node, 4);
}
static void chk_backend(const struct launch_config *c)
{
    assert_string_equal(c->rdzv_backend, "c10d");
}
static void chk_endpoint(const struct launch_config *c)
{
    assert_string_equal(c->rdzv_endpoint, "h:1");
}
static void chk_id(const struct launch_config *c)
{
    assert_string_equal(c->rdzv_id, "job7");
}
static void chk_conf(const struct launch_config *c)
{
    assert_int_equal(c->rdzv_conf_len, 2);
    assert_string_equal(c->rdzv_conf[0].key, "timeout");
    assert_string_equal(c->rdzv_conf[0].value, "5");
    assert_string_equal(c->rdzv_conf[1].key, "is_host");
    assert_string_equal(c->rdzv_conf[1].value, "true");
}
static void chk_standalone(const struct launch_config *c)
{
    assert_true(c->standalone);
}
static void chk_restarts(const struct launch_config *c)
{
    assert_int_equal(c->max_restarts, 3);
}
static void chk_monitor(const struct launch_config *c)
{
    assert_true(c->monitor_interval > 4.99 && c->monitor_interval < 5.01);
}
static void chk_start(const struct launch_config *c)
{
    assert_string_equal(c->start_method, "fork");
}
static void chk_events(const struct launch_config *c)
{
    assert_string_equal(c->event_log_handler, "dynamic_rendezvous");
}
static void chk_role(const struct launch_config *c)
{
    assert_string_equal(c->role, "trainer");
}
static void chk_module(const struct launch_config *c)
{
    assert_true(c->module);
}
static void chk_nopy(const struct launch_config *c)
{
    assert_true(c->no_python);
}
static void chk_runpath(const struct launch_config *c)
{
    assert_true(c->run_path);
}
static void chk_logdir(const struct launch_config *c)
{
    assert_string_equal(c->log_dir, "/var/log/x");
}
static void chk_redirects(const struct launch_config *c)
{
    assert_false(c->redirects.is_map);
    assert_int_equal(launch_std_for(&c->redirects, 5), LAUNCH_STD_ALL);
}
static void chk_tee(const struct launch_config *c)
{
    assert_true(c->tee.is_map);
    assert_int_equal(launch_std_for(&c->tee, 0), LAUNCH_STD_OUT);
    assert_int_equal(launch_std_for(&c->tee, 1), LAUNCH_STD_ERR);
    assert_int_equal(launch_std_for(&c->tee, 2), LAUNCH_STD_NONE);
    assert_int_equal(launch_std_for(&c->tee, 12), LAUNCH_STD_NONE);
}
static void chk_filter(const struct launch_config *c)
{
    assert_int_equal(c->ranks_filter_len, 2);
    assert_true(launch_rank_shown(c, 0));
    assert_false(launch_rank_shown(c, 1));
    assert_true(launch_rank_shown(c, 2));
}
static void chk_node_rank(const struct launch_config *c)
{
    assert_int_equal(c->node_rank, 2);
}
static void chk_master_addr(const struct launch_config *c)
{
    assert_string_equal(c->master_addr, "10.0.0.1");
}
static void chk_master_port(const struct launch_config *c)
{
    assert_int_equal(c->master_port, 1234);
}
static void chk_local_addr(const struct launch_config *c)
{
    assert_string_equal(c->local_addr, "10.0.0.2");
}
static void chk_logs_specs(const struct launch_config *c)
{
    assert_string_equal(c->logs_specs, "mine");
}
static void chk_numa(const struct launch_config *c)
{
    assert_string_equal(c->numa_binding, "socket");
}
static void chk_signals(const struct launch_config *c)
{
    assert_int_equal(c->nsignals, 2);
    assert_int_equal(c->signals[0], SIGUSR1);
    assert_int_equal(c->signals[1], SIGTERM);
    assert_string_equal(c->signals_arg, "SIGUSR1,SIGTERM");
}

static void chk_status_port(const struct launch_config *c)
{
    assert_int_equal(c->status_port, 8080);
}
static void chk_status_addr(const struct launch_config *c)
{
    assert_string_equal(c->status_addr, "0.0.0.0");
}
static void chk_status_linger(const struct launch_config *c)
{
    assert_true(c->status_linger_s > 2.49 && c->status_linger_s < 2.51);
}

static const struct flag_case flag_cases[] = {
    {"--nnodes", NULL, "2:3", chk_nnodes},
    {"--nproc-per-node", "--nproc_per_node", "4", chk_nproc},
    {"--rdzv-backend", "--rdzv_backend", "c10d", chk_backend},
    {"--rdzv-endpoint", "--rdzv_endpoint", "h:1", chk_endpoint},
    {"--rdzv-id", "--rdzv_id", "job7", chk_id},
    {"--rdzv-conf", "--rdzv_conf", "timeout=5, is_host = true", chk_conf},
    {"--standalone", NULL, NULL, chk_standalone},
    {"--max-restarts", "--max_restarts", "3", chk_restarts},
    {"--monitor-interval", "--monitor_interval", "5", chk_monitor},
    {"--start-method", "--start_method", "fork", chk_start},
    {"--event-log-handler", "--event_log_handler", "dynamic_rendezvous", chk_events},
    {"--role", NULL, "trainer", chk_role},
    {"--module", "-m", NULL, chk_module},
    {"--no-python", "--no_python", NULL, chk_nopy},
    {"--run-path", "--run_path", NULL, chk_runpath},
    {"--log-dir", "--log_dir", "/var/log/x", chk_logdir},
    {"--redirects", "-r", "3", chk_redirects},
    {"--tee", "-t", "0:1,1:2", chk_tee},
    {"--local-ranks-filter", "--local_ranks_filter", "0,2", chk_filter},
    {"--node-rank", "--node_rank", "2", chk_node_rank},
    {"--master-addr", "--master_addr", "10.0.0.1", chk_master_addr},
    {"--master-port", "--master_port", "1234", chk_master_port},
    {"--local-addr", "--local_addr", "10.0.0.2", chk_local_addr},
    {"--logs-specs", "--logs_specs", "mine", chk_logs_specs},
    {"--numa-binding", "--numa_binding", "socket", chk_numa},
    {"--signals-to-handle", "--signals_to_handle", "SIGUSR1,SIGTERM", chk_signals},
    {"--status-port", "--status_port", "8080", chk_status_port},
    {"--status-addr", "--status_addr", "0.0.0.0", chk_status_addr},
    {"--status-linger", "--status_linger", "2.5", chk_status_linger},
};

static void test_every_flag_both_spellings(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(flag_cases) / sizeof(flag_cases[0]); i++) {
        const struct flag_case *fc = &flag_cases[i];
        const char *names[2] = {fc->dashed, fc->underscore};
        for (int k = 0; k < 2; k++) {
            if (names[k] == NULL)
                continue;
            struct launch_config c = {0};
            char joined[256];
            if (fc->value == NULL) {
                assert_int_equal(parse(&c, names[k], "train.py", "--x"), 0);
            } else {
                /* --flag value */
                if (parse(&c, names[k], fc->value, "train.py", "--x") != 0)
                    fail_msg("%s %s: %s", names[k], fc->value, err);
                fc->check(&c);
                /* --flag=value (and -r=3 for short options) */
                snprintf(joined, sizeof(joined), "%s=%s", names[k], fc->value);
                if (parse(&c, joined, "train.py", "--x") != 0)
                    fail_msg("%s: %s", joined, err);
            }
            fc->check(&c);
            assert_string_equal(c.entrypoint, "train.py");
            assert_int_equal(c.nentry_args, 1);
            assert_string_equal(c.entry_args[0], "--x");
            launch_config_free(&c);
        }
    }
}

static void test_pet_defaults(void **state)
{
    (void)state;
    struct launch_config c = {0};
    char *env[] = {(char *)"PET_NPROC_PER_NODE=3",
                   (char *)"PET_MAX_RESTARTS=2",
                   (char *)"PET_STANDALONE=1",
                   (char *)"PET_ROLE=pet",
                   (char *)"PET_RDZV_CONF=join_timeout=9",
                   (char *)"PET_REDIRECTS=2",
                   (char *)"PET_TEE=1",
                   (char *)"PET_LOCAL_RANKS_FILTER=1",
                   (char *)"PET_MASTER_PORT=4000",
                   (char *)"PET_MASTER_ADDR=10.1.1.1",
                   (char *)"PET_LOCAL_ADDR=10.2.2.2",
                   (char *)"PET_NODE_RANK=0",
                   (char *)"PET_NNODES=1:1",
                   (char *)"PET_MONITOR_INTERVAL=2",
                   (char *)"PET_START_METHOD=forkserver",
                   (char *)"PET_EVENT_LOG_HANDLER=null",
                   (char *)"PET_MODULE=0",
                   (char *)"PET_NO_PYTHON=2",
                   (char *)"PET_RUN_PATH=0",
                   (char *)"PET_LOG_DIR=/tmp/petlogs",
                   (char *)"PET_SIGNALS_TO_HANDLE=SIGUSR2",
                   (char *)"PET_RDZV_ID=petid",
                   (char *)"PET_RDZV_BACKEND=static",
                   (char *)"PET_RDZV_ENDPOINT=1.2.3.4:5",
                   (char *)"PET_LOGS_SPECS=ignored-no-pet",
                   (char *)"PET_NUMA_BINDING=ignored-no-pet",
                   (char *)"TORCH_ELASTIC_SHUTDOWN_TIMEOUT=1.5",
                   (char *)"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=[${rank}]",
                   (char *)"TORCHELASTIC_ERROR_FILE=/tmp/agent-error.json",
                   NULL};
    assert_int_equal(parse_env(&c, env, "w", NULL), 0);
    assert_int_equal(c.nproc_per_node, 3);
    assert_int_equal(c.max_restarts, 2);
    assert_true(c.standalone);
    assert_string_equal(c.role, "pet");
    assert_string_equal(c.rdzv_conf[0].key, "join_timeout");
    assert_int_equal(c.redirects.all, 2);
    assert_int_equal(c.tee.all, 1);
    assert_true(launch_rank_shown(&c, 1));
    assert_false(launch_rank_shown(&c, 0));
    assert_int_equal(c.master_port, 4000);
    assert_string_equal(c.master_addr, "10.1.1.1");
    assert_string_equal(c.local_addr, "10.2.2.2");
    assert_true(c.monitor_interval > 1.99 && c.monitor_interval < 2.01);
    assert_string_equal(c.start_method, "forkserver");
    assert_false(c.module);
    assert_true(c.no_python); /* bool(int("2")) */
    assert_false(c.run_path);
    assert_string_equal(c.log_dir, "/tmp/petlogs");
    assert_int_equal(c.nsignals, 1);
    assert_int_equal(c.signals[0], SIGUSR2);
    /* --standalone overrides the rendezvous settings, as run.py does. */
    assert_string_equal(c.rdzv_backend, "c10d");
    assert_string_equal(c.rdzv_endpoint, "localhost:0");
    assert_int_equal(strlen(c.rdzv_id), 36);
    assert_null(c.logs_specs); /* torchrun has no PET_ for these two */
    assert_null(c.numa_binding);
    assert_int_equal(c.shutdown_timeout_ms, 1500);
    assert_string_equal(c.prefix_template, "[${rank}]");
    assert_string_equal(c.error_file, "/tmp/agent-error.json");

    /* The command line wins over PET_*. */
    assert_int_equal(parse_env(&c, env, "--nproc-per-node=5", "--max_restarts", "7", "--role=cli",
                               "--tee", "0", "w", NULL),
                     0);
    assert_int_equal(c.nproc_per_node, 5);
    assert_int_equal(c.max_restarts, 7);
    assert_string_equal(c.role, "cli");
    assert_int_equal(c.tee.all, 0);
    /* PET_ID without --standalone is used as is. */
    char *env2[] = {(char *)"PET_RDZV_ID=petid", (char *)"PET_STANDALONE=0", NULL};
    assert_int_equal(parse_env(&c, env2, "w", NULL), 0);
    assert_string_equal(c.rdzv_id, "petid");
    assert_false(c.standalone);
    launch_config_free(&c);
}

static void test_pet_bad_values_named(void **state)
{
    (void)state;
    struct launch_config c = {0};
    char *e1[] = {(char *)"PET_MAX_RESTARTS=x", NULL};
    assert_true(parse_env(&c, e1, "w", NULL) < 0);
    assert_non_null(strstr(err, "PET_MAX_RESTARTS"));
    char *e2[] = {(char *)"PET_STANDALONE=yes", NULL};
    assert_true(parse_env(&c, e2, "w", NULL) < 0);
    assert_non_null(strstr(err, "PET_STANDALONE"));
    char *e3[] = {(char *)"PET_NNODES=a:b", NULL};
    assert_true(parse_env(&c, e3, "w", NULL) < 0);
    assert_non_null(strstr(err, "PET_NNODES"));
    char *e4[] = {(char *)"TORCH_ELASTIC_SHUTDOWN_TIMEOUT=soon", NULL};
    assert_true(parse_env(&c, e4, "w", NULL) < 0);
    assert_non_null(strstr(err, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"));
    char *e6[] = {(char *)"CDDP_EXIT_BARRIER_TIMEOUT=2.5", NULL};
    assert_int_equal(parse_env(&c, e6, "w", NULL), 0);
    assert_int_equal(c.exit_barrier_timeout_ms, 2500);
    assert_int_equal(parse(&c, "w"), 0);
    assert_int_equal(c.exit_barrier_timeout_ms, 300000);
    char *e7[] = {(char *)"CDDP_EXIT_BARRIER_TIMEOUT=-1", NULL};
    assert_true(parse_env(&c, e7, "w", NULL) < 0);
    assert_non_null(strstr(err, "CDDP_EXIT_BARRIER_TIMEOUT"));
    char *e5[] = {(char *)"PET_REDIRECTS=9", NULL};
    assert_true(parse_env(&c, e5, "w", NULL) < 0);
    assert_non_null(strstr(err, "PET_REDIRECTS"));
    launch_config_free(&c);
}

static void test_argparse_details(void **state)
{
    (void)state;
    struct launch_config c = {0};
    /* unique prefixes, both spellings of one flag count once */
    assert_int_equal(parse(&c, "--nproc=2", "--max_r", "4", "--stand", "w"), 0);
    assert_int_equal(c.nproc_per_node, 2);
    assert_int_equal(c.max_restarts, 4);
    assert_true(c.standalone);
    /* short options: -r3, -t=2, -mr3 (a cluster), then -- */
    assert_int_equal(parse(&c, "-r3", "-t=2", "w"), 0);
    assert_int_equal(c.redirects.all, 3);
    assert_int_equal(c.tee.all, 2);
    assert_int_equal(parse(&c, "-mr1", "mod"), 0);
    assert_true(c.module);
    assert_int_equal(c.redirects.all, 1);
    assert_int_equal(parse(&c, "--role", "x", "--", "--weird-script", "-a"), 0);
    assert_string_equal(c.entrypoint, "--weird-script");
    assert_int_equal(c.nentry_args, 1);
    /* everything after the script belongs to it, flags included */
    assert_int_equal(parse(&c, "train.py", "--nproc_per_node=8", "-m"), 0);
    assert_int_equal(c.nproc_per_node, 1);
    assert_false(c.module);
    assert_int_equal(c.nentry_args, 2);
    /* the last occurrence wins; a negative number is a value */
    assert_int_equal(parse(&c, "--max_restarts=1", "--max_restarts=2", "w"), 0);
    assert_int_equal(c.max_restarts, 2);
    /* nproc keywords */
    assert_int_equal(parse(&c, "--nproc_per_node=cpu", "w"), 0);
    assert_int_equal(c.nproc_per_node, 8);
    gpus = 0;
    assert_int_equal(parse(&c, "--nproc_per_node=auto", "w"), 0);
    assert_int_equal(c.nproc_per_node, 8);
    gpus = 2;
    assert_int_equal(parse(&c, "--nproc_per_node=auto", "w"), 0);
    assert_int_equal(c.nproc_per_node, 2);
    assert_int_equal(parse(&c, "--nproc_per_node=gpu", "w"), 0);
    assert_int_equal(c.nproc_per_node, 2);
    gpus = 0;
    /* nnodes N */
    assert_int_equal(parse(&c, "--nnodes=4", "w"), 0);
    assert_int_equal(c.nnodes_min, 4);
    assert_int_equal(c.nnodes_max, 4);
    /* rdzv_conf: later keys win, whitespace stripped */
    assert_int_equal(parse(&c, "--rdzv_conf", " timeout=1 ,timeout=2", "w"), 0);
    assert_int_equal(c.rdzv_conf_len, 1);
    assert_string_equal(c.rdzv_conf[0].value, "2");
    /* empty --log_dir means unset, as torchrun's `if not log_dir` */
    assert_int_equal(parse(&c, "--log_dir=", "w"), 0);
    assert_null(c.log_dir);
    /* an empty rdzv id is allowed (the agent generates one) */
    assert_int_equal(parse(&c, "--rdzv_id=", "w"), 0);
    assert_string_equal(c.rdzv_id, "");
    /* signal names: with or without SIG, numbers, duplicates once */
    assert_int_equal(parse(&c, "--signals_to_handle", "usr1, SIGUSR1,15", "w"), 0);
    assert_int_equal(c.nsignals, 2);
    assert_int_equal(c.signals[1], SIGTERM);
    launch_config_free(&c);
}

static void test_help_version(void **state)
{
    (void)state;
    struct launch_config c = {0};
    assert_int_equal(parse(&c, "--help"), LAUNCH_PARSED_HELP);
    assert_int_equal(parse(&c, "-h", "w"), LAUNCH_PARSED_HELP);
    assert_int_equal(parse(&c, "--version"), LAUNCH_PARSED_VERSION);
    launch_config_free(&c);
}

static void test_bad_input(void **state)
{
    (void)state;
    /* unknown, ambiguous, malformed syntax */
    assert_bad("--bogus", "--bogus", "w");
    assert_bad("-x", "-x", "w");
    assert_bad("ambiguous", "--master=1", "w");
    assert_bad("--nproc_per_node", "--nproc_per_node");
    assert_bad("--role", "--role", "--tee", "1", "w");
    assert_bad("--standalone", "--standalone=1", "w");
    assert_bad("-r", "-r");
    /* --nnodes */
    assert_bad("--nnodes", "--nnodes=abc", "w");
    assert_bad("--nnodes", "--nnodes=1:2:3", "w");
    assert_bad("--nnodes", "--nnodes=0", "w");
    assert_bad("--nnodes", "--nnodes=2:1", "w");
    assert_bad("--nnodes", "--nnodes=:", "w");
    assert_bad("--nnodes", "--nnodes=1:", "w");
    /* --nproc_per_node */
    assert_bad("--nproc_per_node", "--nproc_per_node=0", "w");
    assert_bad("--nproc-per-node", "--nproc-per-node=-2", "w");
    assert_bad("--nproc_per_node", "--nproc_per_node=four", "w");
    assert_bad("--nproc_per_node", "--nproc_per_node=gpu", "w");
    assert_bad("--nproc_per_node", "--nproc_per_node=xpu", "w");
    /* rendezvous */
    assert_bad("--rdzv_backend", "--rdzv_backend=zookeeper", "w");
    assert_bad("--rdzv_conf", "--rdzv_conf==x", "w");
    assert_bad("--rdzv_conf", "--rdzv_conf=timeout", "w");
    assert_bad("--rdzv_conf", "--rdzv_conf=timeout=", "w");
    assert_bad("bogus", "--rdzv_conf=bogus=1", "w");
    assert_bad("timeout", "--rdzv_conf=timeout=soon", "w");
    assert_bad("is_host", "--rdzv_conf=is_host=maybe", "w");
    assert_bad("store_type", "--rdzv_conf=store_type=udp", "w");
    /* numbers */
    assert_bad("--max_restarts", "--max_restarts=-1", "w");
    assert_bad("--max-restarts", "--max-restarts=x", "w");
    assert_bad("--max_restarts", "--max_restarts=1.5", "w");
    assert_bad("--monitor_interval", "--monitor_interval=-1", "w");
    assert_bad("--monitor_interval", "--monitor_interval=fast", "w");
    assert_bad("--node_rank", "--node_rank=-1", "w");
    assert_bad("--master_port", "--master_port=0", "w");
    assert_bad("--master_port", "--master_port=70000", "w");
    assert_bad("--master-port", "--master-port=http", "w");
    assert_bad("--master_addr", "--master_addr=", "w");
    /* choices */
    assert_bad("--start_method", "--start_method=thread", "w");
    assert_bad("--event_log_handler", "--event_log_handler=console", "w");
    assert_bad("--event_log_handler", "--event_log_handler=kafka", "w");
    assert_bad("--numa_binding", "--numa_binding=everything", "w");
    /* std masks */
    assert_bad("--redirects", "--redirects=4", "w");
    assert_bad("-r", "-r", "0:4", "w");
    assert_bad("--tee", "--tee=10:1", "w");
    assert_bad("--tee", "--tee=0:1,", "w");
    assert_bad("-t", "-t", "out", "w");
    assert_bad("--local_ranks_filter", "--local_ranks_filter=a", "w");
    assert_bad("--local_ranks_filter", "--local_ranks_filter=1,,2", "w");
    /* signals */
    assert_bad("SIGFOO", "--signals_to_handle=SIGFOO", "w");
    assert_bad("SIGKILL", "--signals_to_handle=SIGTERM,SIGKILL", "w");
    assert_bad("SIGCHLD", "--signals_to_handle=SIGCHLD", "w");
    /* the entrypoint */
    assert_bad("training script", "--nproc_per_node=2");
    assert_bad("training script", "--", "");
    assert_bad("--no_python", "--no_python", "-m", "mod");
}

/* The status port's flags: CDDP_STATUS_* after the command line and before
 * PET_*, empty means off, errors name what was typed or the variable. */
static void test_status_flags(void **state)
{
    (void)state;
    struct launch_config c = {0};
    char *env[] = {(char *)"CDDP_STATUS_PORT=9000",    (char *)"CDDP_STATUS_ADDR=::1",
                   (char *)"CDDP_STATUS_LINGER=1.5",   (char *)"PET_STATUS_PORT=7000",
                   (char *)"PET_STATUS_ADDR=10.9.9.9", NULL};
    assert_int_equal(parse_env(&c, env, "w", NULL), 0);
    assert_int_equal(c.status_port, 9000);
    assert_string_equal(c.status_addr, "::1");
    assert_true(c.status_linger_s > 1.49 && c.status_linger_s < 1.51);
    /* the command line wins over the variables */
    assert_int_equal(parse_env(&c, env, "--status_port=0", "--status-addr", "0.0.0.0",
                               "--status_linger=0", "w", NULL),
                     0);
    assert_int_equal(c.status_port, 0);
    assert_string_equal(c.status_addr, "0.0.0.0");
    assert_true(c.status_linger_s == 0);
    /* PET_* alone, as for every other flag */
    char *pet[] = {(char *)"PET_STATUS_PORT=7000", (char *)"PET_STATUS_ADDR=10.9.9.9", NULL};
    assert_int_equal(parse_env(&c, pet, "w", NULL), 0);
    assert_int_equal(c.status_port, 7000);
    assert_string_equal(c.status_addr, "10.9.9.9");
    /* an empty variable (a manifest's CDDP_STATUS_PORT="") leaves it off */
    char *empty[] = {(char *)"CDDP_STATUS_PORT=", NULL};
    assert_int_equal(parse_env(&c, empty, "w", NULL), 0);
    assert_int_equal(c.status_port, -1);
    /* the bounds, and an unambiguous prefix */
    assert_int_equal(parse(&c, "--status_port=65535", "w"), 0);
    assert_int_equal(c.status_port, 65535);
    assert_int_equal(parse(&c, "--status_p", "81", "w"), 0);
    assert_int_equal(c.status_port, 81);

    assert_bad("--status_port", "--status_port=http", "w");
    assert_bad("--status-port", "--status-port=65536", "w");
    assert_bad("--status_port", "--status_port=-1", "w");
    assert_bad("--status_port", "--status_port", "8080x", "w");
    assert_bad("--status_addr", "--status_addr=", "w");
    assert_bad("--status_linger", "--status_linger=-1", "w");
    assert_bad("--status_linger", "--status_linger=forever", "w");
    assert_bad("ambiguous", "--stat=1", "w");
    char *e1[] = {(char *)"CDDP_STATUS_PORT=99999", NULL};
    assert_true(parse_env(&c, e1, "w", NULL) < 0);
    assert_non_null(strstr(err, "CDDP_STATUS_PORT"));
    assert_non_null(strstr(err, "99999"));
    char *e2[] = {(char *)"PET_STATUS_PORT=x", NULL};
    assert_true(parse_env(&c, e2, "w", NULL) < 0);
    assert_non_null(strstr(err, "PET_STATUS_PORT"));
    char *e3[] = {(char *)"CDDP_STATUS_LINGER=soon", NULL};
    assert_true(parse_env(&c, e3, "w", NULL) < 0);
    assert_non_null(strstr(err, "CDDP_STATUS_LINGER"));
    /* A linger without a status port: typed, a usage error; from a variable,
     * dropped (main.c warns); with a port, kept. */
    assert_int_equal(parse(&c, "--status_linger=5", "w"), 0);
    assert_true(launch_validate(&c, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "--status_linger=5 needs --status_port"));
    char *lenv[] = {(char *)"CDDP_STATUS_LINGER=5", NULL};
    assert_int_equal(parse_env(&c, lenv, "w", NULL), 0);
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    assert_true(c.status_linger_ignored && c.status_linger_s == 0);
    assert_string_equal(c.status_linger_src, "CDDP_STATUS_LINGER");
    assert_int_equal(parse(&c, "--status_linger=5", "--status_port=0", "w"), 0);
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    assert_true(!c.status_linger_ignored && c.status_linger_s == 5);
    assert_int_equal(parse(&c, "--status_linger=0", "w"), 0);
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    launch_config_free(&c);
}

/* --straggler_factor (off or a number above 1; default 1.5) and
 * --no_auto_progress, from the command line and the variables. */
static void test_progress_flags(void **state)
{
    (void)state;
    struct launch_config c = {0};
    assert_int_equal(parse(&c, "w"), 0);
    assert_true(c.straggler_factor == 1.5);
    assert_false(c.no_auto_progress);
    assert_int_equal(parse(&c, "--straggler_factor=off", "--no_auto_progress", "w"), 0);
    assert_true(c.straggler_factor == 0);
    assert_true(c.no_auto_progress);
    assert_int_equal(parse(&c, "--straggler-factor", "3", "--no-auto-progress", "w"), 0);
    assert_true(c.straggler_factor == 3);
    char *env[] = {(char *)"CDDP_STRAGGLER_FACTOR=2.5", (char *)"CDDP_NO_AUTO_PROGRESS=1", NULL};
    assert_int_equal(parse_env(&c, env, "w", NULL), 0);
    assert_true(c.straggler_factor == 2.5);
    assert_true(c.no_auto_progress);
    char *pet[] = {(char *)"PET_STRAGGLER_FACTOR=off", (char *)"PET_NO_AUTO_PROGRESS=1", NULL};
    assert_int_equal(parse_env(&c, pet, "w", NULL), 0);
    assert_true(c.straggler_factor == 0);
    assert_true(c.no_auto_progress);
    char *zero[] = {(char *)"CDDP_NO_AUTO_PROGRESS=0", NULL};
    assert_int_equal(parse_env(&c, zero, "w", NULL), 0);
    assert_false(c.no_auto_progress);
    assert_bad("--straggler_factor", "--straggler_factor=1", "w");
    assert_bad("--straggler_factor", "--straggler_factor=0.5", "w");
    assert_bad("--straggler_factor", "--straggler_factor=fast", "w");
    assert_bad("--straggler_factor", "--straggler_factor=1001", "w");
    char *bad[] = {(char *)"CDDP_STRAGGLER_FACTOR=x", NULL};
    assert_true(parse_env(&c, bad, "w", NULL) < 0);
    assert_non_null(strstr(err, "CDDP_STRAGGLER_FACTOR"));
    launch_config_free(&c);
}

static void test_validate_multinode(void **state)
{
    (void)state;
    struct launch_config c = {0};
    /* c10d: torch's endpoint parsing with the default port 29400 */
    struct {
        const char *arg, *host;
        int port;
    } eps[] = {
        {"--rdzv_endpoint=", "localhost", 29400},
        {"--rdzv_endpoint=node0", "node0", 29400},
        {"--rdzv_endpoint=node0:1234", "node0", 1234},
        {"--rdzv_endpoint=[::1]:29401", "::1", 29401},
        {"--rdzv_endpoint=10.0.0.1:29400", "10.0.0.1", 29400},
    };
    for (size_t i = 0; i < sizeof(eps) / sizeof(eps[0]); i++) {
        assert_int_equal(parse(&c, "--rdzv_backend=c10d", "--nnodes=1:4", eps[i].arg, "w"), 0);
        if (launch_validate(&c, err, sizeof(err)) != 0)
            fail_msg("%s: %s", eps[i].arg, err);
        assert_string_equal(c.rdzv_host, eps[i].host);
        assert_int_equal(c.rdzv_port, eps[i].port);
    }
    assert_int_equal(parse(&c, "--rdzv_backend=c10d", "--rdzv_endpoint=h:x", "w"), 0);
    assert_true(launch_validate(&c, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "--rdzv_endpoint"));
    /* the design's commands: without --rdzv_backend and --node_rank, several
     * nodes (or MIN:MAX) are c10d; torchrun's static would make every node
     * rank 0 */
    assert_int_equal(parse(&c, "--nnodes=2", "--nproc_per_node=4", "--rdzv_endpoint=HOST:29400",
                           "--rdzv_id=job7", "w"),
                     0);
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    assert_string_equal(c.rdzv_backend, "c10d");
    assert_string_equal(c.rdzv_host, "HOST");
    assert_int_equal(c.rdzv_port, 29400);
    assert_int_equal(parse(&c, "--nnodes=1:4", "--max_restarts=3", "w"), 0);
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    assert_string_equal(c.rdzv_backend, "c10d");
    assert_string_equal(c.rdzv_host, "localhost");
    /* ... with either given, torchrun's choice stands */
    assert_int_equal(parse(&c, "--nnodes=2", "--node_rank=0", "--rdzv_endpoint=HOST:29400", "w"),
                     0);
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    assert_string_equal(c.rdzv_backend, "static");
    assert_string_equal(c.static_addr, "HOST");
    char *pet_rank[] = {(char *)"PET_NODE_RANK=1", NULL};
    assert_int_equal(parse_env(&c, pet_rank, "--nnodes=2", "w", NULL), 0);
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    assert_string_equal(c.rdzv_backend, "static");
    assert_int_equal(parse(&c, "--nnodes=2", "--rdzv_backend=static", "w"), 0);
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    assert_string_equal(c.rdzv_backend, "static");
    assert_int_equal(parse(&c, "w"), 0);
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    assert_string_equal(c.rdzv_backend, "static"); /* one node: no network at all */
    /* static with several nodes: the agents need MASTER_PORT + 1 */
    assert_int_equal(parse(&c, "--nnodes=2", "--node_rank=1", "--master_port=65535", "w"), 0);
    assert_true(launch_validate(&c, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "65535"));
    assert_int_equal(parse(&c, "--nnodes=2", "--node_rank=1", "--master_addr=n0", "w"), 0);
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    assert_string_equal(c.static_addr, "n0");
    /* --standalone is one node */
    assert_int_equal(parse(&c, "--standalone", "--nnodes=2", "w"), 0);
    assert_true(launch_validate(&c, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "--standalone"));
    /* rdzv_conf: the rendezvous's own checks, by key */
    const char *bad_conf[][2] = {
        {"--rdzv_conf=join_timout=5", "join_timout"},
        {"--rdzv_conf=store_type=file", "store_type"},
        {"--rdzv_conf=keep_alive_max_attempt=0", "keep_alive_max_attempt"},
        {"--rdzv_conf=etcd_prefix=/x", "etcd_prefix"},
    };
    for (size_t i = 0; i < sizeof(bad_conf) / sizeof(bad_conf[0]); i++) {
        err[0] = '\0';
        assert_true(parse(&c, "--rdzv_backend=c10d", bad_conf[i][0], "w") < 0);
        if (strstr(err, bad_conf[i][1]) == NULL || strstr(err, "--rdzv_conf") == NULL)
            fail_msg("%s: '%s'", bad_conf[i][0], err);
    }
    assert_int_equal(parse(&c, "--rdzv_backend=c10d",
                           "--rdzv_conf=token=s3cret,is_host=0,heartbeat_timeout=5,"
                           "keep_alive_interval=0.5",
                           "w"),
                     0);
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    /* etcd: its keys pass the parser; the backend needs its members */
    assert_int_equal(parse(&c, "--rdzv_backend=etcd-v2", "--rdzv_conf=etcd_prefix=/x", "w"), 0);
    assert_true(launch_validate(&c, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "--rdzv_endpoint"));
    assert_int_equal(parse(&c, "--rdzv_backend=etcd-v3", "--rdzv_endpoint=a:1,b,[::1]:3",
                           "--rdzv_conf=protocol=https,cacert=/ca.pem,key_prefix=/j", "w"),
                     0);
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    assert_int_equal(parse(&c, "--rdzv_backend=etcd-v3", "--rdzv_endpoint=a:1,,b", "w"), 0);
    assert_true(launch_validate(&c, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "etcd member"));
    err[0] = '\0';
    assert_true(parse(&c, "--rdzv_backend=etcd-v3", "--rdzv_conf=protocol=gopher", "w") < 0);
    assert_non_null(strstr(err, "protocol"));
    assert_true(parse(&c, "--rdzv_backend=etcd-v3", "--rdzv_conf=key_prefix=rel", "w") < 0);
    assert_non_null(strstr(err, "key_prefix"));
    launch_config_free(&c);
}

static void test_refused_until_supported(void **state)
{
    (void)state;
    struct launch_config c = {0};
    struct {
        const char *args[3];
        const char *what;
    } refused[] = {
        {{"--rdzv_backend=static", "--nnodes=1:4", "w"}, "--nnodes=1:4"}, /* a fixed count */
        {{"--rdzv-backend=etcd", "w", NULL}, "etcd"},
        {{"--rdzv_backend=etcd-v2", "w", NULL}, "etcd-v2"},
        {{"--node_rank=1", "w", NULL}, "--node_rank"},
        {{"--logs_specs=mine", "w", NULL}, "--logs_specs"},
        {{"--rdzv_endpoint=host", "w", NULL}, "HOST:PORT"},
        {{"--rdzv_endpoint=[::1", "w", NULL}, "--rdzv_endpoint"},
        {{"--rdzv_endpoint=host:0", "w", NULL}, "HOST:PORT"},
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        assert_int_equal(refused[i].args[2]
                             ? parse(&c, refused[i].args[0], refused[i].args[1], refused[i].args[2])
                             : parse(&c, refused[i].args[0], refused[i].args[1]),
                         0);
        err[0] = '\0';
        assert_true(launch_validate(&c, err, sizeof(err)) < 0);
        if (strstr(err, refused[i].what) == NULL)
            fail_msg("%s: '%s' does not name %s", refused[i].args[0], err, refused[i].what);
    }
    /* the static master, parsed as torch's parse_rendezvous_endpoint */
    struct {
        const char *arg, *host;
        int port;
    } masters[] = {
        {"--master_port=1234", "127.0.0.1", 1234},
        {"--master_addr=[::1]", "::1", 29500},
        {"--master_addr=::1", "::1", 29500},
        {"--rdzv_endpoint=node7:42", "node7", 42},
        {"--rdzv_endpoint= [fe80::1]:7 ", "fe80::1", 7},
        {"--rdzv_endpoint=::1:29400", "::1", 29400},
    };
    for (size_t i = 0; i < sizeof(masters) / sizeof(masters[0]); i++) {
        assert_int_equal(parse(&c, masters[i].arg, "w"), 0);
        if (launch_validate(&c, err, sizeof(err)) != 0)
            fail_msg("%s: %s", masters[i].arg, err);
        assert_string_equal(c.static_addr, masters[i].host);
        assert_int_equal(c.static_port, masters[i].port);
    }
    const char *bad_endpoints[] = {"--rdzv_endpoint=[::1]", "--rdzv_endpoint=h:99999",
                                   "--rdzv_endpoint=h:x", "--rdzv_endpoint=bad host:1",
                                   "--master_addr=a/b"};
    for (size_t i = 0; i < sizeof(bad_endpoints) / sizeof(bad_endpoints[0]); i++) {
        assert_int_equal(parse(&c, bad_endpoints[i], "w"), 0);
        err[0] = '\0';
        assert_true(launch_validate(&c, err, sizeof(err)) < 0);
        assert_true(strstr(err, "--rdzv_endpoint") || strstr(err, "--master_addr"));
    }
    /* accepted: the default, a static endpoint, --standalone (even with c10d given) */
    assert_int_equal(parse(&c, "w"), 0);
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    assert_int_equal(parse(&c, "--rdzv_endpoint=localhost:1234", "w"), 0);
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    assert_int_equal(parse(&c, "--rdzv_endpoint=[::1]:1234", "w"), 0);
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    assert_int_equal(parse(&c, "--standalone", "--rdzv_backend=etcd", "w"), 0);
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    launch_config_free(&c);
}

/* ---- launch_resolve: files on disk ---- */

static char tmpdir[64];

static void write_file(const char *name, const char *text, mode_t mode, char *out, size_t len)
{
    snprintf(out, len, "%s/%s", tmpdir, name);
    FILE *f = fopen(out, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    chmod(out, mode);
}

static int resolve_setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/cddp-test-cli-XXXXXX");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int resolve_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_resolve(void **state)
{
    (void)state;
    struct launch_config c = {0};
    char py[256], exe[256], plain[256], exe_py[256];
    write_file("train.py", "print(1)\n", 0644, py, sizeof(py));
    write_file("worker", "#!/bin/sh\n", 0755, exe, sizeof(exe));
    write_file("notes", "#!/bin/sh\n", 0644, plain, sizeof(plain));
    write_file("tool.py", "#!/bin/sh\n", 0755, exe_py, sizeof(exe_py));
    char *env[] = {(char *)"PATH=/usr/bin:/bin", NULL};
    char *env_py[] = {(char *)"PATH=/usr/bin:/bin", (char *)"PYTHON_EXEC=/bin/sh", NULL};

    /* .py: python3 -u script args; python3 from PATH, PYTHON_EXEC overrides */
    assert_int_equal(parse_env(&c, env_py, py, "--lr", "0.1", NULL), 0);
    assert_int_equal(launch_resolve(&c, env_py, err, sizeof(err)), 0);
    assert_int_equal(c.kind, LAUNCH_PYTHON_SCRIPT);
    assert_string_equal(c.program, "/bin/sh");
    assert_int_equal(c.argc, 5);
    assert_string_equal(c.argv[0], "/bin/sh");
    assert_string_equal(c.argv[1], "-u");
    assert_string_equal(c.argv[2], py);
    assert_string_equal(c.argv[3], "--lr");
    assert_null(c.argv[5]);
    /* -m: python3 -u -m module args (no file needed) */
    assert_int_equal(parse_env(&c, env_py, "-m", "pkg.mod", "a", NULL), 0);
    assert_int_equal(launch_resolve(&c, env_py, err, sizeof(err)), 0);
    assert_int_equal(c.kind, LAUNCH_PYTHON_MODULE);
    assert_string_equal(c.argv[2], "-m");
    assert_string_equal(c.argv[3], "pkg.mod");
    assert_string_equal(c.argv[4], "a");
    /* an executable that is not .py runs directly */
    assert_int_equal(parse_env(&c, env, exe, "x", NULL), 0);
    assert_int_equal(launch_resolve(&c, env, err, sizeof(err)), 0);
    assert_int_equal(c.kind, LAUNCH_BINARY);
    assert_string_equal(c.program, exe);
    assert_string_equal(c.argv[0], exe);
    assert_string_equal(c.argv[1], "x");
    /* --no_python runs even a .py directly */
    assert_int_equal(parse_env(&c, env, "--no_python", exe_py, NULL), 0);
    assert_int_equal(launch_resolve(&c, env, err, sizeof(err)), 0);
    assert_int_equal(c.kind, LAUNCH_BINARY);
    assert_string_equal(c.program, exe_py);
    /* a bare name is searched in PATH */
    assert_int_equal(parse_env(&c, env, "--no_python", "true", NULL), 0);
    assert_int_equal(launch_resolve(&c, env, err, sizeof(err)), 0);
    assert_true(strcmp(c.program, "/usr/bin/true") == 0 || strcmp(c.program, "/bin/true") == 0);
    assert_string_equal(c.argv[0], "true");
    /* --run_path: python3 -u -c <bootstrap> script args */
    assert_int_equal(parse_env(&c, env_py, "--run_path", py, "z", NULL), 0);
    assert_int_equal(launch_resolve(&c, env_py, err, sizeof(err)), 0);
    assert_int_equal(c.kind, LAUNCH_RUN_PATH);
    assert_string_equal(c.argv[2], "-c");
    assert_non_null(strstr(c.argv[3], "runpy.run_path"));
    assert_string_equal(c.argv[4], py);
    assert_string_equal(c.argv[5], "z");

    /* errors: each names the file */
    char missing[300];
    snprintf(missing, sizeof(missing), "%s/missing.py", tmpdir);
    assert_int_equal(parse_env(&c, env_py, missing, NULL), 0);
    assert_true(launch_resolve(&c, env_py, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "missing.py"));
    assert_int_equal(parse_env(&c, env, plain, NULL), 0);
    assert_true(launch_resolve(&c, env, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "not executable"));
    assert_int_equal(parse_env(&c, env, "--no_python", "no-such-program-xyz", NULL), 0);
    assert_true(launch_resolve(&c, env, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "no-such-program-xyz"));
    assert_int_equal(parse_env(&c, env, "--no_python", tmpdir, NULL), 0);
    assert_true(launch_resolve(&c, env, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "not a regular file"));
    char *env_nopy[] = {(char *)"PATH=/nonexistent", (char *)"PYTHON_EXEC=/nonexistent/py", NULL};
    assert_int_equal(parse_env(&c, env_nopy, py, NULL), 0);
    assert_true(launch_resolve(&c, env_nopy, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "PYTHON_EXEC"));
    char logfile[300];
    snprintf(logfile, sizeof(logfile), "--log_dir=%s", plain);
    assert_int_equal(parse_env(&c, env, logfile, exe, NULL), 0);
    assert_true(launch_resolve(&c, env, err, sizeof(err)) < 0);
    assert_non_null(strstr(err, "--log_dir"));
    launch_config_free(&c);
}

/* The workers' Python beside a cddprun installed in a venv or a conda
 * environment (pip's layout), and nowhere else. */
static void test_python_beside(void **state)
{
    (void)state;
    char path[512], want[512], exe[512];
    const char *dirs[] = {"venv",      "venv/bin",  "conda", "conda/bin", "conda/conda-meta",
                          "plain",     "plain/bin", "nopy",  "nopy/bin",  "noexec",
                          "noexec/bin"};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", tmpdir, dirs[i]);
        assert_int_equal(mkdir(path, 0755), 0);
    }
    write_file("venv/pyvenv.cfg", "home = /usr/bin\n", 0644, path, sizeof(path));
    write_file("venv/bin/python3", "#!/bin/sh\n", 0755, want, sizeof(want));
    write_file("venv/bin/cddprun", "", 0755, exe, sizeof(exe));
    char *got = launch_python_beside(exe);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
    write_file("conda/bin/python3", "#!/bin/sh\n", 0755, want, sizeof(want));
    write_file("conda/bin/cddprun", "", 0755, exe, sizeof(exe));
    got = launch_python_beside(exe);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
    /* a bin/ with a python3 that is no environment's (/usr/bin): PATH decides */
    write_file("plain/bin/python3", "#!/bin/sh\n", 0755, path, sizeof(path));
    write_file("plain/bin/cddprun", "", 0755, exe, sizeof(exe));
    assert_null(launch_python_beside(exe));
    /* an environment without a usable python3 */
    write_file("nopy/pyvenv.cfg", "", 0644, path, sizeof(path));
    write_file("nopy/bin/cddprun", "", 0755, exe, sizeof(exe));
    assert_null(launch_python_beside(exe));
    write_file("noexec/pyvenv.cfg", "", 0644, path, sizeof(path));
    write_file("noexec/bin/python3", "", 0644, path, sizeof(path));
    write_file("noexec/bin/cddprun", "", 0755, exe, sizeof(exe));
    assert_null(launch_python_beside(exe));
    assert_null(launch_python_beside("cddprun"));
    assert_null(launch_python_beside("/cddprun"));

    /* launch_resolve says where the Python came from (this test program is
     * in no environment) */
    struct launch_config c = {0};
    char py[256];
    write_file("t.py", "print(1)\n", 0644, py, sizeof(py));
    char *env[] = {(char *)"PATH=/usr/bin:/bin", NULL};
    char *env_py[] = {(char *)"PATH=/usr/bin:/bin", (char *)"PYTHON_EXEC=/bin/sh", NULL};
    assert_int_equal(parse_env(&c, env_py, py, NULL), 0);
    assert_int_equal(launch_resolve(&c, env_py, err, sizeof(err)), 0);
    assert_string_equal(c.python_from, "PYTHON_EXEC");
    if (access("/usr/bin/python3", X_OK) == 0 || access("/bin/python3", X_OK) == 0) {
        assert_int_equal(parse_env(&c, env, py, NULL), 0);
        assert_int_equal(launch_resolve(&c, env, err, sizeof(err)), 0);
        assert_string_equal(c.python_from, "python3 on PATH");
        assert_string_equal(c.argv[0], "python3");
    }
    launch_config_free(&c);
}

/* The automatic progress' bootstrap folder beside cddprun: installed
 * (../share/cddp/autoprogress), the wheel's (../lib/cddp/autoprogress), the
 * build tree's (../python/...);
 * a folder without sitecustomize.py is none. */
static void test_auto_progress_dir(void **state)
{
    (void)state;
    char path[512], exe[512], want[600];
    const char *dirs[] = {"inst",
                          "inst/bin",
                          "inst/share",
                          "inst/share/cddp",
                          "inst/share/cddp/autoprogress",
                          "tree",
                          "tree/launcher",
                          "tree/python",
                          "tree/python/autoprogress",
                          "empty",
                          "empty/bin",
                          "empty/share",
                          "empty/share/cddp",
                          "empty/share/cddp/autoprogress",
                          "whl",
                          "whl/bin",
                          "whl/lib",
                          "whl/lib/cddp",
                          "whl/lib/cddp/autoprogress"};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", tmpdir, dirs[i]);
        assert_int_equal(mkdir(path, 0755), 0);
    }
    write_file("inst/share/cddp/autoprogress/sitecustomize.py", "", 0644, path, sizeof(path));
    write_file("inst/bin/cddprun", "", 0755, exe, sizeof(exe));
    char *got = launch_auto_progress_dir(exe);
    assert_non_null(got);
    char *real = realpath(tmpdir, NULL);
    snprintf(want, sizeof(want), "%s/inst/share/cddp/autoprogress", real);
    assert_string_equal(got, want);
    free(got);
    write_file("tree/python/autoprogress/sitecustomize.py", "", 0644, path, sizeof(path));
    write_file("tree/launcher/cddprun", "", 0755, exe, sizeof(exe));
    got = launch_auto_progress_dir(exe);
    snprintf(want, sizeof(want), "%s/tree/python/autoprogress", real);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
    /* the wheel's: beside the libraries it vendors */
    write_file("whl/lib/cddp/autoprogress/sitecustomize.py", "", 0644, path, sizeof(path));
    write_file("whl/bin/cddprun", "", 0755, exe, sizeof(exe));
    got = launch_auto_progress_dir(exe);
    snprintf(want, sizeof(want), "%s/whl/lib/cddp/autoprogress", real);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
    write_file("empty/bin/cddprun", "", 0755, exe, sizeof(exe));
    assert_null(launch_auto_progress_dir(exe));
    assert_null(launch_auto_progress_dir("cddprun"));
    free(real);
}

/* torchrun's newest flags (run.py on main), both spellings and PET_. */
static void test_newest_flags(void **state)
{
    (void)state;
    struct launch_config c = {0};
    assert_int_equal(parse(&c, "--duplicate-stdout-filters", "apple,a,,b,", "--virtual-local-rank",
                           "--shutdown-timeout=7", "w"),
                     0);
    assert_int_equal(c.ndup_filters[0], 3);
    assert_string_equal(c.dup_filters[0][0], "apple");
    assert_string_equal(c.dup_filters[0][1], "a,b"); /* ",," is a literal comma */
    assert_string_equal(c.dup_filters[0][2], "");    /* a trailing comma: "" matches all */
    assert_int_equal(c.ndup_filters[1], 0);
    assert_true(c.virtual_local_rank);
    assert_int_equal(c.shutdown_timeout_ms, 7000);
    assert_int_equal(parse(&c, "--duplicate_stderr_filters=", "--virtual_local_rank", "w"), 0);
    assert_int_equal(c.ndup_filters[1], 0); /* empty: nothing is duplicated */
    assert_true(c.virtual_local_rank);
    assert_false(c.shutdown_timeout_set);
    assert_int_equal(c.shutdown_timeout_ms, 30000);
    /* --shutdown_timeout beats TORCH_ELASTIC_SHUTDOWN_TIMEOUT; PET_ works */
    char *env[] = {(char *)"TORCH_ELASTIC_SHUTDOWN_TIMEOUT=1.5",
                   (char *)"PET_DUPLICATE_STDERR_FILTERS=NCCL WARN",
                   (char *)"PET_VIRTUAL_LOCAL_RANK=1", NULL};
    assert_int_equal(parse_env(&c, env, "w", NULL), 0);
    assert_int_equal(c.shutdown_timeout_ms, 1500);
    assert_string_equal(c.dup_filters[1][0], "NCCL WARN");
    assert_true(c.virtual_local_rank);
    assert_int_equal(parse_env(&c, env, "--shutdown_timeout", "0", "w", NULL), 0);
    assert_int_equal(c.shutdown_timeout_ms, 0);
    assert_bad("--shutdown_timeout", "--shutdown_timeout=1.5", "w");
    assert_bad("--shutdown-timeout", "--shutdown-timeout=-1", "w");
    assert_bad("--virtual_local_rank", "--virtual_local_rank=1", "w");
    /* each worker its own entry of CUDA_VISIBLE_DEVICES */
    char *cvd[] = {(char *)"CUDA_VISIBLE_DEVICES=3,5", NULL};
    assert_int_equal(parse_env(&c, cvd, "--virtual_local_rank", "--nproc_per_node=2", "w", NULL),
                     0);
    assert_true(parse_env(&c, cvd, "--virtual_local_rank", "--nproc_per_node=3", "w", NULL) < 0);
    assert_non_null(strstr(err, "CUDA_VISIBLE_DEVICES=3,5"));
    /* --numa_binding: parsed and no longer refused (agent/numa.c binds) */
    assert_int_equal(parse(&c, "--numa-binding=exclusive", "w"), 0);
    assert_string_equal(c.numa_binding, "exclusive");
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    launch_config_free(&c);
}

/* The Kubeflow training operator's variables, as it sets them. */
static void test_kubeflow_pet(void **state)
{
    (void)state;
    struct launch_config c = {0};
    char *env[] = {(char *)"PET_NNODES=1:3",
                   (char *)"PET_N_PROC_PER_NODE=2",
                   (char *)"PET_RDZV_ENDPOINT=job-worker-0:23456",
                   (char *)"PET_RDZV_BACKEND=c10d",
                   (char *)"PET_RDZV_ID=job",
                   (char *)"PET_RDZV_CONF='join_timeout=5,timeout=5'",
                   (char *)"PET_MAX_RESTARTS=3",
                   NULL};
    assert_int_equal(parse_env(&c, env, "w", NULL), 0);
    assert_int_equal(c.nnodes_min, 1);
    assert_int_equal(c.nnodes_max, 3);
    assert_int_equal(c.nproc_per_node, 2); /* the old spelling */
    assert_string_equal(c.rdzv_backend, "c10d");
    assert_string_equal(c.rdzv_id, "job");
    assert_int_equal(c.max_restarts, 3);
    assert_int_equal(c.rdzv_conf_len, 2);
    assert_string_equal(c.rdzv_conf[0].key, "join_timeout");
    assert_string_equal(c.rdzv_conf[1].value, "5");
    assert_int_equal(c.nnotes, 2);
    assert_non_null(strstr(c.notes[0], "PET_RDZV_CONF: removed the quotes"));
    assert_non_null(strstr(c.notes[1], "PET_N_PROC_PER_NODE=2"));
    assert_int_equal(launch_validate(&c, err, sizeof(err)), 0);
    assert_string_equal(c.rdzv_host, "job-worker-0");
    assert_int_equal(c.rdzv_port, 23456);
    /* the new spelling wins over the old one, the command line over both */
    char *both[] = {(char *)"PET_N_PROC_PER_NODE=2", (char *)"PET_NPROC_PER_NODE=auto", NULL};
    assert_int_equal(parse_env(&c, both, "w", NULL), 0);
    assert_int_equal(c.nproc_per_node, 8); /* auto: no GPU, the CPUs */
    assert_int_equal(c.nnotes, 0);
    assert_int_equal(parse_env(&c, both, "--nproc_per_node=1", "w", NULL), 0);
    assert_int_equal(c.nproc_per_node, 1);
    /* PET_STANDALONE="" is standalone on; "0" off; "x" still refused */
    char *sa[] = {(char *)"PET_STANDALONE=", NULL};
    assert_int_equal(parse_env(&c, sa, "w", NULL), 0);
    assert_true(c.standalone);
    assert_string_equal(c.rdzv_backend, "c10d");
    assert_non_null(strstr(c.notes[0], "PET_STANDALONE"));
    char *off[] = {(char *)"PET_STANDALONE=0", NULL};
    assert_int_equal(parse_env(&c, off, "w", NULL), 0);
    assert_false(c.standalone);
    char *bad[] = {(char *)"PET_STANDALONE=yes", NULL};
    assert_true(parse_env(&c, bad, "w", NULL) < 0);
    assert_non_null(strstr(err, "PET_STANDALONE"));
    launch_config_free(&c);
}

/* Quotes that survived into argv around --rdzv_conf's value. */
static void test_rdzv_conf_quotes(void **state)
{
    (void)state;
    struct launch_config c = {0};
    const char *good[] = {"--rdzv_conf='join_timeout=5,timeout=5'",
                          "--rdzv_conf=\"join_timeout=5,timeout=5\"",
                          "--rdzv-conf= ' join_timeout=5, timeout=5 ' "};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        assert_int_equal(parse(&c, "--rdzv_backend=c10d", good[i], "w"), 0);
        assert_int_equal(c.rdzv_conf_len, 2);
        assert_string_equal(c.rdzv_conf[0].key, "join_timeout");
        assert_string_equal(c.rdzv_conf[1].key, "timeout");
        assert_int_equal(c.nnotes, 1);
        assert_non_null(strstr(c.notes[0], "removed the quotes"));
    }
    assert_int_equal(parse(&c, "--rdzv_conf=join_timeout=5", "w"), 0);
    assert_int_equal(c.nnotes, 0);
    assert_int_equal(parse(&c, "--rdzv_conf=''", "w"), 0); /* quoted nothing: no settings */
    assert_int_equal(c.rdzv_conf_len, 0);
    /* anything else malformed is still refused */
    assert_bad("'join_timeout", "--rdzv_conf='join_timeout=5", "w");
    assert_bad("'5''", "--rdzv_conf=join_timeout=5'", "w");
    assert_bad("'join_timeout", "--rdzv_conf='join_timeout=5\"", "w");
    assert_bad("'timeout'", "--rdzv_conf=join_timeout=5,'timeout'=5", "w");
    assert_bad("must have a value", "--rdzv_conf='join_timeout'", "w");
    launch_config_free(&c);
}

/* Every flag of the table is in --help (the help is written from the
 * table: --no_ifname was once missing from a hand-written one), with its
 * short letter, and says something. */
/* --restart_scope: group (default) or worker; CDDP_RESTART_SCOPE beats
 * PET_RESTART_SCOPE; worker needs the agent store (launch_validate). */
static void test_restart_scope(void **state)
{
    (void)state;
    struct launch_config c = {0};
    assert_int_equal(parse(&c, "w"), 0);
    assert_string_equal(c.restart_scope, "group");
    assert_int_equal(parse(&c, "--restart_scope=worker", "w"), 0);
    assert_string_equal(c.restart_scope, "worker");
    assert_int_equal(parse(&c, "--restart-scope", "group", "w"), 0);
    assert_string_equal(c.restart_scope, "group");
    char *env[] = {(char *)"CDDP_RESTART_SCOPE=worker", (char *)"PET_RESTART_SCOPE=group", NULL};
    assert_int_equal(parse_env(&c, env, "w", NULL), 0);
    assert_string_equal(c.restart_scope, "worker");
    char *pet[] = {(char *)"PET_RESTART_SCOPE=worker", NULL};
    assert_int_equal(parse_env(&c, pet, "w", NULL), 0);
    assert_string_equal(c.restart_scope, "worker");
    assert_bad("--restart_scope", "--restart_scope=node", "w");
    char verr[512];
    assert_int_equal(parse(&c, "--restart_scope=worker", "w"), 0);
    assert_int_equal(launch_validate(&c, verr, sizeof(verr)), 0);
    assert_int_equal(parse(&c, "--restart_scope=worker", "--agent_store=false", "w"), 0);
    assert_true(launch_validate(&c, verr, sizeof(verr)) < 0);
    assert_non_null(strstr(verr, "--restart_scope=worker needs --agent_store=true"));
    launch_config_free(&c);
}

static void test_help_lists_every_flag(void **state)
{
    (void)state;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    launch_print_help(f);
    fclose(f);
    const struct cddp_flags *t = launch_flags_table();
    assert_true(t->n >= 40);
    for (size_t i = 0; i < t->n; i++) {
        const struct cddp_flag *row = &t->rows[i];
        const char *name = cddp_flag_shown_name(row);
        char line[128];
        /* As a row of the options: "  --name" or "  -x, --name", then a
         * space (metavar or help) or the end of the line. */
        if (row->short_name)
            snprintf(line, sizeof(line), "\n  -%c, %s", row->short_name, name);
        else
            snprintf(line, sizeof(line), "\n  %s", name);
        const char *at = strstr(text, line);
        if (at == NULL)
            fail_msg("%s is not in cddprun --help", name);
        char next = at[strlen(line)];
        assert_true(next == ' ' || next == '\n');
        assert_non_null(row->help);
        assert_true(row->help[0] != '\0');
        /* And in the usage line. */
        char item[128];
        if (row->short_name)
            snprintf(item, sizeof(item), "[-%c", row->short_name);
        else
            snprintf(item, sizeof(item), "[%s", name);
        assert_non_null(strstr(text, item));
    }
    assert_non_null(strstr(text, "\n  --no-ifname "));
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_every_flag_both_spellings),
        cmocka_unit_test(test_pet_defaults),
        cmocka_unit_test(test_pet_bad_values_named),
        cmocka_unit_test(test_argparse_details),
        cmocka_unit_test(test_help_version),
        cmocka_unit_test(test_help_lists_every_flag),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_status_flags),
        cmocka_unit_test(test_progress_flags),
        cmocka_unit_test(test_restart_scope),
        cmocka_unit_test(test_refused_until_supported),
        cmocka_unit_test(test_validate_multinode),
        cmocka_unit_test(test_newest_flags),
        cmocka_unit_test(test_kubeflow_pet),
        cmocka_unit_test(test_rdzv_conf_quotes),
        cmocka_unit_test_setup_teardown(test_resolve, resolve_setup, resolve_teardown),
        cmocka_unit_test_setup_teardown(test_python_beside, resolve_setup, resolve_teardown),
        cmocka_unit_test_setup_teardown(test_auto_progress_dir, resolve_setup, resolve_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
