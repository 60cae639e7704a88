/*
 * Unit tests for agent/env.c: rank arithmetic over rounds (one node and the
 * multi-node offsets the rendezvous will hand out), and the worker
 * environment: torchrun 2.x's variables with their values, the agent's own
 * environment passed through, overridden keys replaced (not duplicated),
 * TORCH_NCCL_ASYNC_ERROR_HANDLING kept when set, and extras.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "agent/env.h"
#include "common/errors.h"

static struct agent_round round_of(int node_rank, int nnodes, int world, int offset)
{
    struct agent_round r;
    memset(&r, 0, sizeof(r));
    r.round = 1;
    r.node_rank = node_rank;
    r.nnodes = nnodes;
    r.world_size = world;
    r.rank_offset = offset;
    return r;
}

static void test_ranks_single_node(void **state)
{
    (void)state;
    struct agent_round r = round_of(0, 1, 4, 0);
    for (int lr = 0; lr < 4; lr++) {
        struct agent_worker_ranks w;
        assert_int_equal(agent_worker_ranks(&r, 4, lr, &w), 0);
        assert_int_equal(w.local_rank, lr);
        assert_int_equal(w.rank, lr);
        assert_int_equal(w.role_rank, lr);
        assert_int_equal(w.group_rank, 0);
        assert_int_equal(w.local_world_size, 4);
        assert_int_equal(w.world_size, 4);
        assert_int_equal(w.role_world_size, 4);
        assert_int_equal(w.group_world_size, 1);
    }
}

static void test_ranks_multi_node(void **state)
{
    (void)state;
    /* nodes with 2, 3 and 1 workers: offsets 0, 2, 5; world 6 */
    int nproc[3] = {2, 3, 1};
    int offset = 0;
    int seen[6] = {0};
    for (int node = 0; node < 3; node++) {
        struct agent_round r = round_of(node, 3, 6, offset);
        for (int lr = 0; lr < nproc[node]; lr++) {
            struct agent_worker_ranks w;
            assert_int_equal(agent_worker_ranks(&r, nproc[node], lr, &w), 0);
            assert_int_equal(w.rank, offset + lr);
            assert_int_equal(w.group_rank, node);
            assert_int_equal(w.group_world_size, 3);
            assert_int_equal(w.world_size, 6);
            seen[w.rank]++;
        }
        offset += nproc[node];
    }
    for (int i = 0; i < 6; i++)
        assert_int_equal(seen[i], 1); /* every global rank exactly once */
}

static void test_ranks_invalid(void **state)
{
    (void)state;
    struct agent_worker_ranks w;
    struct agent_round r = round_of(0, 1, 4, 0);
    assert_int_equal(agent_worker_ranks(&r, 4, 4, &w), CDDP_ERANGE_ARG);
    assert_int_equal(agent_worker_ranks(&r, 4, -1, &w), CDDP_ERANGE_ARG);
    assert_int_equal(agent_worker_ranks(&r, 5, 0, &w), CDDP_ERANGE_ARG);
    assert_int_equal(agent_worker_ranks(&r, 0, 0, &w), CDDP_ERANGE_ARG);
    r = round_of(1, 2, 4, 3); /* 3 + 2 > 4 */
    assert_int_equal(agent_worker_ranks(&r, 2, 0, &w), CDDP_ERANGE_ARG);
    r = round_of(2, 2, 4, 0); /* node_rank >= nnodes */
    assert_int_equal(agent_worker_ranks(&r, 2, 0, &w), CDDP_ERANGE_ARG);
    r = round_of(0, 1, 4, -1);
    assert_int_equal(agent_worker_ranks(&r, 2, 0, &w), CDDP_ERANGE_ARG);
}

static int count_key(char *const *envp, const char *key)
{
    int n = 0;
    size_t kl = strlen(key);
    for (char *const *e = envp; *e; e++)
        n += strncmp(*e, key, kl) == 0 && (*e)[kl] == '=';
    return n;
}

static struct agent_env_spec spec_for(int lr)
{
    struct agent_round r = round_of(1, 2, 8, 4);
    struct agent_env_spec s;
    memset(&s, 0, sizeof(s));
    assert_int_equal(agent_worker_ranks(&r, 4, lr, &s.ranks), 0);
    s.role = "trainer";
    s.master_addr = "10.0.0.1";
    s.master_port = 29511;
    s.restart_count = 2;
    s.max_restarts = 3;
    s.run_id = "job7";
    s.use_agent_store = false;
    s.error_file = "/logs/attempt_2/1/error.json";
    return s;
}

static void test_env_values(void **state)
{
    (void)state;
    char *base[] = {(char *)"PATH=/usr/bin",   (char *)"OMP_NUM_THREADS=1",
                    (char *)"RANK=99",         (char *)"MASTER_PORT=1",
                    (char *)"HOME=/root",      (char *)"CUDA_VISIBLE_DEVICES=2,3",
                    (char *)"WEIRD_NO_EQUALS", NULL};
    struct agent_env_spec s = spec_for(1);
    struct agent_env env;
    assert_int_equal(agent_env_build(base, &s, &env), 0);
    char *const *e = env.envp;
    static const struct {
        const char *k, *v;
    } want[] = {
        {"LOCAL_RANK", "1"},
        {"RANK", "5"},
        {"GROUP_RANK", "1"},
        {"ROLE_RANK", "5"},
        {"ROLE_NAME", "trainer"},
        {"LOCAL_WORLD_SIZE", "4"},
        {"WORLD_SIZE", "8"},
        {"GROUP_WORLD_SIZE", "2"},
        {"ROLE_WORLD_SIZE", "8"},
        {"MASTER_ADDR", "10.0.0.1"},
        {"MASTER_PORT", "29511"},
        {"TORCHELASTIC_RESTART_COUNT", "2"},
        {"TORCHELASTIC_MAX_RESTARTS", "3"},
        {"TORCHELASTIC_RUN_ID", "job7"},
        {"TORCHELASTIC_USE_AGENT_STORE", "False"},
        {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
        {"TORCHELASTIC_ERROR_FILE", "/logs/attempt_2/1/error.json"},
        /* inherited from the agent */
        {"PATH", "/usr/bin"},
        {"OMP_NUM_THREADS", "1"},
        {"HOME", "/root"},
        {"CUDA_VISIBLE_DEVICES", "2,3"},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const char *v = agent_env_get(e, want[i].k);
        if (v == NULL || strcmp(v, want[i].v) != 0)
            fail_msg("%s: want '%s', got '%s'", want[i].k, want[i].v, v ? v : "(unset)");
        assert_int_equal(count_key(e, want[i].k), 1); /* replaced, never duplicated */
    }
    /* exactly the base minus the 2 overridden keys, plus 17 variables */
    int n = 0;
    while (e[n])
        n++;
    assert_int_equal(n, 7 - 2 + 17);
    assert_null(agent_env_get(e, "WEIRD_NO_EQUALS")); /* passed through, but not a variable */
    agent_env_free(&env);
    assert_null(env.envp);
}

static void test_env_nccl_kept_and_store(void **state)
{
    (void)state;
    char *base[] = {(char *)"TORCH_NCCL_ASYNC_ERROR_HANDLING=3", NULL};
    struct agent_env_spec s = spec_for(0);
    s.use_agent_store = true;
    s.error_file = "";
    struct agent_env env;
    assert_int_equal(agent_env_build(base, &s, &env), 0);
    assert_string_equal(agent_env_get(env.envp, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "3");
    assert_int_equal(count_key(env.envp, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), 1);
    assert_string_equal(agent_env_get(env.envp, "TORCHELASTIC_USE_AGENT_STORE"), "True");
    assert_string_equal(agent_env_get(env.envp, "TORCHELASTIC_ERROR_FILE"), "");
    assert_null(agent_env_get(env.envp, "OMP_NUM_THREADS")); /* only inherited, never invented */
    agent_env_free(&env);
}

static void test_env_rdzv_round(void **state)
{
    (void)state;
    /* cddp's own variable, after torchrun's; an inherited one is replaced. */
    char *base[] = {(char *)"CDDP_RDZV_ROUND=1", (char *)"A=1", NULL};
    struct agent_env_spec s = spec_for(0);
    s.rdzv_round = 12;
    struct agent_env env;
    assert_int_equal(agent_env_build(base, &s, &env), 0);
    assert_string_equal(agent_env_get(env.envp, "CDDP_RDZV_ROUND"), "12");
    assert_int_equal(count_key(env.envp, "CDDP_RDZV_ROUND"), 1);
    int n = 0;
    while (env.envp[n])
        n++;
    assert_int_equal(n, 2 - 1 + 17 + 1);
    agent_env_free(&env);
    /* Unknown (0): not set, and the agent's own passes through. */
    s.rdzv_round = 0;
    assert_int_equal(agent_env_build(base, &s, &env), 0);
    assert_string_equal(agent_env_get(env.envp, "CDDP_RDZV_ROUND"), "1");
    agent_env_free(&env);
}

static void test_env_extras(void **state)
{
    (void)state;
    char *base[] = {(char *)"CDDP_PROGRESS_FD=9", (char *)"A=1", NULL};
    struct launch_kv extra[] = {{"CDDP_PROGRESS_FD", "3"}, {"CDDP_X", "y"}};
    struct agent_env_spec s = spec_for(3);
    s.extra = extra;
    s.nextra = 2;
    struct agent_env env;
    assert_int_equal(agent_env_build(base, &s, &env), 0);
    assert_string_equal(agent_env_get(env.envp, "CDDP_PROGRESS_FD"), "3");
    assert_int_equal(count_key(env.envp, "CDDP_PROGRESS_FD"), 1);
    assert_string_equal(agent_env_get(env.envp, "CDDP_X"), "y");
    assert_string_equal(agent_env_get(env.envp, "A"), "1");
    assert_string_equal(agent_env_get(env.envp, "RANK"), "7");
    /* a key that is a prefix of another is not confused with it */
    assert_null(agent_env_get(env.envp, "CDDP"));
    agent_env_free(&env);
}

/* The automatic progress' folder goes first on PYTHONPATH, the agent's
 * own entries after it; without one, PYTHONPATH is inherited untouched. */
static void test_env_pythonpath_first(void **state)
{
    (void)state;
    char *base[] = {(char *)"PYTHONPATH=/a:/b", (char *)"A=1", NULL};
    struct agent_env_spec s = spec_for(0);
    s.pythonpath_first = "/usr/share/cddp/autoprogress";
    struct agent_env env;
    assert_int_equal(agent_env_build(base, &s, &env), 0);
    assert_string_equal(agent_env_get(env.envp, "PYTHONPATH"),
                        "/usr/share/cddp/autoprogress:/a:/b");
    assert_int_equal(count_key(env.envp, "PYTHONPATH"), 1);
    assert_string_equal(agent_env_get(env.envp, "A"), "1");
    agent_env_free(&env);
    /* Unset or empty in the agent: the folder alone (an empty entry would
     * put the working directory on sys.path). */
    char *none[] = {(char *)"A=1", NULL};
    assert_int_equal(agent_env_build(none, &s, &env), 0);
    assert_string_equal(agent_env_get(env.envp, "PYTHONPATH"), "/usr/share/cddp/autoprogress");
    agent_env_free(&env);
    char *empty[] = {(char *)"PYTHONPATH=", NULL};
    assert_int_equal(agent_env_build(empty, &s, &env), 0);
    assert_string_equal(agent_env_get(env.envp, "PYTHONPATH"), "/usr/share/cddp/autoprogress");
    assert_int_equal(count_key(env.envp, "PYTHONPATH"), 1);
    agent_env_free(&env);
    s.pythonpath_first = NULL;
    assert_int_equal(agent_env_build(base, &s, &env), 0);
    assert_string_equal(agent_env_get(env.envp, "PYTHONPATH"), "/a:/b");
    agent_env_free(&env);
}

/* --virtual_local_rank (torchrun's _set_local_rank_env): LOCAL_RANK=0 and
 * the local rank's own entry of the agent's CUDA_VISIBLE_DEVICES. */
static void test_env_virtual_local_rank(void **state)
{
    (void)state;
    char *base[] = {(char *)"CUDA_VISIBLE_DEVICES=4, 6 ,GPU-abc,7", (char *)"A=1", NULL};
    struct agent_env env;
    const char *want[] = {"4", "6", "GPU-abc", "7"};
    for (int lr = 0; lr < 4; lr++) {
        struct agent_env_spec s = spec_for(lr);
        s.virtual_local_rank = true;
        assert_int_equal(agent_env_build(base, &s, &env), 0);
        assert_string_equal(agent_env_get(env.envp, "LOCAL_RANK"), "0");
        assert_int_equal((int)strtol(agent_env_get(env.envp, "RANK"), NULL, 10), 4 + lr);
        assert_string_equal(agent_env_get(env.envp, "CUDA_VISIBLE_DEVICES"), want[lr]);
        assert_int_equal(count_key(env.envp, "CUDA_VISIBLE_DEVICES"), 1);
        assert_string_equal(agent_env_get(env.envp, "A"), "1");
        agent_env_free(&env);
    }
    /* no list in the agent: the local rank itself */
    char *bare[] = {(char *)"A=1", NULL};
    struct agent_env_spec s = spec_for(2);
    s.virtual_local_rank = true;
    assert_int_equal(agent_env_build(bare, &s, &env), 0);
    assert_string_equal(agent_env_get(env.envp, "CUDA_VISIBLE_DEVICES"), "2");
    agent_env_free(&env);
    /* too short a list: refused */
    char *shortl[] = {(char *)"CUDA_VISIBLE_DEVICES=1", NULL};
    s = spec_for(1);
    s.virtual_local_rank = true;
    assert_int_equal(agent_env_build(shortl, &s, &env), CDDP_ERANGE_ARG);
    /* off: inherited unchanged */
    s.virtual_local_rank = false;
    assert_int_equal(agent_env_build(shortl, &s, &env), 0);
    assert_string_equal(agent_env_get(env.envp, "CUDA_VISIBLE_DEVICES"), "1");
    assert_string_equal(agent_env_get(env.envp, "LOCAL_RANK"), "1");
    agent_env_free(&env);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ranks_single_node),       cmocka_unit_test(test_ranks_multi_node),
        cmocka_unit_test(test_ranks_invalid),           cmocka_unit_test(test_env_values),
        cmocka_unit_test(test_env_nccl_kept_and_store), cmocka_unit_test(test_env_extras),
        cmocka_unit_test(test_env_virtual_local_rank),  cmocka_unit_test(test_env_rdzv_round),
        cmocka_unit_test(test_env_pythonpath_first),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
