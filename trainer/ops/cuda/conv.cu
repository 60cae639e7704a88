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
 * Each choice is logged at debug (T2006: the algorithm, its status, math
 * type, workspace and time).
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
 * Few input channels (the stem's 3): cuDNN's tensor-core kernels want NHWC
 * channels in multiples of 8 and it pads only packed NCHW tensors itself,
 * so in NHWC bf16/fp16 it may offer nothing usable for C = 3, nor, under
 * --deterministic, for the fp32 weight gradient. When a direction's search
 * finds no usable algorithm and C is not a multiple of 8, it searches again
 * on the input padded to the next multiple of 8 with zero channels and the
 * filter with zero taps (ops_math.h: the sums gain exact zeros only), and
 * that direction then always runs padded (T2007 says so, once a shape).
 * CDDP_CUDA_CONV_PAD=1 pads such convolutions whatever the search would
 * find (to compare the two on a GPU: cuda-opcheck checks the padded stem
 * against the CPU with it). The padded input lives in a scratch buffer of
 * the backend (N x H x W x Cp), made again from x by each padded call.
 *
 * Plans (descriptors, chosen algorithms) are built per input shape on first
 * use and kept, up to MAX_PLANS per layer: the training batch, the last
 * short batch, eval.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/ops/cuda/cuda.h"
#include "trainer/ops/cuda/ops_math.h"

extern "C" {
#include "common/log.h"
}

#define MAX_PLANS 4

struct conv_plan {
    int n, h, w, oh, ow;
    int nhwc;
    enum trn_dtype dtype; /* of x, y and the filter as cuDNN sees them */
    int cpad;             /* the padded input channels; == cin when cin is a multiple of 8 */
    cudnnTensorDescriptor_t x, y, xp; /* xp: x padded to cpad channels (NULL until needed) */
    cudnnFilterDescriptor_t f, fp;    /* fp: the filter padded likewise */
    cudnnConvolutionDescriptor_t conv;
    struct trn_conv_choice fwd, bwd_data, bwd_filter; /* .padded_c: runs on xp/fp */
    bool have_fwd, have_bwd_data, have_bwd_filter;
};

struct conv_impl {
    struct conv_plan plans[MAX_PLANS];
    int n_plans;
    int lru;
};

/* ---- kernels ---- */

/* dst (O x Ip x K x K: KRSC when ohwi, else OIHW; dtype DT) from src (OIHW
 * fp32, I input channels), one thread per destination weight: the fp32
 * master weights as cuDNN reads them (cast to bf16 / fp16 under --amp,
 * autocast's cast of the weight), zero taps for the padded channels. */
template <int DT>
__global__ void filter_from_oihw_kernel(const float *src, void *dst, int O, int I, int Ip, int K,
                                        int ohwi)
{
    size_t d = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (d >= (size_t)O * Ip * K * K)
        return;
    trn_act_put(dst, DT, d, trn_filter_pad_get(src, d, I, Ip, K, ohwi));
}

/* dst (OIHW fp32, I channels) = (or +=) src (O x Ip x K x K: KRSC when
 * ohwi, else OIHW; dtype DT), one thread per weight: cuDNN's weight
 * gradient into the fp32 gradients (under --amp widened from bf16/fp16, as
 * autograd's cast back to the fp32 leaf); a padded filter's extra taps are
 * dropped. */
template <int DT>
__global__ void filter_to_oihw_kernel(const void *src, float *dst, int O, int I, int Ip, int K,
                                      int ohwi, int accumulate)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)O * I * K * K)
        return;
    float v = trn_act_get(src, DT, trn_filter_unpad_off(e, I, Ip, K, ohwi));
    dst[e] = accumulate ? dst[e] + v : v;
}

/* dst (N, Cp, HW) = src (N, C, HW) and zero channels after, or (unpad) dst
 * (N, C, HW) = the first C channels of src (N, Cp, HW); one thread per
 * destination element, the same layout and dtype on both sides. */
template <int DT>
__global__ void pad_channels_kernel(const void *src, void *dst, int nhwc, int N, int C, int Cp,
                                    int HW, int unpad)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)N * (unpad ? C : Cp) * HW)
        return;
    trn_act_put(dst, DT, e,
                unpad ? trn_unpad_channel_get(src, DT, nhwc, e, C, Cp, HW)
                      : trn_pad_channel_get(src, DT, nhwc, e, C, Cp, HW));
}

/* ---- plans ---- */

static size_t weight_count(const struct trn_conv *c, int cin)
{
    return (size_t)c->cout * cin * c->k * c->k;
}

static void plan_destroy(struct conv_plan *p)
{
    cudnnCheck(cudnnDestroyTensorDescriptor(p->x));
    cudnnCheck(cudnnDestroyTensorDescriptor(p->y));
    cudnnCheck(cudnnDestroyFilterDescriptor(p->f));
    if (p->xp)
        cudnnCheck(cudnnDestroyTensorDescriptor(p->xp));
    if (p->fp)
        cudnnCheck(cudnnDestroyFilterDescriptor(p->fp));
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

static const char *dtype_name(enum trn_dtype d)
{
    return d == TRN_BF16 ? "bf16" : d == TRN_F16 ? "fp16" : "fp32";
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
    p->cpad = trn_conv_pad_channels(c->cin);
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
    /* Room for the search and the calls, grown here only (and by a padded
     * search, on the same first step of the shape). */
    cuda_reserve(be, &cb->workspace, &cb->workspace_size, cb->opt.workspace_bytes);
    cuda_reserve(be, &cb->wbuf, &cb->wbuf_size, weight_count(c, c->cin) * sizeof(float));
    return p;
}

/* The padded descriptors and room for the padded input (or input
 * gradient) and filter; the first time a direction of this plan pads. */
static void plan_pad(struct trn_backend *be, const struct trn_conv *c, struct conv_plan *p)
{
    struct cuda_backend *cb = cuda_of(be);
    if (!p->xp) {
        cudnnTensorFormat_t fmt = p->nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
        cudnnDataType_t dt = data_type(p->dtype);
        cudnnCheck(cudnnCreateTensorDescriptor(&p->xp));
        cudnnCheck(cudnnCreateFilterDescriptor(&p->fp));
        cudnnCheck(cudnnSetTensor4dDescriptor(p->xp, fmt, dt, p->n, p->cpad, p->h, p->w));
        cudnnCheck(cudnnSetFilter4dDescriptor(p->fp, dt, fmt, c->cout, p->cpad, c->k, c->k));
    }
    size_t act = (size_t)p->n * p->cpad * p->h * p->w * trn_dtype_size(p->dtype);
    cuda_reserve(be, &cb->padbuf, &cb->padbuf_size, act);
    cuda_reserve(be, &cb->wbuf, &cb->wbuf_size, weight_count(c, p->cpad) * sizeof(float));
}

static struct trn_conv_key key_of(struct cuda_backend *cb, enum trn_conv_dir dir,
                                  const struct trn_conv *c, const struct conv_plan *p)
{
    int l = p->nhwc ? TRN_LAYOUT_NHWC : TRN_LAYOUT_NCHW;
    /* (CDDP_CUDA_CONV_PAD is read once per backend, whose cache this is) */
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

static const char *const dir_names[] = {"forward", "data-gradient", "weight-gradient"};

static const char *math_name(int m)
{
    switch (m) {
    case CUDNN_DEFAULT_MATH:
        return "default";
    case CUDNN_TENSOR_OP_MATH:
        return "tensor-op";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
        return "tensor-op-allow-conversion";
    case CUDNN_FMA_MATH:
        return "fma";
    }
    return "?";
}

/* What one search found, for the choice and, when nothing is usable, for
 * the message that lists every candidate. */
struct search {
    struct trn_conv_choice choice;
    bool found;
    int usable, got;
    char tried[768]; /* "algo status math workspace; ..." */
};

/* The first acceptable result (cuDNN sorts them fastest first), and the
 * list of all of them. Perf is a cudnnConvolution*AlgoPerf_t. */
template <typename Perf>
static void pick(struct cuda_backend *cb, const struct conv_plan *p, cudnnStatus_t find_status,
                 const Perf *res, int got, struct search *s)
{
    memset(s, 0, sizeof(*s));
    size_t len = 0;
    if (find_status != CUDNN_STATUS_SUCCESS) {
        snprintf(s->tried, sizeof(s->tried), "the search itself: %s",
                 cudnnGetErrorString(find_status));
        return;
    }
    s->got = got;
    for (int r = 0; r < got; r++) {
        bool ok =
            acceptable(cb, p, res[r].status, res[r].determinism, res[r].mathType, res[r].memory);
        if (len < sizeof(s->tried))
            len += (size_t)snprintf(
                s->tried + len, sizeof(s->tried) - len, "%s%d %s %s%s %zu B", r ? "; " : "",
                (int)res[r].algo, cudnnGetErrorString(res[r].status), math_name(res[r].mathType),
                res[r].determinism == CUDNN_DETERMINISTIC ? " det" : "", res[r].memory);
        if (!ok)
            continue;
        s->usable++;
        if (s->found)
            continue;
        s->found = true;
        s->choice.algo = (int32_t)res[r].algo;
        s->choice.math_type = (int32_t)res[r].mathType;
        s->choice.workspace = (int64_t)res[r].memory;
        s->choice.time_ms = res[r].time;
    }
}

/* Weights as cuDNN wants them for this plan, with cin_as input channels
 * (c->cin, or p->cpad when padded): converted into wbuf (KRSC for NHWC,
 * and in the plan's dtype), or w itself (fp32 NCHW, unpadded). */
static const void *filter_of(struct trn_backend *be, const struct trn_conv *c,
                             const struct conv_plan *p, const float *w, int cin_as)
{
    struct cuda_backend *cb = cuda_of(be);
    if (!p->nhwc && p->dtype == TRN_F32 && cin_as == c->cin)
        return w;
    size_t nw = weight_count(c, cin_as);
    int ohwi = p->nhwc;
    cuda_act_dispatch(p->dtype, [&](auto dt) {
        filter_from_oihw_kernel<decltype(dt)::value><<<cuda_blocks(nw, 256), 256, 0, cb->stream>>>(
            w, cb->wbuf, c->cout, c->cin, cin_as, c->k, ohwi);
    });
    cudaLaunchCheck();
    return cb->wbuf;
}

/* padbuf = x with zero channels up to p->cpad (unpad false), or dx = the
 * first cin channels of padbuf (unpad true). */
static void pad_input(struct trn_backend *be, const struct trn_conv *c, const struct conv_plan *p,
                      const void *src, void *dst, bool unpad)
{
    struct cuda_backend *cb = cuda_of(be);
    size_t total = (size_t)p->n * (unpad ? c->cin : p->cpad) * p->h * p->w;
    cuda_act_dispatch(p->dtype, [&](auto dt) {
        pad_channels_kernel<decltype(dt)::value><<<cuda_blocks(total, 256), 256, 0, cb->stream>>>(
            src, dst, p->nhwc, p->n, c->cin, p->cpad, p->h * p->w, unpad);
    });
    cudaLaunchCheck();
}

/* The search of one direction: on the plan's own descriptors, then (when
 * nothing there is usable, or CDDP_CUDA_CONV_PAD=1 asks, and cin is not a
 * multiple of 8) on the padded ones. find(padded, &s) runs cuDNN's search
 * on its descriptors and buffers and fills s. Fatal, with every candidate
 * and its status, when neither has a usable algorithm. */
template <typename Find>
static struct trn_conv_choice search_direction(struct trn_backend *be, const struct trn_conv *c,
                                               struct conv_plan *p, enum trn_conv_dir dir,
                                               Find find)
{
    struct cuda_backend *cb = cuda_of(be);
    bool can_pad = p->cpad != c->cin;
    bool force = can_pad && cb->pad_small_c;
    struct search plain, padded;
    memset(&plain, 0, sizeof(plain));
    memset(&padded, 0, sizeof(padded));
    if (!force)
        find(false, &plain);
    struct search *s = &plain;
    if (can_pad && !plain.found) {
        plan_pad(be, c, p);
        find(true, &padded);
        s = &padded;
        if (padded.found)
            log_info("T2007",
                     "conv %d->%d k%d s%d (%s %s, batch %d, %dx%d): the %s %s; it runs on %d "
                     "input channels, the rest zero",
                     c->cin, c->cout, c->k, c->stride, p->nhwc ? "NHWC" : "NCHW",
                     dtype_name(p->dtype), p->n, p->h, p->w, dir_names[dir],
                     force ? "is padded (CDDP_CUDA_CONV_PAD=1)"
                           : "has no usable algorithm for these input channels",
                     p->cpad);
    }
    TRN_CHECK(s->found,
              "cuDNN: no usable %s algorithm for conv %d->%d k%d s%d p%d (%s %s, batch %d, %dx%d; "
              "TF32 %s%s, workspace bound %zu B): candidates: %s%s%s",
              dir_names[dir], c->cin, c->cout, c->k, c->stride, c->pad, p->nhwc ? "NHWC" : "NCHW",
              dtype_name(p->dtype), p->n, p->h, p->w, cb->opt.tf32_conv ? "on" : "off",
              cb->opt.deterministic ? ", deterministic" : "", cb->workspace_size,
              force ? "(not searched: CDDP_CUDA_CONV_PAD=1)" : plain.tried,
              can_pad ? "; padded to " : "", can_pad ? padded.tried : "");
    struct trn_conv_choice choice = s->choice;
    choice.padded_c = s == &padded ? p->cpad : 0;
    log_debug("T2006",
              "conv %d->%d k%d s%d p%d (%s %s, batch %d, %dx%d) %s: algo %d (status success), math "
              "%s, workspace %lld B, %.3f ms; %d of %d candidates usable%s",
              c->cin, c->cout, c->k, c->stride, c->pad, p->nhwc ? "NHWC" : "NCHW",
              dtype_name(p->dtype), p->n, p->h, p->w, dir_names[dir], (int)choice.algo,
              math_name(choice.math_type), (long long)choice.workspace, (double)choice.time_ms,
              s->usable, s->got, choice.padded_c ? " (input channels padded)" : "");
    return choice;
}

/* ---- launchers ---- */

void cuda_conv_forward(struct trn_backend *be, struct trn_conv *conv, const struct trn_tensor *x,
                       const float *w, struct trn_tensor *y)
{
    struct cuda_backend *cb = cuda_of(be);
    cuda_op_enter("conv_forward", x, y);
    struct trn_conv *c = conv;
    struct conv_plan *p = plan_for(be, conv, x);
    TRN_CHECK(cuda_nhwc(y) == p->nhwc, "conv: x and y layouts differ");
    cuda_same_dtype(x, y, "conv_forward");
    if (!p->have_fwd) {
        struct trn_conv_key key = key_of(cb, TRN_CONV_FWD, conv, p);
        struct trn_conv_choice choice;
        if (!trn_algo_cache_get(&cb->algos, &key, &choice)) {
            choice = search_direction(be, c, p, TRN_CONV_FWD, [&](bool padded, struct search *s) {
                cudnnConvolutionFwdAlgoPerf_t res[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
                int got = 0;
                const void *xd = x->data;
                if (padded)
                    pad_input(be, c, p, x->data, cb->padbuf, false);
                const void *f = filter_of(be, c, p, w, padded ? p->cpad : c->cin);
                if (padded)
                    xd = cb->padbuf;
                cudnnStatus_t st = cudnnFindConvolutionForwardAlgorithmEx(
                    cb->cudnn, padded ? p->xp : p->x, xd, padded ? p->fp : p->f, f, p->conv, p->y,
                    y->data, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got, res, cb->workspace,
                    cb->workspace_size);
                pick(cb, p, st, res, got, s);
            });
            (void)trn_algo_cache_put(&cb->algos, &key, &choice);
        }
        p->fwd = choice;
        p->have_fwd = true;
    }
    bool padded = p->fwd.padded_c != 0;
    const void *xd = x->data;
    if (padded) {
        plan_pad(be, c, p); /* (a choice from the cache: this plan's first padded call) */
        pad_input(be, c, p, x->data, cb->padbuf, false);
        xd = cb->padbuf;
    }
    const void *f = filter_of(be, conv, p, w, padded ? p->cpad : c->cin);
    const float one = 1.0f, zero = 0.0f;
    cudnnCheck(cudnnSetConvolutionMathType(p->conv, (cudnnMathType_t)p->fwd.math_type));
    cudnnCheck(cudnnConvolutionForward(cb->cudnn, &one, padded ? p->xp : p->x, xd,
                                       padded ? p->fp : p->f, f, p->conv,
                                       (cudnnConvolutionFwdAlgo_t)p->fwd.algo, cb->workspace,
                                       (size_t)p->fwd.workspace, &zero, p->y, y->data));
}

void cuda_conv_backward_weights(struct trn_backend *be, struct trn_conv *conv,
                                const struct trn_tensor *x, const struct trn_tensor *dy, float *dw,
                                bool accumulate)
{
    struct cuda_backend *cb = cuda_of(be);
    cuda_op_enter("conv_backward_weights", x, dy);
    struct trn_conv *c = conv;
    struct conv_plan *p = plan_for(be, conv, x);
    TRN_CHECK(cuda_nhwc(dy) == p->nhwc, "conv: x and dy layouts differ");
    cuda_same_dtype(x, dy, "conv_backward_weights");
    if (!p->have_bwd_filter) {
        struct trn_conv_key key = key_of(cb, TRN_CONV_BWD_FILTER, conv, p);
        struct trn_conv_choice choice;
        if (!trn_algo_cache_get(&cb->algos, &key, &choice)) {
            choice =
                search_direction(be, c, p, TRN_CONV_BWD_FILTER, [&](bool padded, struct search *s) {
                    cudnnConvolutionBwdFilterAlgoPerf_t
                        res[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
                    int got = 0;
                    const void *xd = x->data;
                    if (padded) {
                        pad_input(be, c, p, x->data, cb->padbuf, false);
                        xd = cb->padbuf;
                    }
                    cudnnStatus_t st = cudnnFindConvolutionBackwardFilterAlgorithmEx(
                        cb->cudnn, padded ? p->xp : p->x, xd, p->y, dy->data, p->conv,
                        padded ? p->fp : p->f, cb->wbuf, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                        &got, res, cb->workspace, cb->workspace_size);
                    pick(cb, p, st, res, got, s);
                });
            (void)trn_algo_cache_put(&cb->algos, &key, &choice);
        }
        p->bwd_filter = choice;
        p->have_bwd_filter = true;
    }
    bool padded = p->bwd_filter.padded_c != 0;
    int cin_as = padded ? p->cpad : c->cin;
    const void *xd = x->data;
    if (padded) {
        plan_pad(be, c, p);
        pad_input(be, c, p, x->data, cb->padbuf, false);
        xd = cb->padbuf;
    }
    void *df = cb->wbuf; /* cuDNN's filter layout and dtype; set or added into dw below */
    const float one = 1.0f, zero = 0.0f;
    cudnnCheck(cudnnSetConvolutionMathType(p->conv, (cudnnMathType_t)p->bwd_filter.math_type));
    cudnnCheck(cudnnConvolutionBackwardFilter(
        cb->cudnn, &one, padded ? p->xp : p->x, xd, p->y, dy->data, p->conv,
        (cudnnConvolutionBwdFilterAlgo_t)p->bwd_filter.algo, cb->workspace,
        (size_t)p->bwd_filter.workspace, &zero, padded ? p->fp : p->f, df));
    size_t nw = weight_count(conv, conv->cin);
    int ohwi = p->nhwc;
    cuda_act_dispatch(p->dtype, [&](auto dt) {
        filter_to_oihw_kernel<decltype(dt)::value><<<cuda_blocks(nw, 256), 256, 0, cb->stream>>>(
            df, dw, conv->cout, conv->cin, cin_as, conv->k, ohwi, accumulate);
    });
    cudaLaunchCheck();
}

void cuda_conv_backward_data(struct trn_backend *be, struct trn_conv *conv, const float *w,
                             const struct trn_tensor *dy, struct trn_tensor *dx)
{
    struct cuda_backend *cb = cuda_of(be);
    cuda_op_enter("conv_backward_data", dy, dx);
    struct trn_conv *c = conv;
    struct conv_plan *p = plan_for(be, conv, dx);
    TRN_CHECK(cuda_nhwc(dy) == p->nhwc, "conv: dx and dy layouts differ");
    cuda_same_dtype(dx, dy, "conv_backward_data");
    if (!p->have_bwd_data) {
        struct trn_conv_key key = key_of(cb, TRN_CONV_BWD_DATA, conv, p);
        struct trn_conv_choice choice;
        if (!trn_algo_cache_get(&cb->algos, &key, &choice)) {
            choice =
                search_direction(be, c, p, TRN_CONV_BWD_DATA, [&](bool padded, struct search *s) {
                    cudnnConvolutionBwdDataAlgoPerf_t res[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
                    int got = 0;
                    const void *f = filter_of(be, c, p, w, padded ? p->cpad : c->cin);
                    cudnnStatus_t st = cudnnFindConvolutionBackwardDataAlgorithmEx(
                        cb->cudnn, padded ? p->fp : p->f, f, p->y, dy->data, p->conv,
                        padded ? p->xp : p->x, padded ? cb->padbuf : dx->data,
                        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, res, cb->workspace,
                        cb->workspace_size);
                    pick(cb, p, st, res, got, s);
                });
            (void)trn_algo_cache_put(&cb->algos, &key, &choice);
        }
        p->bwd_data = choice;
        p->have_bwd_data = true;
    }
    bool padded = p->bwd_data.padded_c != 0;
    if (padded)
        plan_pad(be, c, p);
    const void *f = filter_of(be, conv, p, w, padded ? p->cpad : c->cin);
    const float one = 1.0f, zero = 0.0f;
    cudnnCheck(cudnnSetConvolutionMathType(p->conv, (cudnnMathType_t)p->bwd_data.math_type));
    cudnnCheck(cudnnConvolutionBackwardData(cb->cudnn, &one, padded ? p->fp : p->f, f, p->y,
                                            dy->data, p->conv,
                                            (cudnnConvolutionBwdDataAlgo_t)p->bwd_data.algo,
                                            cb->workspace, (size_t)p->bwd_data.workspace, &zero,
                                            padded ? p->xp : p->x, padded ? cb->padbuf : dx->data));
    if (padded)
        pad_input(be, c, p, cb->padbuf, dx->data, true);
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
