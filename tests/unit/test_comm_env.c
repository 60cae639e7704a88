/* Unit tests for trainer/comm/env.c: torchrun's worker environment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "common/errors.h"
#include "trainer/comm/env.h"

/* A fake environment: NULL-terminated name/value pairs. */
static const char *const *fake_env;

static char *lookup(const char *name)
{
    for (const char *const *p = fake_env; p && *p; p += 2)
        if (strcmp(p[0], name) == 0)
            return (char *)p[1];
    return NULL;
}

static int read_env(const char *const *env, struct trn_dist_env *e, char *err, size_t len)
{
    fake_env = env;
    err[0] = '\0';
    return trn_dist_env_read(e, lookup, err, len);
}

static void test_alone(void **state)
{
    (void)state;
    struct trn_dist_env e;
    char err[256];
    const char *const none[] = {NULL};
    assert_int_equal(read_env(none, &e, err, sizeof(err)), 0);
    assert_int_equal(e.world, 1);
    assert_int_equal(e.rank, 0);
    assert_int_equal(e.local_rank, 0);
    assert_string_equal(e.master_addr, "");
    assert_int_equal(e.restart_count, 0);
    assert_false(e.use_agent_store);

    const char *const one[] = {"WORLD_SIZE", "1", "RANK", "0", NULL};
    assert_int_equal(read_env(one, &e, err, sizeof(err)), 0);
    assert_int_equal(e.world, 1);
}

static void test_torchrun(void **state)
{
    (void)state;
    struct trn_dist_env e;
    char err[256];
    const char *const env[] = {"RANK",
                               "5",
                               "WORLD_SIZE",
                               "8",
                               "LOCAL_RANK",
                               "1",
                               "LOCAL_WORLD_SIZE",
                               "4",
                               "MASTER_ADDR",
                               "node0.example",
                               "MASTER_PORT",
                               "29500",
                               "TORCHELASTIC_RESTART_COUNT",
                               "2",
                               "TORCHELASTIC_USE_AGENT_STORE",
                               "False",
                               "TORCHELASTIC_ERROR_FILE",
                               "/tmp/x/error.json",
                               NULL};
    assert_int_equal(read_env(env, &e, err, sizeof(err)), 0);
    assert_int_equal(e.rank, 5);
    assert_int_equal(e.world, 8);
    assert_int_equal(e.local_rank, 1);
    assert_int_equal(e.local_world, 4);
    assert_string_equal(e.master_addr, "node0.example");
    assert_int_equal(e.master_port, 29500);
    assert_int_equal(e.restart_count, 2);
    assert_false(e.use_agent_store);
    assert_string_equal(e.error_file, "/tmp/x/error.json");

    const char *const v6[] = {"RANK",        "1",           "WORLD_SIZE",
                              "2",           "MASTER_ADDR", "[::1]",
                              "MASTER_PORT", "1234",        "TORCHELASTIC_USE_AGENT_STORE",
                              "True",        NULL};
    assert_int_equal(read_env(v6, &e, err, sizeof(err)), 0);
    assert_string_equal(e.master_addr, "::1");
    assert_int_equal(e.local_rank, 1); /* defaults to RANK */
    assert_true(e.use_agent_store);
}

static void test_rdzv_round(void **state)
{
    (void)state;
    struct trn_dist_env e;
    char err[256];
    const char *const none[] = {NULL};
    assert_int_equal(read_env(none, &e, err, sizeof(err)), 0);
    assert_int_equal(e.rdzv_round, 0); /* torchrun does not set it */
    const char *const env[] = {"CDDP_RDZV_ROUND", "17", "TORCHELASTIC_RESTART_COUNT", "3", NULL};
    assert_int_equal(read_env(env, &e, err, sizeof(err)), 0);
    assert_int_equal(e.rdzv_round, 17);
    assert_int_equal(e.restart_count, 3);
}

static void expect_bad(const char *const *env, int code, const char *needle)
{
    struct trn_dist_env e;
    char err[256];
    int rc = read_env(env, &e, err, sizeof(err));
    if (rc != code || strstr(err, needle) == NULL)
        fail_msg("rc %d err '%s' (wanted %d and '%s')", rc, err, code, needle);
}

static void test_bad(void **state)
{
    (void)state;
    const char *const a[] = {"RANK", "0", NULL};
    expect_bad(a, CDDP_ECONFIG, "WORLD_SIZE is not");
    const char *const b[] = {"RANK", "2", "WORLD_SIZE", "2", NULL};
    expect_bad(b, CDDP_ERANGE_ARG, "RANK=2 is not below WORLD_SIZE=2");
    const char *const c[] = {"WORLD_SIZE", "2", "MASTER_ADDR", "h", "MASTER_PORT", "1", NULL};
    expect_bad(c, CDDP_ECONFIG, "RANK is not set");
    const char *const d[] = {"RANK", "0", "WORLD_SIZE", "2", "MASTER_PORT", "1", NULL};
    expect_bad(d, CDDP_ECONFIG, "MASTER_ADDR is not set");
    const char *const f[] = {"RANK", "0", "WORLD_SIZE", "2", "MASTER_ADDR", "h", NULL};
    expect_bad(f, CDDP_ECONFIG, "MASTER_PORT is not set");
    const char *const g[] = {"RANK", "0",           "WORLD_SIZE", "2", "MASTER_ADDR",
                             "h",    "MASTER_PORT", "70000",      NULL};
    expect_bad(g, CDDP_ERANGE_ARG, "MASTER_PORT='70000'");
    const char *const h[] = {"RANK", "x", "WORLD_SIZE", "2", NULL};
    expect_bad(h, CDDP_EPARSE, "RANK='x'");
    const char *const i[] = {"WORLD_SIZE", "0", NULL};
    expect_bad(i, CDDP_ERANGE_ARG, "WORLD_SIZE='0'");
    const char *const j[] = {"TORCHELASTIC_USE_AGENT_STORE", "maybe", NULL};
    expect_bad(j, CDDP_EPARSE, "TORCHELASTIC_USE_AGENT_STORE='maybe'");
    const char *const k[] = {"TORCHELASTIC_RESTART_COUNT", "-1", NULL};
    expect_bad(k, CDDP_ERANGE_ARG, "TORCHELASTIC_RESTART_COUNT");
    const char *const l[] = {"RANK", "3", "WORLD_SIZE", "4", "LOCAL_RANK", "3", "LOCAL_WORLD_SIZE",
                             "2",    NULL};
    expect_bad(l, CDDP_ERANGE_ARG, "LOCAL_RANK=3");
    const char *const m[] = {"RANK", "0",           "WORLD_SIZE", "2", "MASTER_ADDR",
                             "a b",  "MASTER_PORT", "1",          NULL};
    expect_bad(m, CDDP_EPARSE, "MASTER_ADDR='a b'");
    const char *const n[] = {"CDDP_RDZV_ROUND", "-2", NULL};
    expect_bad(n, CDDP_ERANGE_ARG, "CDDP_RDZV_ROUND='-2'");
    const char *const o[] = {"CDDP_RDZV_ROUND", "two", NULL};
    expect_bad(o, CDDP_EPARSE, "CDDP_RDZV_ROUND='two'");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alone),
        cmocka_unit_test(test_torchrun),
        cmocka_unit_test(test_rdzv_round),
        cmocka_unit_test(test_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
