/*
 * fc.cu: the fully connected head, torch.nn.Linear: y = x w^T + b with w
 * stored (out, in), through cuBLAS.
 *
 * cuBLAS is column-major; a row-major (r, c) matrix is the column-major
 * (c, r) one with the same bytes, so each row-major product is written as
 * its transpose:
 *
 *     y  (n, out) = x w^T     ->  y^T  = w^T' x^T      gemm(T, N, out, n, in)
 *     dw (out, in) = dy^T x   ->  dw^T = x^T dy        gemm(N, T, in, out, n)
 *     dx (n, in)  = dy w      ->  dx^T = w^T dy^T      gemm(N, N, in, n, out)
 *
 * The math mode (strict fp32, or TF32 when asked) is set on the handle in
 * backend.cu. The bias is added and its gradient (the column sums of dy,
 * in double, as the CPU) taken by two small kernels.
 */
#include "trainer/ops/cuda/cuda.h"

/* ---- kernels ---- */

__global__ void add_bias_kernel(float *y, const float *b, int n, int out)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)n * out)
        return;
    y[e] += b[e % out];
}

/* One thread per output feature; adjacent threads read adjacent columns. */
__global__ void bias_grad_kernel(const float *dy, float *db, int n, int out, int accumulate)
{
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= out)
        return;
    double s = 0;
    for (int i = 0; i < n; i++)
        s += dy[(size_t)i * out + o];
    db[o] = accumulate ? db[o] + (float)s : (float)s;
}

/* ---- launchers ---- */

void cuda_fc_forward(struct trn_backend *be, int n, int in, int out, const float *x, const float *w,
                     const float *b, float *y)
{
    cuda_op_enter_n("fc_forward", "n %d, in %d, out %d", n, in, out);
    struct cuda_backend *cb = cuda_of(be);
    const float one = 1.0f, zero = 0.0f;
    cublasCheck(cublasSgemm(cb->cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w, in, x, in,
                            &zero, y, out));
    size_t total = (size_t)n * out;
    add_bias_kernel<<<cuda_blocks(total, 256), 256, 0, cb->stream>>>(y, b, n, out);
    cudaLaunchCheck();
}

void cuda_fc_backward(struct trn_backend *be, int n, int in, int out, const float *x,
                      const float *w, const float *dy, float *dx, float *dw, float *db,
                      bool accumulate)
{
    cuda_op_enter_n("fc_backward", "n %d, in %d, out %d", n, in, out);
    struct cuda_backend *cb = cuda_of(be);
    const float one = 1.0f, zero = 0.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasCheck(cublasSgemm(cb->cublas, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &one, x, in, dy, out,
                            &beta, dw, in));
    bias_grad_kernel<<<cuda_blocks((size_t)out, 128), 128, 0, cb->stream>>>(dy, db, n, out,
                                                                            accumulate);
    cudaLaunchCheck();
    if (dx)
        cublasCheck(cublasSgemm(cb->cublas, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &one, w, in, dy,
                                out, &zero, dx, in));
}
