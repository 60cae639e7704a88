/*
 * conv.cu: 2-d convolution (no bias), forward and backward, on cuDNN.
 *
 * The legacy convolution API (cudnnConvolutionForward, BackwardData,
 * BackwardFilter), deprecated in cuDNN 9 but complete and in every 9.x: it
 * does the three products a ResNet needs with NHWC activations, and the
 * algorithm for each is chosen by measurement (cudnnFind*AlgorithmEx, every
 * candidate run on our own buffers within our workspace bound) once per
 * shape and kept in the backend's cache (algo_cache.h), shared by the layers
 * of that shape. docs/trainer.md says why this and not the graph API yet.
 *
 * Weights stay OIHW in the flat parameter buffer. With NHWC activations
 * cuDNN wants KRSC (OHWI) filters, so the weights are converted into a
 * scratch buffer just before a call, and the weight gradient comes back
 * through the same buffer (set or added into the OIHW gradient): a layer's
 * weights are small next to its activations. With NCHW activations the
 * filter is OIHW as is. x and y of one convolution share a layout.
 *
 * Math: fp32 with TF32 off is CUDNN_FMA_MATH (no tensor cores, the CPU's
 * arithmetic up to summation order); with TF32 on, cuDNN may pick TF32
 * tensor-core algorithms. Under --amp the activations, their gradients and
 * the filter are bf16 or fp16 with fp32 accumulation (the compute type;
 * tensor-core math), as autocast's convolutions: the fp32 master weights
 * are cast in the same pass that reorders them to KRSC, and cuDNN's bf16 /
 * fp16 weight gradient is widened into the fp32 gradients (set or added).
 * With opt.deterministic only algorithms cuDNN marks deterministic are
 * taken (the weight gradient's fastest ones are not).
 *
 * Plans (descriptors, chosen algorithms) are built per input shape on first
 * use and kept, up to MAX_PLANS per layer: the training batch, the last
 * short batch, eval.
 */
#include <stdlib.h>
#include <string.h>

#include "trainer/ops/cuda/cuda.h"
#include "trainer/ops/cuda/ops_math.h"

#define MAX_PLANS 4

struct conv_plan {
    int n, h, w, oh, ow;
    int nhwc;
    enum trn_dtype dtype; /* of x, y and the filter as cuDNN sees them */
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t f;
    cudnnConvolutionDescriptor_t conv;
    struct trn_conv_choice fwd, bwd_data, bwd_filter;
    bool have_fwd, have_bwd_data, have_bwd_filter;
};

struct conv_impl {
    struct conv_plan plans[MAX_PLANS];
    int n_plans;
    int lru;
};

/* ---- kernels ---- */

/* dst (KRSC when ohwi, else OIHW; dtype DT) = src (OIHW fp32), one thread
 * per weight: the fp32 master weights as cuDNN reads them (cast to bf16 /
 * fp16 under --amp, autocast's cast of the weight). */
template <int DT>
__global__ void filter_from_oihw_kernel(const float *src, void *dst, int O, int I, int K, int ohwi)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)O * I * K * K)
        return;
    int kx = (int)(e % K), ky = (int)((e / K) % K);
    int i = (int)((e / ((size_t)K * K)) % I), o = (int)(e / ((size_t)K * K * I));
    trn_act_put(dst, DT, ohwi ? trn_ohwi_off(o, i, ky, kx, I, K) : e, src[e]);
}

/* dst (OIHW fp32) = (or +=) src (KRSC when ohwi, else OIHW; dtype DT), one
 * thread per weight: cuDNN's weight gradient into the fp32 gradients (under
 * --amp widened from bf16/fp16, as autograd's cast back to the fp32 leaf). */
template <int DT>
__global__ void filter_to_oihw_kernel(const void *src, float *dst, int O, int I, int K, int ohwi,
                                      int accumulate)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)O * I * K * K)
        return;
    int kx = (int)(e % K), ky = (int)((e / K) % K);
    int i = (int)((e / ((size_t)K * K)) % I), o = (int)(e / ((size_t)K * K * I));
    float v = trn_act_get(src, DT, ohwi ? trn_ohwi_off(o, i, ky, kx, I, K) : e);
    dst[e] = accumulate ? dst[e] + v : v;
}

/* ---- plans ---- */

static size_t weight_count(const struct trn_conv *c)
{
    return (size_t)c->cout * c->cin * c->k * c->k;
}

static void plan_destroy(struct conv_plan *p)
{
    cudnnCheck(cudnnDestroyTensorDescriptor(p->x));
    cudnnCheck(cudnnDestroyTensorDescriptor(p->y));
    cudnnCheck(cudnnDestroyFilterDescriptor(p->f));
    cudnnCheck(cudnnDestroyConvolutionDescriptor(p->conv));
    memset(p, 0, sizeof(*p));
}

/* cuDNN's type for an activation dtype (bf16 and fp16 under --amp). */
static cudnnDataType_t data_type(enum trn_dtype d)
{
    if (d == TRN_BF16)
        return CUDNN_DATA_BFLOAT16;
    if (d == TRN_F16)
        return CUDNN_DATA_HALF;
    TRN_CHECK(d == TRN_F32, "conv: activation dtype %d", (int)d);
    return CUDNN_DATA_FLOAT;
}

static struct conv_plan *plan_for(struct trn_backend *be, struct trn_conv *c,
                                  const struct trn_tensor *x)
{
    struct cuda_backend *cb = cuda_of(be);
    struct conv_impl *ci = (struct conv_impl *)c->impl;
    if (!ci) {
        ci = (struct conv_impl *)trn_calloc(1, sizeof(*ci));
        c->impl = ci;
    }
    int nhwc = cuda_nhwc(x);
    for (int i = 0; i < ci->n_plans; i++) {
        struct conv_plan *p = &ci->plans[i];
        if (p->n == x->n && p->h == x->h && p->w == x->w && p->nhwc == nhwc && p->dtype == x->dtype)
            return p;
    }
    struct conv_plan *p;
    if (ci->n_plans < MAX_PLANS) {
        p = &ci->plans[ci->n_plans++];
    } else {
        p = &ci->plans[ci->lru];
        ci->lru = (ci->lru + 1) % MAX_PLANS;
        plan_destroy(p);
    }
    p->n = x->n;
    p->h = x->h;
    p->w = x->w;
    p->nhwc = nhwc;
    p->dtype = x->dtype;
    p->oh = (x->h + 2 * c->pad - c->k) / c->stride + 1;
    p->ow = (x->w + 2 * c->pad - c->k) / c->stride + 1;
    cudnnTensorFormat_t fmt = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    cudnnDataType_t dt = data_type(p->dtype);
    cudnnCheck(cudnnCreateTensorDescriptor(&p->x));
    cudnnCheck(cudnnCreateTensorDescriptor(&p->y));
    cudnnCheck(cudnnCreateFilterDescriptor(&p->f));
    cudnnCheck(cudnnCreateConvolutionDescriptor(&p->conv));
    cudnnCheck(cudnnSetTensor4dDescriptor(p->x, fmt, dt, x->n, c->cin, x->h, x->w));
    cudnnCheck(cudnnSetTensor4dDescriptor(p->y, fmt, dt, x->n, c->cout, p->oh, p->ow));
    cudnnCheck(cudnnSetFilter4dDescriptor(p->f, dt, fmt, c->cout, c->cin, c->k, c->k));
    /* fp32 accumulation in every dtype (bf16/fp16 data: cuDNN's "pseudo
     * half" configurations, what autocast's convolutions run) */
    cudnnCheck(cudnnSetConvolution2dDescriptor(p->conv, c->pad, c->pad, c->stride, c->stride, 1, 1,
                                               CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    cudnnCheck(cudnnSetConvolutionMathType(p->conv, p->dtype != TRN_F32 ? CUDNN_TENSOR_OP_MATH
                                                    : cb->opt.tf32_conv ? CUDNN_DEFAULT_MATH
                                                                        : CUDNN_FMA_MATH));
    /* Room for the search and the calls, grown here only. */
    cuda_reserve(be, &cb->workspace, &cb->workspace_size, cb->opt.workspace_bytes);
    cuda_reserve(be, &cb->wbuf, &cb->wbuf_size, weight_count(c) * sizeof(float));
    return p;
}

static struct trn_conv_key key_of(struct cuda_backend *cb, enum trn_conv_dir dir,
                                  const struct trn_conv *c, const struct conv_plan *p)
{
    int l = p->nhwc ? TRN_LAYOUT_NHWC : TRN_LAYOUT_NCHW;
    return trn_conv_key_make(dir, p->n, c->cin, p->h, p->w, c->cout, c->k, c->stride, c->pad,
                             p->dtype, l, l, cb->opt.tf32_conv, cb->opt.deterministic,
                             cb->workspace_size);
}

/* Whether a measured candidate may be used under the backend's options. */
static bool acceptable(struct cuda_backend *cb, const struct conv_plan *p, cudnnStatus_t st,
                       cudnnDeterminism_t det, cudnnMathType_t math, size_t memory)
{
    if (st != CUDNN_STATUS_SUCCESS || memory > cb->workspace_size)
        return false;
    if (cb->opt.deterministic && det != CUDNN_DETERMINISTIC)
        return false;
    /* fp32 with TF32 off: no tensor cores at all. On: TF32 tensor cores.
     * bf16/fp16 (--amp): tensor cores or not, whatever is fastest. Never
     * ALLOW_CONVERSION (data rounded to fp16 behind our back). */
    if (p->dtype == TRN_F32 && !cb->opt.tf32_conv && math != CUDNN_FMA_MATH)
        return false;
    return math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

/* The first acceptable result (cuDNN sorts them fastest first). */
#define PICK(results, count, what)                                                                 \
    do {                                                                                           \
        int chosen = -1;                                                                           \
        for (int r = 0; r < (count) && chosen < 0; r++)                                            \
            if (acceptable(cb, p, (results)[r].status, (results)[r].determinism,                   \
                           (results)[r].mathType, (results)[r].memory))                            \
                chosen = r;                                                                        \
        TRN_CHECK(chosen >= 0, "cuDNN: no usable %s algorithm for conv %dx%d k%d s%d", what,       \
                  c->cin, c->cout, c->k, c->stride);                                               \
        choice.algo = (int32_t)(results)[chosen].algo;                                             \
        choice.math_type = (int32_t)(results)[chosen].mathType;                                    \
        choice.workspace = (int64_t)(results)[chosen].memory;                                      \
        choice.time_ms = (results)[chosen].time;                                                   \
    } while (0)

/* Weights as cuDNN wants them for this plan: converted into wbuf (KRSC for
 * NHWC, and in the plan's dtype), or w itself (fp32 NCHW). */
static const void *filter_of(struct trn_backend *be, const struct trn_conv *c,
                             const struct conv_plan *p, const float *w)
{
    struct cuda_backend *cb = cuda_of(be);
    if (!p->nhwc && p->dtype == TRN_F32)
        return w;
    size_t nw = weight_count(c);
    int ohwi = p->nhwc;
    cuda_act_dispatch(p->dtype, [&](auto dt) {
        filter_from_oihw_kernel<decltype(dt)::value><<<cuda_blocks(nw, 256), 256, 0, cb->stream>>>(
            w, cb->wbuf, c->cout, c->cin, c->k, ohwi);
    });
    cudaLaunchCheck();
    return cb->wbuf;
}

/* ---- launchers ---- */

void cuda_conv_forward(struct trn_backend *be, struct trn_conv *conv, const struct trn_tensor *x,
                       const float *w, struct trn_tensor *y)
{
    struct cuda_backend *cb = cuda_of(be);
    struct trn_conv *c = conv;
    struct conv_plan *p = plan_for(be, conv, x);
    TRN_CHECK(cuda_nhwc(y) == p->nhwc, "conv: x and y layouts differ");
    cuda_same_dtype(x, y, "conv_forward");
    const void *f = filter_of(be, conv, p, w);
    if (!p->have_fwd) {
        struct trn_conv_key key = key_of(cb, TRN_CONV_FWD, conv, p);
        struct trn_conv_choice choice;
        if (!trn_algo_cache_get(&cb->algos, &key, &choice)) {
            cudnnConvolutionFwdAlgoPerf_t res[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
            int got = 0;
            cudnnCheck(cudnnFindConvolutionForwardAlgorithmEx(
                cb->cudnn, p->x, x->data, p->f, f, p->conv, p->y, y->data,
                CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, res, cb->workspace, cb->workspace_size));
            PICK(res, got, "forward");
            (void)trn_algo_cache_put(&cb->algos, &key, &choice);
        }
        p->fwd = choice;
        p->have_fwd = true;
    }
    const float one = 1.0f, zero = 0.0f;
    cudnnCheck(cudnnSetConvolutionMathType(p->conv, (cudnnMathType_t)p->fwd.math_type));
    cudnnCheck(cudnnConvolutionForward(cb->cudnn, &one, p->x, x->data, p->f, f, p->conv,
                                       (cudnnConvolutionFwdAlgo_t)p->fwd.algo, cb->workspace,
                                       (size_t)p->fwd.workspace, &zero, p->y, y->data));
}

void cuda_conv_backward_weights(struct trn_backend *be, struct trn_conv *conv,
                                const struct trn_tensor *x, const struct trn_tensor *dy, float *dw,
                                bool accumulate)
{
    struct cuda_backend *cb = cuda_of(be);
    struct trn_conv *c = conv;
    struct conv_plan *p = plan_for(be, conv, x);
    TRN_CHECK(cuda_nhwc(dy) == p->nhwc, "conv: x and dy layouts differ");
    cuda_same_dtype(x, dy, "conv_backward_weights");
    void *df = cb->wbuf; /* cuDNN's filter layout and dtype; set or added into dw below */
    if (!p->have_bwd_filter) {
        struct trn_conv_key key = key_of(cb, TRN_CONV_BWD_FILTER, conv, p);
        struct trn_conv_choice choice;
        if (!trn_algo_cache_get(&cb->algos, &key, &choice)) {
            cudnnConvolutionBwdFilterAlgoPerf_t res[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
            int got = 0;
            cudnnCheck(cudnnFindConvolutionBackwardFilterAlgorithmEx(
                cb->cudnn, p->x, x->data, p->y, dy->data, p->conv, p->f, df,
                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, res, cb->workspace,
                cb->workspace_size));
            PICK(res, got, "weight-gradient");
            (void)trn_algo_cache_put(&cb->algos, &key, &choice);
        }
        p->bwd_filter = choice;
        p->have_bwd_filter = true;
    }
    const float one = 1.0f, zero = 0.0f;
    cudnnCheck(cudnnSetConvolutionMathType(p->conv, (cudnnMathType_t)p->bwd_filter.math_type));
    cudnnCheck(cudnnConvolutionBackwardFilter(
        cb->cudnn, &one, p->x, x->data, p->y, dy->data, p->conv,
        (cudnnConvolutionBwdFilterAlgo_t)p->bwd_filter.algo, cb->workspace,
        (size_t)p->bwd_filter.workspace, &zero, p->f, df));
    size_t nw = weight_count(conv);
    int ohwi = p->nhwc;
    cuda_act_dispatch(p->dtype, [&](auto dt) {
        filter_to_oihw_kernel<decltype(dt)::value><<<cuda_blocks(nw, 256), 256, 0, cb->stream>>>(
            df, dw, conv->cout, conv->cin, conv->k, ohwi, accumulate);
    });
    cudaLaunchCheck();
}

void cuda_conv_backward_data(struct trn_backend *be, struct trn_conv *conv, const float *w,
                             const struct trn_tensor *dy, struct trn_tensor *dx)
{
    struct cuda_backend *cb = cuda_of(be);
    struct trn_conv *c = conv;
    struct conv_plan *p = plan_for(be, conv, dx);
    TRN_CHECK(cuda_nhwc(dy) == p->nhwc, "conv: dx and dy layouts differ");
    cuda_same_dtype(dx, dy, "conv_backward_data");
    const void *f = filter_of(be, conv, p, w);
    if (!p->have_bwd_data) {
        struct trn_conv_key key = key_of(cb, TRN_CONV_BWD_DATA, conv, p);
        struct trn_conv_choice choice;
        if (!trn_algo_cache_get(&cb->algos, &key, &choice)) {
            cudnnConvolutionBwdDataAlgoPerf_t res[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
            int got = 0;
            cudnnCheck(cudnnFindConvolutionBackwardDataAlgorithmEx(
                cb->cudnn, p->f, f, p->y, dy->data, p->conv, p->x, dx->data,
                CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, res, cb->workspace,
                cb->workspace_size));
            PICK(res, got, "data-gradient");
            (void)trn_algo_cache_put(&cb->algos, &key, &choice);
        }
        p->bwd_data = choice;
        p->have_bwd_data = true;
    }
    const float one = 1.0f, zero = 0.0f;
    cudnnCheck(cudnnSetConvolutionMathType(p->conv, (cudnnMathType_t)p->bwd_data.math_type));
    cudnnCheck(cudnnConvolutionBackwardData(cb->cudnn, &one, p->f, f, p->y, dy->data, p->conv,
                                            (cudnnConvolutionBwdDataAlgo_t)p->bwd_data.algo,
                                            cb->workspace, (size_t)p->bwd_data.workspace, &zero,
                                            p->x, dx->data));
}

void cuda_conv_release(struct trn_backend *be, struct trn_conv *conv)
{
    (void)be;
    struct conv_impl *ci = (struct conv_impl *)conv->impl;
    if (!ci)
        return;
    for (int i = 0; i < ci->n_plans; i++)
        plan_destroy(&ci->plans[i]);
    free(ci);
    conv->impl = NULL;
}
