/*
 * Unit tests for agent/numa.c over a sysfs tree made here: three NUMA nodes
 * (0 and 1 on socket 0, 2 on socket 1), two hardware threads per core,
 * node 0 with two last-level caches, four GPUs (two on node 0, one on each
 * other node). Every mode's CPUs and memory nodes as torch/numa/binding.py
 * computes them, CUDA_VISIBLE_DEVICES renumbering, the agent's own
 * affinity narrowing the CPUs, a machine with one node (nothing to bind),
 * and the refusals.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/numa.h"

static char root[256];

static void put(const char *path, const char *text)
{
    char full[1024];
    snprintf(full, sizeof(full), "%s%s", root, path);
    for (char *p = full + strlen(root) + 1; *p; p++) {
        if (*p == '/') {
            *p = '\0';
            mkdir(full, 0755);
            *p = '/';
        }
    }
    FILE *f = fopen(full, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void cpu(int c, const char *siblings, const char *llc, int package)
{
    char p[256], v[32];
    snprintf(p, sizeof(p), "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
    put(p, siblings);
    snprintf(p, sizeof(p), "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", c);
    snprintf(v, sizeof(v), "%d\n", package);
    put(p, v);
    snprintf(p, sizeof(p), "/sys/devices/system/cpu/cpu%d/cache/index0/type", c);
    put(p, "Data\n");
    snprintf(p, sizeof(p), "/sys/devices/system/cpu/cpu%d/cache/index0/level", c);
    put(p, "1\n");
    snprintf(p, sizeof(p), "/sys/devices/system/cpu/cpu%d/cache/index0/shared_cpu_list", c);
    put(p, siblings);
    snprintf(p, sizeof(p), "/sys/devices/system/cpu/cpu%d/cache/index1/type", c);
    put(p, "Instruction\n");
    snprintf(p, sizeof(p), "/sys/devices/system/cpu/cpu%d/cache/index1/level", c);
    put(p, "4\n"); /* an instruction cache never counts, whatever its level */
    snprintf(p, sizeof(p), "/sys/devices/system/cpu/cpu%d/cache/index1/shared_cpu_list", c);
    put(p, "0-11\n");
    snprintf(p, sizeof(p), "/sys/devices/system/cpu/cpu%d/cache/index3/type", c);
    put(p, "Unified\n");
    snprintf(p, sizeof(p), "/sys/devices/system/cpu/cpu%d/cache/index3/level", c);
    put(p, "3\n");
    snprintf(p, sizeof(p), "/sys/devices/system/cpu/cpu%d/cache/index3/shared_cpu_list", c);
    put(p, llc);
}

static void gpu(const char *addr, const char *node)
{
    char p[256];
    snprintf(p, sizeof(p), "/proc/driver/nvidia/gpus/%s/information", addr);
    put(p, "Model: test\n");
    snprintf(p, sizeof(p), "/sys/bus/pci/devices/%s/numa_node", addr);
    put(p, node);
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int setup(void **state)
{
    (void)state;
    snprintf(root, sizeof(root), "/tmp/cddp-numa-XXXXXX");
    assert_non_null(mkdtemp(root));
    put("/sys/devices/system/node/online", "0-2\n");
    put("/sys/devices/system/node/node0/cpulist", "0-3\n");
    put("/sys/devices/system/node/node1/cpulist", "4-7\n");
    put("/sys/devices/system/node/node2/cpulist", "8-11\n");
    const char *sib[] = {"0-1", "0-1", "2-3", "2-3", "4-5",   "4-5",
                         "6-7", "6-7", "8-9", "8-9", "10-11", "10-11"};
    const char *llc[] = {"0-1", "0-1", "2-3",  "2-3",  "4-7",  "4-7",
                         "4-7", "4-7", "8-11", "8-11", "8-11", "8-11"};
    for (int c = 0; c < 12; c++)
        cpu(c, sib[c], llc[c], c < 8 ? 0 : 1);
    /* Directory order is not PCI order: made out of order on purpose. */
    gpu("0000:81:00.0", "1\n");
    gpu("0000:01:00.0", "0\n");
    gpu("0000:c1:00.0", "2\n");
    gpu("0000:02:00.0", "0\n");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

static cpu_set_t all_cpus(void)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    for (int c = 0; c < 12; c++)
        CPU_SET(c, &s);
    return s;
}

static void expect(const char *mode, int gpu_index, const char *cvd, const char *cpus,
                   const char *nodes, int node)
{
    cpu_set_t allowed = all_cpus();
    struct agent_numa_plan plan;
    char why[512];
    int rc = agent_numa_plan(root, mode, gpu_index, cvd, &allowed, &plan, why, sizeof(why));
    if (rc != 0)
        fail_msg("%s gpu %d: %s", mode, gpu_index, why);
    assert_true(plan.bind);
    assert_int_equal(plan.node, node);
    if (strcmp(plan.cpulist, cpus) != 0 || strcmp(plan.nodelist, nodes) != 0)
        fail_msg("%s gpu %d: cpus %s nodes %s, expected %s and %s", mode, gpu_index, plan.cpulist,
                 plan.nodelist, cpus, nodes);
    assert_non_null(strstr(why, cpus));
}

/* mode, GPU (CUDA's index), CUDA_VISIBLE_DEVICES, CPUs, memory nodes, GPU's node */
static const struct {
    const char *mode;
    int gpu;
    const char *cvd, *cpus, *nodes;
    int node;
} cases[] = {
    {"node", 0, NULL, "0-3", "0", 0},
    {"node", 1, NULL, "0-3", "0", 0},
    {"node", 2, NULL, "4-7", "1", 1},
    {"node", 3, NULL, "8-11", "2", 2},
    /* every node of the GPU's socket */
    {"socket", 0, NULL, "0-7", "0-1", 0},
    {"socket", 2, NULL, "0-7", "0-1", 1},
    {"socket", 3, NULL, "8-11", "2", 2},
    /* node 0: two cores for two GPUs, one each, both threads of a core;
     * alone on its node: all of it */
    {"exclusive", 0, NULL, "0-1", "0", 0},
    {"exclusive", 1, NULL, "2-3", "0", 0},
    {"exclusive", 2, NULL, "4-7", "1", 1},
    /* one last-level cache each while there are enough */
    {"core-complex", 0, NULL, "0-1", "0", 0},
    {"core-complex", 1, NULL, "2-3", "0", 0},
    {"core-complex", 2, NULL, "4-7", "1", 1},
    /* CUDA's device 0 is the third GPU in PCI order */
    {"node", 0, "2,0", "4-7", "1", 1},
    {"node", 1, " 2, 0", "0-3", "0", 0},
    /* exclusive among the visible GPUs only: GPU 1 is no longer there */
    {"exclusive", 0, "0", "0-3", "0", 0},
};

static void test_modes(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        expect(cases[i].mode, cases[i].gpu, cases[i].cvd, cases[i].cpus, cases[i].nodes,
               cases[i].node);
}

static void test_allowed_narrows(void **state)
{
    (void)state;
    cpu_set_t allowed = all_cpus();
    CPU_CLR(0, &allowed);
    struct agent_numa_plan plan;
    char why[512];
    assert_int_equal(agent_numa_plan(root, "node", 0, NULL, &allowed, &plan, why, sizeof(why)), 0);
    assert_string_equal(plan.cpulist, "1-3");
    CPU_ZERO(&allowed);
    CPU_SET(9, &allowed);
    assert_true(agent_numa_plan(root, "node", 0, NULL, &allowed, &plan, why, sizeof(why)) < 0);
    assert_non_null(strstr(why, "no CPU"));
}

static void test_refusals(void **state)
{
    (void)state;
    cpu_set_t allowed = all_cpus();
    struct agent_numa_plan plan;
    char why[512];
    assert_true(agent_numa_plan(root, "node", 4, NULL, &allowed, &plan, why, sizeof(why)) < 0);
    assert_non_null(strstr(why, "local rank 4"));
    assert_true(agent_numa_plan(root, "node", 1, "0", &allowed, &plan, why, sizeof(why)) < 0);
    assert_true(
        agent_numa_plan(root, "node", 0, "GPU-1234-abcd", &allowed, &plan, why, sizeof(why)) < 0);
    assert_non_null(strstr(why, "GPU-1234-abcd"));
    assert_true(agent_numa_plan(root, "nearby", 0, NULL, &allowed, &plan, why, sizeof(why)) < 0);
}

static void test_one_node(void **state)
{
    (void)state;
    put("/sys/devices/system/node/online", "0\n");
    cpu_set_t allowed = all_cpus();
    struct agent_numa_plan plan;
    char why[512];
    /* no GPU needed: there is nothing to choose between */
    assert_int_equal(agent_numa_plan(root, "socket", 7, NULL, &allowed, &plan, why, sizeof(why)),
                     0);
    assert_false(plan.bind);
    assert_non_null(strstr(why, "one NUMA node"));
    put("/sys/devices/system/node/online", "0-2\n");
}

static void test_lists(void **state)
{
    (void)state;
    cpu_set_t s;
    char out[64];
    assert_int_equal(agent_numa_parse_list("0-3,8,10-11\n", &s), 0);
    assert_int_equal(CPU_COUNT(&s), 7);
    agent_numa_format_list(&s, out, sizeof(out));
    assert_string_equal(out, "0-3,8,10-11");
    assert_int_equal(agent_numa_parse_list("", &s), 0);
    assert_int_equal(CPU_COUNT(&s), 0);
    assert_true(agent_numa_parse_list("3-1", &s) < 0);
    assert_true(agent_numa_parse_list("1,x", &s) < 0);
    assert_true(agent_numa_parse_list("-1", &s) < 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_modes),    cmocka_unit_test(test_allowed_narrows),
        cmocka_unit_test(test_refusals), cmocka_unit_test(test_one_node),
        cmocka_unit_test(test_lists),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
