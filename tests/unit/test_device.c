/*
 * Unit tests for trainer/device.c (--device, CDDP_DEVICE): every case of
 * the decision, including the ones a machine without a GPU cannot reach
 * through the real binary (a visible device; LOCAL_RANK picking it).
 *
 * And the model's host copies on a device backend (resnet.h's
 * trn_resnet_pull/push, the state and momentum tables over them), which
 * only a GPU run would otherwise reach: here the CPU backend is dressed up
 * as a device one (its device field says CUDA; its memory is still host
 * memory, so what sits on "the device" can be looked at directly).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "trainer/device.h"
#include "trainer/resnet.h"
#include "trainer/resume.h"

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
    assert_int_equal(trn_device_parse("CDDP_DEVICE", "cuda:0", &req, err, sizeof(err)), 0);
    assert_int_equal(req, TRN_DEVICE_REQ_CUDA_AT);
    assert_int_equal(trn_device_parse("--device", "cuda:7", &req, err, sizeof(err)), 0);
    assert_int_equal(req, TRN_DEVICE_REQ_CUDA_AT + 7);
    static const char *const bad[] = {"cuda:",
                                      "cuda:x",
                                      "cuda:-1",
                                      "cuda:1024",
                                      "cuda:1a",
                                      "cuda: 1",
                                      "cuda:99999999999999999999"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(trn_device_parse("CDDP_DEVICE", bad[i], &req, err, sizeof(err)), -1);
    assert_string_equal(err, "CDDP_DEVICE: 'cuda:99999999999999999999' is not auto, cpu, cuda or "
                             "cuda:N");
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
    assert_false(c.gpu_unused);
    /* no GPU, no CUDA build, LOCAL_RANK beyond, several ranks: the CPU, saying why */
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_AUTO, true, 0, 1, 0, &c, err, sizeof(err)),
                     0);
    assert_int_equal(c.device, TRN_DEVICE_CPU);
    assert_string_equal(c.note, "no CUDA device is visible");
    assert_false(c.gpu_unused);
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_AUTO, false, 4, 1, 0, &c, err, sizeof(err)),
                     0);
    assert_int_equal(c.device, TRN_DEVICE_CPU);
    assert_non_null(strstr(c.note, "built without CUDA"));
    assert_false(c.gpu_unused);
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_AUTO, true, 1, 1, 3, &c, err, sizeof(err)),
                     0);
    assert_int_equal(c.device, TRN_DEVICE_CPU);
    assert_string_equal(c.note, "LOCAL_RANK 3, but 1 CUDA device(s) are visible");
    assert_true(c.gpu_unused);
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_AUTO, true, 8, 8, 0, &c, err, sizeof(err)),
                     0);
    assert_int_equal(c.device, TRN_DEVICE_CPU);
    assert_non_null(strstr(c.note, "NCCL"));
    assert_true(c.gpu_unused); /* a GPU node running 8 ranks on the CPU: a warning */
    /* a driver that cannot count its devices: the CPU, loudly, and not "no GPU" */
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_AUTO, true, -1, 1, 0, &c, err, sizeof(err)),
                     0);
    assert_int_equal(c.device, TRN_DEVICE_CPU);
    assert_non_null(strstr(c.note, "driver problem, not a missing GPU"));
    assert_true(c.gpu_unused);
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
    assert_int_equal(trn_device_choose(TRN_DEVICE_REQ_CUDA, true, -1, 1, 0, &c, err, sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "--device cuda: the CUDA driver or runtime failed"));
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

/* --backend with the device: auto is nccl on CUDA and gloo on the CPU;
 * several CUDA ranks need NCCL in the build and a backend other than gloo. */
static void test_backend(void **state)
{
    (void)state;
    struct trn_device_choice c;
    enum { A = TRN_COMM_REQ_AUTO, G = TRN_COMM_REQ_GLOO, N = TRN_COMM_REQ_NCCL };
    /* one CUDA rank: the name follows the request (the comm is local anyway) */
    assert_int_equal(
        trn_device_choose_dist(TRN_DEVICE_REQ_AUTO, A, true, false, 1, 1, 0, &c, err, sizeof(err)),
        0);
    assert_int_equal(c.device, TRN_DEVICE_CUDA);
    assert_string_equal(c.comm, "nccl");
    assert_int_equal(
        trn_device_choose_dist(TRN_DEVICE_REQ_CUDA, G, true, false, 1, 1, 0, &c, err, sizeof(err)),
        0);
    assert_string_equal(c.comm, "gloo");
    /* several CUDA ranks with NCCL: nccl, for auto and nccl; GPU LOCAL_RANK */
    for (int b = A; b <= N; b += N - A) {
        assert_int_equal(trn_device_choose_dist(TRN_DEVICE_REQ_AUTO, b, true, true, 8, 16, 3, &c,
                                                err, sizeof(err)),
                         0);
        assert_int_equal(c.device, TRN_DEVICE_CUDA);
        assert_int_equal(c.ordinal, 3);
        assert_string_equal(c.comm, "nccl");
        assert_string_equal(c.note, "");
    }
    /* cuda:N: device N whatever LOCAL_RANK is (two ranks on one GPU) */
    assert_int_equal(trn_device_choose_dist(TRN_DEVICE_REQ_CUDA_AT + 0, A, true, true, 1, 2, 1, &c,
                                            err, sizeof(err)),
                     0);
    assert_int_equal(c.device, TRN_DEVICE_CUDA);
    assert_int_equal(c.ordinal, 0);
    assert_string_equal(c.comm, "nccl");
    assert_int_equal(trn_device_choose_dist(TRN_DEVICE_REQ_CUDA_AT + 2, A, true, true, 2, 1, 0, &c,
                                            err, sizeof(err)),
                     -1);
    assert_string_equal(err, "--device cuda:2: device 2, but 2 CUDA device(s) are visible");
    assert_int_equal(trn_device_choose_dist(TRN_DEVICE_REQ_CUDA_AT + 1, A, false, false, 0, 1, 0,
                                            &c, err, sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "--device cuda:1: this cddp-train was built without CUDA"));
    /* ... gloo: --device cuda refused with the reason, auto falls back saying it */
    assert_int_equal(
        trn_device_choose_dist(TRN_DEVICE_REQ_CUDA, G, true, true, 2, 2, 0, &c, err, sizeof(err)),
        -1);
    assert_string_equal(err, "--device cuda: 2 ranks with --backend gloo: gloo reduces host "
                             "memory, so DDP between GPUs needs --backend nccl (or auto)");
    assert_int_equal(
        trn_device_choose_dist(TRN_DEVICE_REQ_AUTO, G, true, true, 2, 2, 0, &c, err, sizeof(err)),
        0);
    assert_int_equal(c.device, TRN_DEVICE_CPU);
    assert_string_equal(c.comm, "gloo");
    assert_non_null(strstr(c.note, "--backend gloo"));
    assert_true(c.gpu_unused);
    /* ... no NCCL in the build: refused / the CPU */
    assert_int_equal(
        trn_device_choose_dist(TRN_DEVICE_REQ_CUDA, A, true, false, 2, 2, 1, &c, err, sizeof(err)),
        -1);
    assert_non_null(strstr(err, "needs the NCCL communicator"));
    assert_int_equal(
        trn_device_choose_dist(TRN_DEVICE_REQ_AUTO, A, true, false, 2, 2, 1, &c, err, sizeof(err)),
        0);
    assert_int_equal(c.device, TRN_DEVICE_CPU);
    assert_string_equal(c.comm, "gloo");
    /* nccl on the CPU: refused, whichever way the CPU was reached */
    assert_int_equal(
        trn_device_choose_dist(TRN_DEVICE_REQ_CPU, N, true, true, 2, 1, 0, &c, err, sizeof(err)),
        -1);
    assert_string_equal(err, "--backend nccl: NCCL reduces CUDA device memory, and this rank "
                             "computes on the CPU (--device cpu); use --backend gloo or auto");
    assert_int_equal(
        trn_device_choose_dist(TRN_DEVICE_REQ_AUTO, N, true, true, 0, 2, 0, &c, err, sizeof(err)),
        -1);
    assert_non_null(strstr(err, "(no CUDA device is visible)"));
    assert_int_equal(
        trn_device_choose_dist(TRN_DEVICE_REQ_AUTO, N, false, false, 0, 1, 0, &c, err, sizeof(err)),
        -1);
    assert_non_null(strstr(err, "built without CUDA"));
    /* --device cpu with auto or gloo: gloo, no note */
    assert_int_equal(
        trn_device_choose_dist(TRN_DEVICE_REQ_CPU, A, true, true, 2, 2, 0, &c, err, sizeof(err)),
        0);
    assert_string_equal(c.comm, "gloo");
    assert_string_equal(c.note, "");
}

static void test_grad_reduce(void **state)
{
    (void)state;
    struct trn_device_choice c;
    assert_int_equal(trn_device_choose_dist(TRN_DEVICE_REQ_CPU, TRN_COMM_REQ_AUTO, true, true, 1, 2,
                                            0, &c, err, sizeof(err)),
                     0);
    assert_int_equal(trn_grad_reduce_check(TRN_GRAD_REDUCE_FP32, &c, err, sizeof(err)), 0);
    assert_int_equal(trn_grad_reduce_check(TRN_GRAD_REDUCE_BF16, &c, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "--grad-reduce-dtype bf16: gradient compression needs --device "
                                "cuda"));
    assert_int_equal(trn_device_choose_dist(TRN_DEVICE_REQ_CUDA, TRN_COMM_REQ_GLOO, true, true, 1,
                                            1, 0, &c, err, sizeof(err)),
                     0);
    assert_int_equal(trn_grad_reduce_check(TRN_GRAD_REDUCE_BF16, &c, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "gloo has no bf16"));
    assert_int_equal(trn_device_choose_dist(TRN_DEVICE_REQ_CUDA, TRN_COMM_REQ_AUTO, true, true, 1,
                                            4, 0, &c, err, sizeof(err)),
                     0);
    assert_int_equal(trn_grad_reduce_check(TRN_GRAD_REDUCE_BF16, &c, err, sizeof(err)), 0);
    assert_string_equal(trn_comm_req_names[TRN_COMM_REQ_NCCL], "nccl");
    assert_string_equal(trn_grad_reduce_names[TRN_GRAD_REDUCE_BF16], "bf16");
}

static void test_host_copies_on_a_device_backend(void **state)
{
    (void)state;
    struct trn_backend be;
    assert_int_equal(trn_backend_cpu_init(&be, 1, err, sizeof(err)), 0);
    be.device = TRN_DEVICE_CUDA; /* resnet.c keeps host copies for a device backend */
    struct trn_resnet m;
    assert_int_equal(trn_resnet_create(&m, &be, trn_arch_find("resnet18"), 10, err, sizeof(err)),
                     0);
    assert_non_null(m.host_params);
    assert_non_null(m.host_buffers);
    assert_non_null(m.host_momentum);
    trn_resnet_init(&m, 7, false);
    size_t pb = m.num_params * sizeof(float), bb = m.num_buffers * sizeof(float);
    assert_memory_not_equal(m.host_params, m.params, pb); /* not pulled yet: zeros */
    trn_resnet_pull(&m);
    assert_memory_equal(m.host_params, m.params, pb);
    assert_memory_equal(m.host_buffers, m.buffers, bb);

    /* the state_dict and momentum tables see the host copies, not the device */
    struct trn_ckpt_tensor *t = trn_state_table(&m);
    for (size_t i = 0; i < m.n_state; i++) {
        const struct trn_state_entry *e = &m.state[i];
        if (e->kind == TRN_STATE_PARAM)
            assert_ptr_equal(t[i].data, m.host_params + e->off);
        else if (e->kind == TRN_STATE_BUFFER)
            assert_ptr_equal(t[i].data, m.host_buffers + e->off);
        else
            assert_ptr_equal(t[i].data, &m.num_batches_tracked[e->off]);
    }
    struct trn_config cfg;
    trn_flags_defaults(&cfg);
    struct trn_resume k;
    trn_resume_init(&k, &cfg, &m, t, NULL, NULL);
    assert_true(k.n_mom > 0);
    for (size_t i = 0; i < k.n_mom; i++) {
        float *p = k.momentum[i].data;
        assert_true(p >= m.host_momentum && p < m.host_momentum + m.num_params);
    }

    /* what --init or a checkpoint writes to the host copies reaches the
     * device on push; what the device computes reaches them on pull */
    for (size_t i = 0; i < m.num_params; i++) {
        m.host_params[i] = 0.5f;
        m.host_momentum[i] = -0.25f;
    }
    for (size_t i = 0; i < m.num_buffers; i++)
        m.host_buffers[i] = 2.0f;
    trn_resnet_push(&m);
    for (size_t i = 0; i < m.num_params; i++)
        assert_true(m.params[i] == 0.5f && m.momentum[i] == -0.25f);
    for (size_t i = 0; i < m.num_buffers; i++)
        assert_true(m.buffers[i] == 2.0f);
    m.params[3] = 9.0f;
    m.momentum[4] = 8.0f;
    m.buffers[5] = 7.0f;
    trn_resnet_pull(&m);
    assert_true(m.host_params[3] == 9.0f && m.host_momentum[4] == 8.0f &&
                m.host_buffers[5] == 7.0f);
    assert_ptr_equal(trn_resnet_host_momentum(&m), m.host_momentum);

    trn_resume_free(&k);
    free(t);
    trn_resnet_free(&m);
    be.device = TRN_DEVICE_CPU;
    trn_backend_cpu_free(&be);
}

/* On the CPU the tables are the model's own memory: no copies, no-ops. */
static void test_no_host_copies_on_the_cpu(void **state)
{
    (void)state;
    struct trn_backend be;
    assert_int_equal(trn_backend_cpu_init(&be, 1, err, sizeof(err)), 0);
    struct trn_resnet m;
    assert_int_equal(trn_resnet_create(&m, &be, trn_arch_find("resnet18"), 10, err, sizeof(err)),
                     0);
    assert_null(m.host_params);
    assert_ptr_equal(trn_resnet_host_momentum(&m), m.momentum);
    struct trn_ckpt_tensor *t = trn_state_table(&m);
    assert_ptr_equal(t[0].data, m.params + m.state[0].off);
    trn_resnet_pull(&m);
    trn_resnet_push(&m);
    free(t);
    trn_resnet_free(&m);
    trn_backend_cpu_free(&be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_auto),
        cmocka_unit_test(test_explicit),
        cmocka_unit_test(test_backend),
        cmocka_unit_test(test_grad_reduce),
        cmocka_unit_test(test_host_copies_on_a_device_backend),
        cmocka_unit_test(test_no_host_copies_on_the_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
