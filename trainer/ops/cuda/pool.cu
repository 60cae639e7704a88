/*
 * pool.cu: the two poolings of a ResNet, as on the CPU (ops/cpu/pool.c).
 *
 * Max-pool 3x3, stride 2, padding 1: one thread per output keeps the window
 * index (0..8) of the value it took; NaN wins and ties go to the first, as
 * PyTorch's CPU kernel. Backward gathers instead of scattering: one thread
 * per input adds the gradients of the (at most 2 x 2) outputs whose window
 * chose it, in output order, so there are no atomics and the sum is the
 * CPU's, in the CPU's order.
 *
 * Adaptive average pool to 1x1: one thread per (image, channel) sums its
 * H*W values in double (adjacent threads read adjacent channels in NHWC);
 * the result is a plain (N, C) matrix for the fully connected layer.
 *
 * Under --amp the activations are bf16 or fp16 in memory (the kernels are
 * templates on the dtype, trn_act_get/put): compared and summed in fp32
 * (max-pool's output is one of its inputs, exact), the backward sums
 * rounded once on the store; the pooled features stay fp32 for fc.
 */
#include "trainer/ops/cuda/cuda.h"
#include "trainer/ops/cuda/ops_math.h"

/* ---- kernels ---- */

template <int DT>
__global__ void maxpool_fwd_kernel(const void *x, void *y, uint8_t *argmax, int nhwc, int N, int C,
                                   int H, int W, int OH, int OW)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t total = (size_t)N * C * OH * OW;
    if (e >= total)
        return;
    int n, c, op;
    trn_act_coords(nhwc, e, C, OH * OW, &n, &c, &op);
    int oy = op / OW, ox = op % OW;
    float best = -INFINITY;
    int arg = 0;
    for (int ky = 0; ky < TRN_POOL_K; ky++) {
        int iy = trn_maxpool_in(oy, ky);
        if (iy < 0 || iy >= H)
            continue;
        for (int kx = 0; kx < TRN_POOL_K; kx++) {
            int ix = trn_maxpool_in(ox, kx);
            if (ix < 0 || ix >= W)
                continue;
            float v = trn_act_get(x, DT, trn_act_off(nhwc, n, c, iy * W + ix, C, H * W));
            if (trn_maxpool_takes(v, best)) {
                best = v;
                arg = ky * TRN_POOL_K + kx;
            }
        }
    }
    trn_act_put(y, DT, e, best); /* exact: one of the inputs */
    argmax[e] = (uint8_t)arg;
}

template <int DT>
__global__ void maxpool_bwd_kernel(const void *dy, const uint8_t *argmax, void *dx, int nhwc, int N,
                                   int C, int H, int W, int OH, int OW)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t total = (size_t)N * C * H * W;
    if (e >= total)
        return;
    int n, c, p;
    trn_act_coords(nhwc, e, C, H * W, &n, &c, &p);
    int iy = p / W, ix = p % W;
    int y0, y1, x0, x1;
    trn_maxpool_outs(iy, OH, &y0, &y1);
    trn_maxpool_outs(ix, OW, &x0, &x1);
    float s = 0.0f;
    for (int oy = y0; oy <= y1; oy++)
        for (int ox = x0; ox <= x1; ox++) {
            size_t o = trn_act_off(nhwc, n, c, oy * OW + ox, C, OH * OW);
            int a = argmax[o];
            if (trn_maxpool_in(oy, a / TRN_POOL_K) == iy &&
                trn_maxpool_in(ox, a % TRN_POOL_K) == ix)
                s += trn_act_get(dy, DT, o);
        }
    trn_act_put(dx, DT, e, s);
}

template <int DT>
__global__ void avgpool_fwd_kernel(const void *x, float *y, int nhwc, int N, int C, int HW)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; /* = n * C + c */
    if (e >= (size_t)N * C)
        return;
    int n = (int)(e / C), c = (int)(e % C);
    double s = 0;
    for (int p = 0; p < HW; p++)
        s += trn_act_get(x, DT, trn_act_off(nhwc, n, c, p, C, HW));
    y[e] = trn_avgpool_mean(s, HW);
}

template <int DT>
__global__ void avgpool_bwd_kernel(const float *dy, void *dx, int nhwc, int N, int C, int HW)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)N * C * HW)
        return;
    int c = trn_act_channel(nhwc, e, C, HW);
    int n = (int)(e / ((size_t)C * HW));
    trn_act_put(dx, DT, e, trn_avgpool_grad(dy[(size_t)n * C + c], HW));
}

/* ---- launchers ---- */

void cuda_maxpool_forward(struct trn_backend *be, const struct trn_tensor *x, struct trn_tensor *y,
                          uint8_t *argmax)
{
    cuda_op_enter("maxpool_forward", x, y);
    struct cuda_backend *cb = cuda_of(be);
    size_t total = trn_tensor_numel(y);
    TRN_CHECK(cuda_nhwc(x) == cuda_nhwc(y), "maxpool: x and y layouts differ");
    cuda_same_dtype(x, y, "maxpool_forward");
    int nhwc = cuda_nhwc(x);
    cuda_act_dispatch(x->dtype, [&](auto dt) {
        maxpool_fwd_kernel<decltype(dt)::value><<<cuda_blocks(total, 256), 256, 0, cb->stream>>>(
            x->data, y->data, argmax, nhwc, x->n, x->c, x->h, x->w, y->h, y->w);
    });
    cudaLaunchCheck();
}

void cuda_maxpool_backward(struct trn_backend *be, const struct trn_tensor *dy,
                           const uint8_t *argmax, struct trn_tensor *dx)
{
    cuda_op_enter("maxpool_backward", dy, dx);
    struct cuda_backend *cb = cuda_of(be);
    size_t total = trn_tensor_numel(dx);
    TRN_CHECK(cuda_nhwc(dx) == cuda_nhwc(dy), "maxpool: dx and dy layouts differ");
    cuda_same_dtype(dx, dy, "maxpool_backward");
    int nhwc = cuda_nhwc(dx);
    cuda_act_dispatch(dx->dtype, [&](auto dt) {
        maxpool_bwd_kernel<decltype(dt)::value><<<cuda_blocks(total, 256), 256, 0, cb->stream>>>(
            dy->data, argmax, dx->data, nhwc, dx->n, dx->c, dx->h, dx->w, dy->h, dy->w);
    });
    cudaLaunchCheck();
}

void cuda_avgpool_forward(struct trn_backend *be, const struct trn_tensor *x, float *y)
{
    cuda_op_enter("avgpool_forward", x, NULL);
    struct cuda_backend *cb = cuda_of(be);
    size_t total = (size_t)x->n * x->c;
    int nhwc = cuda_nhwc(x);
    cuda_act_dispatch(x->dtype, [&](auto dt) {
        avgpool_fwd_kernel<decltype(dt)::value><<<cuda_blocks(total, 128), 128, 0, cb->stream>>>(
            x->data, y, nhwc, x->n, x->c, x->h * x->w);
    });
    cudaLaunchCheck();
}

void cuda_avgpool_backward(struct trn_backend *be, const float *dy, struct trn_tensor *dx)
{
    cuda_op_enter("avgpool_backward", dx, NULL);
    struct cuda_backend *cb = cuda_of(be);
    size_t total = trn_tensor_numel(dx);
    int nhwc = cuda_nhwc(dx);
    cuda_act_dispatch(dx->dtype, [&](auto dt) {
        avgpool_bwd_kernel<decltype(dt)::value><<<cuda_blocks(total, 256), 256, 0, cb->stream>>>(
            dy, dx->data, nhwc, dx->n, dx->c, dx->h * dx->w);
    });
    cudaLaunchCheck();
}
