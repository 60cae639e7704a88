/*
 * cuda_link_probe.c: a program that links cuDNN, cuBLAS and NCCL, which
 * the CUDA programs open when their backend starts (trainer/ops/cuda/libs.h,
 * trainer/comm/nccl_lib.h). It never needs to run: tools/lazylibs.sh
 * (meson test --suite lint) reads its ELF header, to check that the
 * sonames the programs open are those of the libraries the headers came
 * with, and that no program links them again.
 */
#include <cublas_v2.h>
#include <cudnn.h>
#include <nccl.h>

typedef void (*any_fn)(void);

/* Kept (`used`): the references keep the libraries linked (--as-needed). */
__attribute__((used)) static const any_fn refs[] = {
    (any_fn)&cudnnGetVersion,
    (any_fn)&cublasGetProperty,
    (any_fn)&ncclGetVersion,
};

int main(void)
{
    return 0;
}
