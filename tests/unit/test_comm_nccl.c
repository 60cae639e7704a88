/*
 * Unit tests for trainer/comm/nccl.c that need no GPU (built when CUDA and
 * NCCL are): a communicator that cannot start fails with one line naming
 * the call and where (never a crash or a hang), and world size 1 on the
 * device stays "local" but says its buffers are device memory. The
 * collectives themselves, the watchdog's timeout and a peer's crash run on
 * a GPU: tests/unit/test_comm_nccl_gpu.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/errors.h"
#include "trainer/comm/comm.h"

static int no_set(struct trn_kv *kv, const char *key, const void *val, size_t len)
{
    (void)val, (void)len;
    snprintf(kv->err, sizeof(kv->err), "set '%s' refused by the test", key);
    return CDDP_ESTATE;
}

static int no_get(struct trn_kv *kv, const char *key, double timeout_s, void **val, size_t *len)
{
    (void)timeout_s, (void)val, (void)len;
    snprintf(kv->err, sizeof(kv->err), "key '%s' never set (test)", key);
    return CDDP_ETIMEOUT;
}

static int no_add(struct trn_kv *kv, const char *key, long delta, long *out)
{
    (void)kv, (void)key, (void)delta, (void)out;
    return CDDP_ESTATE;
}

static const struct trn_kv_ops no_ops = {no_set, no_get, no_add};

static void test_bad_device_is_one_line(void **state)
{
    (void)state;
    struct trn_kv kv = {.ops = &no_ops};
    /* No such device here or on any machine: the first call fails. */
    struct trn_comm_options o = {
        .rank = 1, .world = 2, .init_timeout_s = 2, .backend = "nccl", .cuda_device = 4096};
    struct trn_comm *c = (struct trn_comm *)&kv; /* overwritten with NULL */
    struct trn_comm_error err;
    int rc = trn_comm_create(&o, &kv, &c, &err);
    assert_true(rc < 0);
    assert_null(c);
    assert_string_equal(err.op, "connect");
    assert_non_null(strstr(err.detail, "nccl.c:"));
    assert_non_null(strstr(err.detail, "cudaSetDevice"));
    assert_null(strchr(err.detail, '\n'));
    print_message("%s\n", err.detail);
}

static void test_world1_on_device(void **state)
{
    (void)state;
    struct trn_comm_options o = {.rank = 0, .world = 1, .backend = "nccl"};
    struct trn_comm *c = NULL;
    struct trn_comm_error err;
    assert_int_equal(trn_comm_create(&o, NULL, &c, &err), 0);
    assert_string_equal(trn_comm_backend(c), "local");
    assert_true(trn_comm_on_device(c));
    /* Nothing to move: no CUDA call, so these work without a GPU. */
    float x = 1.0f;
    assert_int_equal(trn_comm_allreduce(c, &x, 1, TRN_COMM_F32, TRN_COMM_AVG), 0);
    assert_int_equal(trn_comm_barrier(c), 0);
    trn_comm_set_step(c, 3);
    struct trn_comm_work w;
    assert_int_equal(trn_comm_allreduce_start_bucket(c, &w, &x, 1, TRN_COMM_F32, TRN_COMM_SUM, 2),
                     0);
    assert_int_equal(w.bucket, 2);
    assert_int_equal(w.step, 3);
    assert_int_equal(trn_comm_wait(c, &w), 0);
    trn_comm_destroy(c);

    /* gloo's world 1 is host memory. */
    o.backend = "gloo";
    assert_int_equal(trn_comm_create(&o, NULL, &c, &err), 0);
    assert_false(trn_comm_on_device(c));
    trn_comm_destroy(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_device_is_one_line),
        cmocka_unit_test(test_world1_on_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
