/*
 * Unit tests for trainer/device.c (--device, CDDP_DEVICE): every case of
 * the decision, including the ones a machine without a GPU cannot reach
 * through the real binary (a visible device; LOCAL_RANK picking it).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "trainer/device.h"

static char err[512];

static void test_parse(void **state)
{
    (void)state;
    int req = -1;
    assert_int_equal(trn_device_parse("--device", "auto", &req, err, sizeof(err)), 0);
    assert_int_equal(req, TRN_DEVICE_REQ_AUTO);
    assert_int_equal(trn_device_parse("--device", "cpu", &req, err, sizeof(err)), 0);
    assert_int_equal(req, TRN_DEVICE_REQ_CPU);
    assert_int_equal(trn_device_parse("--device", "cuda", &req, err, sizeof(err)), 0);
    assert_int_equal(req, TRN_DEVICE_REQ_CUDA);
    assert_int_equal(trn_device_parse("CDDP_DEVICE", "cuda:0", &req, err, sizeof(err)), -1);
    assert_string_equal(err, "CDDP_DEVICE: 'cuda:0' is not auto, cpu or cuda");
    assert_int_equal(trn_device_parse("--device", "", &req, err, sizeof(err)), -1);
    assert_int_equal(trn_device_parse("--device", "CPU", &req, err, sizeof(err)), -1);
}

static void test_auto(void **state)
{
    (void)state;
    struct trn_device_choice c;
    /* a GPU: cuda:LOCAL_RANK */
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_AUTO, true, 2, 1, 1, &c, err, sizeof(err)),
                     0);
    assert_int_equal(c.device, TRN_DEVICE_CUDA);
    assert_int_equal(c.ordinal, 1);
    assert_string_equal(c.note, "");
    /* no GPU, no CUDA build, LOCAL_RANK beyond, several ranks: the CPU, saying why */
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_AUTO, true, 0, 1, 0, &c, err, sizeof(err)),
                     0);
    assert_int_equal(c.device, TRN_DEVICE_CPU);
    assert_string_equal(c.note, "no CUDA device is visible");
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_AUTO, false, 4, 1, 0, &c, err, sizeof(err)),
                     0);
    assert_int_equal(c.device, TRN_DEVICE_CPU);
    assert_non_null(strstr(c.note, "built without CUDA"));
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_AUTO, true, 1, 1, 3, &c, err, sizeof(err)),
                     0);
    assert_int_equal(c.device, TRN_DEVICE_CPU);
    assert_string_equal(c.note, "LOCAL_RANK 3, but 1 CUDA device(s) are visible");
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_AUTO, true, 8, 8, 0, &c, err, sizeof(err)),
                     0);
    assert_int_equal(c.device, TRN_DEVICE_CPU);
    assert_non_null(strstr(c.note, "NCCL"));
}

static void test_explicit(void **state)
{
    (void)state;
    struct trn_device_choice c;
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_CPU, true, 8, 1, 0, &c, err, sizeof(err)), 0);
    assert_int_equal(c.device, TRN_DEVICE_CPU);
    assert_string_equal(c.note, "");
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_CUDA, true, 1, 1, 0, &c, err, sizeof(err)),
                     0);
    assert_int_equal(c.device, TRN_DEVICE_CUDA);
    assert_int_equal(c.ordinal, 0);
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_CUDA, true, 0, 1, 0, &c, err, sizeof(err)),
                     -1);
    assert_string_equal(err, "--device cuda: no CUDA device is visible");
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_CUDA, false, 1, 1, 0, &c, err, sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "--device cuda: this cddp-train was built without CUDA"));
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_CUDA, true, 2, 1, 2, &c, err, sizeof(err)),
                     -1);
    assert_string_equal(err, "--device cuda: LOCAL_RANK 2, but 2 CUDA device(s) are visible");
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_CUDA, true, 2, 2, 0, &c, err, sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "NCCL"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_auto),
        cmocka_unit_test(test_explicit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
