/*
 * test_cuda_libs.c: cuDNN, cuBLAS and NCCL are opened on first use
 * (trainer/ops/cuda/libs.h, trainer/comm/nccl_lib.h), not at exec. No GPU
 * needed: the version calls answer without one.
 *
 *  - before the load, none of the three is mapped into the process;
 *  - the load fills every slot, and the calls through the names reach the
 *    libraries the headers were of (same major version);
 *  - a second load returns the first one's outcome.
 */
#include <stdarg.h>
#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "trainer/comm/nccl_lib.h"
#include "trainer/ops/cuda/libs.h"

/* Whether a library whose file name starts with `name` is mapped here. */
static int mapped(const char *name)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[4096];
    int found = 0;
    while (fgets(line, sizeof(line), f) != NULL) {
        const char *slash = strrchr(line, '/');
        if (slash != NULL && strncmp(slash + 1, name, strlen(name)) == 0)
            found = 1;
    }
    fclose(f);
    return found;
}

static void test_opened_on_first_use(void **state)
{
    (void)state;
    assert_false(mapped("libcudnn.so"));
    assert_false(mapped("libcublas"));
    assert_false(mapped("libnccl.so"));
    char err[512] = "";
    assert_int_equal(trn_cuda_libs_load(err, sizeof(err)), 0);
    assert_true(mapped("libcudnn.so") && mapped("libcublas.so"));
    assert_false(mapped("libnccl.so"));
    assert_int_equal(trn_nccl_lib_load(err, sizeof(err)), 0);
    assert_true(mapped("libnccl.so"));
    assert_int_equal(trn_cuda_libs_load(err, sizeof(err)), 0);
}

/* How many of a table's function pointers are still null. */
static int unset_slots(const void *table, size_t bytes)
{
    int n = 0;
    for (size_t off = 0; off + sizeof(uintptr_t) <= bytes; off += sizeof(uintptr_t)) {
        uintptr_t p;
        memcpy(&p, (const char *)table + off, sizeof(p));
        n += p == 0;
    }
    return n;
}

static void test_every_slot_filled(void **state)
{
    (void)state;
    char err[512] = "";
    assert_int_equal(trn_cuda_libs_load(err, sizeof(err)), 0);
    assert_int_equal(trn_nccl_lib_load(err, sizeof(err)), 0);
    /* (the members cannot be named here: the names are the redirects) */
    assert_int_equal(unset_slots(&trn_cudnn, sizeof(trn_cudnn)), 0);
    assert_int_equal(unset_slots(&trn_cublas, sizeof(trn_cublas)), 0);
    assert_int_equal(unset_slots(&trn_nccl, sizeof(trn_nccl)), 0);
#define XX(f) +1
    assert_int_equal(sizeof(trn_cudnn) / sizeof(void (*)(void)), 0 TRN_CUDNN_FUNCS(XX));
    assert_int_equal(sizeof(trn_cublas) / sizeof(void (*)(void)), 0 TRN_CUBLAS_FUNCS(XX));
    assert_int_equal(sizeof(trn_nccl) / sizeof(void (*)(void)), 0 TRN_NCCL_FUNCS(XX));
#undef XX
}

static void test_calls_reach_the_headers_libraries(void **state)
{
    (void)state;
    char err[512] = "";
    assert_int_equal(trn_cuda_libs_load(err, sizeof(err)), 0);
    assert_int_equal(trn_nccl_lib_load(err, sizeof(err)), 0);
    /* cuDNN 9 numbers itself major * 10000 + minor * 100 + patch */
    assert_int_equal(cudnnGetVersion() / 10000, CUDNN_MAJOR);
    assert_string_equal(cudnnGetErrorString(CUDNN_STATUS_SUCCESS), "CUDNN_STATUS_SUCCESS");
    int major = -1;
    assert_int_equal(cublasGetProperty(MAJOR_VERSION, &major), CUBLAS_STATUS_SUCCESS);
    assert_int_equal(major, CUBLAS_VER_MAJOR);
    assert_non_null(cublasGetStatusString(CUBLAS_STATUS_SUCCESS));
    int v = 0;
    assert_int_equal(ncclGetVersion(&v), ncclSuccess);
    assert_int_equal(v / 10000, NCCL_MAJOR);
    assert_non_null(ncclGetErrorString(ncclSuccess));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        /* (first: it needs the libraries not yet loaded) */
        cmocka_unit_test(test_opened_on_first_use),
        cmocka_unit_test(test_every_slot_filled),
        cmocka_unit_test(test_calls_reach_the_headers_libraries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
