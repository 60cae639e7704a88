/*
 * bn.cu: batch normalisation, and the ReLU and residual add fused with it,
 * as our own kernels (PyTorch uses its own for bf16 too).
 *
 * Split exactly as ops.h's entry points, so SyncBatchNorm can exchange the
 * statistics between the halves: per-channel statistics, the per-channel
 * prepare step, the elementwise apply (+ residual, + ReLU); in backward the
 * per-channel reductions, the parameter gradients, the elementwise input
 * gradient.
 *
 * Reductions over (N, H, W) per channel: the activation is seen as M = N*H*W
 * rows of C channels (NHWC: a row is contiguous). A block of 32 x 8 threads
 * takes 32 channels; its 8 rows of threads walk rows grid-strided over R
 * row groups, summing in double, then the 8 are added in a fixed order and
 * the block writes one partial per channel; a second kernel adds the R
 * partials of each channel in order. R depends only on the shape, so the
 * result does not change from run to run (no atomics).
 *
 * The arithmetic per element and per channel is ops_math.h's, which the
 * CPU tests check against ops/cpu/bn.c; the summation order differs from
 * the CPU's (in double, which rarely shows in the float result).
 *
 * Under --amp the activations (x, the residual, y, dy, the ReLU mask, dx)
 * are bf16 or fp16 in memory: the kernels are templates on that dtype, read
 * each value widened to fp32 and round each result once on the store
 * (trn_act_get/put). Statistics, the per-channel vectors and the backward
 * sums stay fp32 (sums in double), as PyTorch's own bf16 batch norm: SyncBN
 * exchanges and DDP see the same fp32 vectors as without --amp.
 */
#include "trainer/ops/cuda/cuda.h"
#include "trainer/ops/cuda/ops_math.h"

enum { RED_X = TRN_BN_RED_X, RED_Y = TRN_BN_RED_Y };

enum red_mode {
    RED_SUM,   /* a = sum x */
    RED_SQDEV, /* a = sum (x - mean)^2 */
    RED_BWD,   /* a = sum g, b = sum g * (x - mean), g masked by relu_y */
};

/* ---- kernels ---- */

template <int MODE, int DT>
__global__ void reduce_partial_kernel(const void *x, const void *dy, const void *ry,
                                      const float *mean, int nhwc, int N, int C, int HW,
                                      double *part_a, double *part_b)
{
    __shared__ double sa[RED_Y][RED_X], sb[RED_Y][RED_X];
    int c = blockIdx.x * RED_X + threadIdx.x;
    size_t M = (size_t)N * HW;
    double a = 0, b = 0;
    if (c < C) {
        float m = MODE == RED_SUM ? 0.0f : mean[c];
        for (size_t r = (size_t)blockIdx.y * RED_Y + threadIdx.y; r < M;
             r += (size_t)gridDim.y * RED_Y) {
            int n = (int)(r / HW), p = (int)(r % HW);
            size_t o = trn_act_off(nhwc, n, c, p, C, HW);
            float xv = trn_act_get(x, DT, o);
            if (MODE == RED_SUM) {
                a += xv;
            } else if (MODE == RED_SQDEV) {
                a += trn_bn_sqdev(xv, m);
            } else {
                float g = trn_relu_mask(trn_act_get(dy, DT, o), ry != NULL,
                                        ry ? trn_act_get(ry, DT, o) : 0.0f);
                a += g;
                b += trn_bn_dy_xmu(g, xv, m);
            }
        }
    }
    sa[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        double ta = 0, tb = 0;
        for (int j = 0; j < RED_Y; j++) {
            ta += sa[j][threadIdx.x];
            tb += sb[j][threadIdx.x];
        }
        part_a[(size_t)blockIdx.y * C + c] = ta;
        if (MODE == RED_BWD)
            part_b[(size_t)blockIdx.y * C + c] = tb;
    }
}

/* The R partials of each channel, in order, then the finishing formula. */
template <int MODE>
__global__ void reduce_final_kernel(const double *part_a, const double *part_b, int R, int C,
                                    double count, float *out_a, float *out_b)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    double a = 0, b = 0;
    for (int r = 0; r < R; r++) {
        a += part_a[(size_t)r * C + c];
        if (MODE == RED_BWD)
            b += part_b[(size_t)r * C + c];
    }
    if (MODE == RED_SUM) {
        out_a[c] = trn_bn_mean(a, count);
    } else if (MODE == RED_SQDEV) {
        out_a[c] = trn_bn_var(a, count);
    } else {
        out_a[c] = (float)a;
        out_b[c] = (float)b;
    }
}

__global__ void prepare_kernel(int C, const float *mean, const float *var, double count, double eps,
                               float mom, const float *weight, const float *bias,
                               float *running_mean, float *running_var, float *invstd, float *scale,
                               float *shift)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    trn_bn_prepare_one(mean[c], var[c], count, eps, mom, weight[c], bias[c],
                       running_mean ? running_mean + c : NULL, running_var ? running_var + c : NULL,
                       invstd + c, scale + c, shift + c);
}

template <int DT>
__global__ void apply_kernel(const void *x, const float *scale, const float *shift, const void *res,
                             const float *res_scale, const float *res_shift, int res_kind, float lo,
                             int nhwc, int C, int HW, size_t total, void *y)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total)
        return;
    int c = trn_act_channel(nhwc, e, C, HW);
    float r = res_kind != TRN_BN_RES_NONE ? trn_act_get(res, DT, e) : 0.0f;
    float ra = res_kind == TRN_BN_RES_BN ? res_scale[c] : 1.0f;
    float rb = res_kind == TRN_BN_RES_BN ? res_shift[c] : 0.0f;
    trn_act_put(
        y, DT, e,
        trn_bn_apply_one(trn_act_get(x, DT, e), scale[c], shift[c], res_kind, r, ra, rb, lo));
}

__global__ void param_grads_kernel(int C, const float *invstd, const float *sum_dy,
                                   const float *sum_dy_xmu, float *dweight, float *dbias,
                                   int accumulate)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    trn_bn_param_grad_one(invstd[c], sum_dy[c], sum_dy_xmu[c], accumulate, dweight + c, dbias + c);
}

__global__ void bwd_coef_kernel(int C, const float *invstd, const float *weight,
                                const float *sum_dy, const float *sum_dy_xmu, double count,
                                float *k1, float *a, float *b)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    trn_bn_bwd_coef(invstd[c], weight[c], sum_dy[c], sum_dy_xmu[c], count, k1 + c, a + c, b + c);
}

template <int DT>
__global__ void bwd_input_kernel(const void *x, const void *dy, const void *ry, const float *mean,
                                 const float *k1, const float *a, const float *b, int nhwc, int C,
                                 int HW, size_t total, void *dx)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total)
        return;
    int c = trn_act_channel(nhwc, e, C, HW);
    float g = trn_relu_mask(trn_act_get(dy, DT, e), ry != NULL, ry ? trn_act_get(ry, DT, e) : 0.0f);
    trn_act_put(dx, DT, e,
                trn_bn_bwd_input_one(g, trn_act_get(x, DT, e), mean[c], k1[c], a[c], b[c]));
}

template <int DT>
__global__ void relu_bwd_kernel(const void *dy, const void *dy2, const void *y, size_t total,
                                void *dx)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= total)
        return;
    trn_act_put(dx, DT, e,
                trn_relu_bwd_one(trn_act_get(dy, DT, e), dy2 != NULL,
                                 dy2 ? trn_act_get(dy2, DT, e) : 0.0f, trn_act_get(y, DT, e)));
}

/* ---- launchers ---- */

/* Partials for a reduction of x's shape: 2 * R * C doubles in the scratch. */
static double *partials(struct trn_backend *be, int R, int C)
{
    struct cuda_backend *cb = cuda_of(be);
    cuda_reserve(be, &cb->scratch, &cb->scratch_size, 2 * (size_t)R * C * sizeof(double));
    return (double *)cb->scratch;
}

template <int MODE>
static void reduce(struct trn_backend *be, const struct trn_tensor *x, const void *dy,
                   const void *ry, const float *mean, float *out_a, float *out_b)
{
    struct cuda_backend *cb = cuda_of(be);
    int C = x->c, HW = x->h * x->w;
    size_t M = (size_t)x->n * HW;
    int R = trn_bn_row_groups(M);
    double *pa = partials(be, R, C), *pb = pa + (size_t)R * C;
    dim3 grid((unsigned)((C + RED_X - 1) / RED_X), (unsigned)R), block(RED_X, RED_Y);
    int nhwc = cuda_nhwc(x);
    cuda_act_dispatch(x->dtype, [&](auto dt) {
        reduce_partial_kernel<MODE, decltype(dt)::value>
            <<<grid, block, 0, cb->stream>>>(x->data, dy, ry, mean, nhwc, x->n, C, HW, pa, pb);
    });
    cudaLaunchCheck();
    reduce_final_kernel<MODE><<<cuda_blocks((size_t)C, 128), 128, 0, cb->stream>>>(
        pa, pb, R, C, (double)M, out_a, out_b);
    cudaLaunchCheck();
}

void cuda_bn_stats(struct trn_backend *be, const struct trn_tensor *x, float *mean, float *var)
{
    cuda_op_enter("bn_stats", x, NULL);
    reduce<RED_SUM>(be, x, NULL, NULL, NULL, mean, NULL);
    reduce<RED_SQDEV>(be, x, NULL, NULL, mean, var, NULL);
}

void cuda_bn_prepare(struct trn_backend *be, int c, const float *mean, const float *var,
                     double count, double eps, double momentum, const float *weight,
                     const float *bias, float *running_mean, float *running_var, float *invstd,
                     float *scale, float *shift)
{
    cuda_op_enter_n("bn_prepare", "C %d, count %g", c, count);
    struct cuda_backend *cb = cuda_of(be);
    prepare_kernel<<<cuda_blocks((size_t)c, 128), 128, 0, cb->stream>>>(
        c, mean, var, count, eps, (float)momentum, weight, bias, running_mean, running_var, invstd,
        scale, shift);
    cudaLaunchCheck();
}

void cuda_bn_apply(struct trn_backend *be, const struct trn_tensor *x, const float *scale,
                   const float *shift, const struct trn_tensor *res, const float *res_scale,
                   const float *res_shift, bool relu, struct trn_tensor *y)
{
    cuda_op_enter("bn_apply", x, res);
    struct cuda_backend *cb = cuda_of(be);
    size_t total = trn_tensor_numel(x);
    int kind = !res ? TRN_BN_RES_NONE : !res_scale ? TRN_BN_RES_ADD : TRN_BN_RES_BN;
    if (res)
        TRN_CHECK(cuda_nhwc(res) == cuda_nhwc(x), "bn_apply: residual layout differs");
    cuda_same_dtype(x, res, "bn_apply");
    cuda_same_dtype(x, y, "bn_apply");
    int nhwc = cuda_nhwc(x);
    cuda_act_dispatch(x->dtype, [&](auto dt) {
        apply_kernel<decltype(dt)::value><<<cuda_blocks(total, 256), 256, 0, cb->stream>>>(
            x->data, scale, shift, res ? res->data : NULL, res_scale, res_shift, kind,
            relu ? 0.0f : -INFINITY, nhwc, x->c, x->h * x->w, total, y->data);
    });
    cudaLaunchCheck();
}

void cuda_bn_backward_reduce(struct trn_backend *be, const struct trn_tensor *x,
                             const struct trn_tensor *dy, const struct trn_tensor *relu_y,
                             const float *mean, float *sum_dy, float *sum_dy_xmu)
{
    cuda_op_enter("bn_backward_reduce", x, dy);
    cuda_same_dtype(x, dy, "bn_backward_reduce");
    cuda_same_dtype(x, relu_y, "bn_backward_reduce");
    reduce<RED_BWD>(be, x, dy->data, relu_y ? relu_y->data : NULL, mean, sum_dy, sum_dy_xmu);
}

void cuda_bn_param_grads(struct trn_backend *be, int c, const float *invstd, const float *sum_dy,
                         const float *sum_dy_xmu, float *dweight, float *dbias, bool accumulate)
{
    cuda_op_enter_n("bn_param_grads", "C %d", c);
    struct cuda_backend *cb = cuda_of(be);
    param_grads_kernel<<<cuda_blocks((size_t)c, 128), 128, 0, cb->stream>>>(
        c, invstd, sum_dy, sum_dy_xmu, dweight, dbias, accumulate);
    cudaLaunchCheck();
}

void cuda_bn_backward_input(struct trn_backend *be, const struct trn_tensor *x,
                            const struct trn_tensor *dy, const struct trn_tensor *relu_y,
                            const float *mean, const float *invstd, const float *weight,
                            const float *sum_dy, const float *sum_dy_xmu, double count,
                            struct trn_tensor *dx)
{
    cuda_op_enter("bn_backward_input", x, dy);
    struct cuda_backend *cb = cuda_of(be);
    int C = x->c;
    cuda_reserve(be, &cb->scratch, &cb->scratch_size, 3 * (size_t)C * sizeof(float));
    float *k1 = (float *)cb->scratch, *a = k1 + C, *b = a + C;
    bwd_coef_kernel<<<cuda_blocks((size_t)C, 128), 128, 0, cb->stream>>>(
        C, invstd, weight, sum_dy, sum_dy_xmu, count, k1, a, b);
    cudaLaunchCheck();
    size_t total = trn_tensor_numel(x);
    cuda_same_dtype(x, dy, "bn_backward_input");
    cuda_same_dtype(x, relu_y, "bn_backward_input");
    cuda_same_dtype(x, dx, "bn_backward_input");
    int nhwc = cuda_nhwc(x);
    cuda_act_dispatch(x->dtype, [&](auto dt) {
        bwd_input_kernel<decltype(dt)::value><<<cuda_blocks(total, 256), 256, 0, cb->stream>>>(
            x->data, dy->data, relu_y ? relu_y->data : NULL, mean, k1, a, b, nhwc, C, x->h * x->w,
            total, dx->data);
    });
    cudaLaunchCheck();
}

void cuda_relu_backward(struct trn_backend *be, const struct trn_tensor *dy,
                        const struct trn_tensor *dy2, const struct trn_tensor *y,
                        struct trn_tensor *dx)
{
    cuda_op_enter("relu_backward", dy, dx);
    struct cuda_backend *cb = cuda_of(be);
    size_t total = trn_tensor_numel(dy);
    cuda_same_dtype(dy, dy2, "relu_backward");
    cuda_same_dtype(dy, y, "relu_backward");
    cuda_same_dtype(dy, dx, "relu_backward");
    cuda_act_dispatch(dy->dtype, [&](auto dt) {
        relu_bwd_kernel<decltype(dt)::value><<<cuda_blocks(total, 256), 256, 0, cb->stream>>>(
            dy->data, dy2 ? dy2->data : NULL, y->data, total, dx->data);
    });
    cudaLaunchCheck();
}
