/*
 * The CPU backend (2 threads) as a cmocka group fixture, shared by the ops
 * and model tests: `be` is set up before the group's first test and freed
 * after its last.
 *
 *     return cmocka_run_group_tests(tests, cpu_backend_setup, cpu_backend_teardown);
 */
#ifndef CDDP_TESTS_CPU_BACKEND_FIXTURE_H
#define CDDP_TESTS_CPU_BACKEND_FIXTURE_H

#include "trainer/ops/ops.h"

static struct trn_backend be;

static int cpu_backend_setup(void **state)
{
    (void)state;
    char err[256];
    return trn_backend_cpu_init(&be, 2, err, sizeof(err));
}

static int cpu_backend_teardown(void **state)
{
    (void)state;
    trn_backend_cpu_free(&be);
    return 0;
}

#endif
