/* libs.c: see libs.h. */
#define TRN_CUDA_LIBS_TABLES
#include "trainer/ops/cuda/libs.h"

#include "common/dl.h"

#define STR_(x) #x
#define STR(x) STR_(x)

struct trn_cudnn_fns trn_cudnn;
struct trn_cublas_fns trn_cublas;

static const struct cddp_dl_sym cudnn_syms[] = {
#define XX(f) {#f, &trn_cudnn.f},
    TRN_CUDNN_FUNCS(XX)
#undef XX
};

static const struct cddp_dl_sym cublas_syms[] = {
#define XX(f) {#f, &trn_cublas.f},
    TRN_CUBLAS_FUNCS(XX)
#undef XX
};

/* The major versions the headers are of: the ABI the tables were typed
 * from (libcudnn.so.9, libcublas.so.13 here). */
static struct cddp_dl cudnn_lib = CDDP_DL_INIT("libcudnn.so." STR(CUDNN_MAJOR), cudnn_syms);
static struct cddp_dl cublas_lib = CDDP_DL_INIT("libcublas.so." STR(CUBLAS_VER_MAJOR), cublas_syms);

int trn_cuda_libs_load(char *err, size_t errlen)
{
    int rc = cddp_dl_load(&cudnn_lib, err, errlen);
    return rc ? rc : cddp_dl_load(&cublas_lib, err, errlen);
}
