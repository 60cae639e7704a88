/*
 * ops_math.h: the per-element arithmetic of the CUDA kernels, as functions
 * of their indices and inputs, shared by the kernels (the .cu files of ops/cuda/) and the
 * CPU unit tests (tests/unit/test_cuda_math.c), which check it against the
 * CPU backend. Code written without a GPU at hand is where bugs hide; this
 * way only the launch (grid, blocks, the order of a reduction) is new on the
 * GPU, and tools/gpu-check tests that.
 *
 * Plain C11 and CUDA C++ at once: TRN_HD is __host__ __device__ under nvcc
 * and nothing in C. The formulas follow ops/cpu/ step for step (the same
 * float and double operations in the same order, fmaf where the CPU uses
 * it); the CUDA code is compiled with --fmad=false so nvcc does not fuse
 * what the CPU computes as two roundings.
 *
 * Layouts: activations are NHWC on the GPU (cuDNN's fast layout); plain NCHW
 * is accepted too (the network input). Weights are OIHW in the flat
 * parameter buffer and OHWI (cuDNN's KRSC) for cuDNN with NHWC activations.
 *
 * Storage: activations are fp32, or bf16/fp16 under --amp; the kernels read
 * and write them through trn_act_get/put (the end of this file), so the
 * arithmetic between a load and a store is the fp32 arithmetic above.
 */
#ifndef CDDP_TRAINER_OPS_CUDA_OPS_MATH_H
#define CDDP_TRAINER_OPS_CUDA_OPS_MATH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h> /* memcpy: the bits of a float */

#ifdef __CUDACC__
#define TRN_HD __host__ __device__
#else
#define TRN_HD
#endif

/* ---- offsets ---- */

/* Element (n, c, p) of an (N, C, HW) activation, p = y * W + x. */
TRN_HD static inline size_t trn_nhwc_off(int n, int c, int p, int C, int HW)
{
    return ((size_t)n * HW + p) * C + c;
}

TRN_HD static inline size_t trn_nchw_off(int n, int c, int p, int C, int HW)
{
    return ((size_t)n * C + c) * HW + p;
}

/* nhwc: nonzero for NHWC, zero for NCHW. */
TRN_HD static inline size_t trn_act_off(int nhwc, int n, int c, int p, int C, int HW)
{
    return nhwc ? trn_nhwc_off(n, c, p, C, HW) : trn_nchw_off(n, c, p, C, HW);
}

/* The channel of linear element e of an (N, C, HW) activation. */
TRN_HD static inline int trn_act_channel(int nhwc, size_t e, int C, int HW)
{
    return nhwc ? (int)(e % (size_t)C) : (int)((e / (size_t)HW) % (size_t)C);
}

/* The (n, c, p) of linear element e of an (N, C, HW) activation. */
TRN_HD static inline void trn_act_coords(int nhwc, size_t e, int C, int HW, int *n, int *c, int *p)
{
    *n = (int)(e / ((size_t)C * HW));
    if (nhwc) {
        *c = (int)(e % (size_t)C);
        *p = (int)((e / (size_t)C) % (size_t)HW);
    } else {
        *p = (int)(e % (size_t)HW);
        *c = (int)((e / (size_t)HW) % (size_t)C);
    }
}

/* Weight (o, i, ky, kx) in OIHW and in OHWI (KRSC). */
TRN_HD static inline size_t trn_oihw_off(int o, int i, int ky, int kx, int I, int K)
{
    return (((size_t)o * I + i) * K + ky) * K + kx;
}

TRN_HD static inline size_t trn_ohwi_off(int o, int i, int ky, int kx, int I, int K)
{
    return (((size_t)o * K + ky) * K + kx) * I + i;
}

/* ---- batch norm (bn.c on the CPU) ---- */

/* Statistics: the mean from the double sum, then the sum of float squared
 * deviations in double, then the biased variance in float. */
TRN_HD static inline float trn_bn_mean(double sum, double count)
{
    return (float)(sum / count);
}

TRN_HD static inline float trn_bn_sqdev(float x, float mean)
{
    float d = x - mean;
    return d * d;
}

TRN_HD static inline float trn_bn_var(double sqdev_sum, double count)
{
    return (float)sqdev_sum / (float)count;
}

/*
 * The per-channel reductions' partition (bn.cu): the M = N*H*W rows are
 * split over R row groups (one block row each); in a group, thread row ty
 * (of TRN_BN_RED_Y) sums rows g*Y + ty, g*Y + ty + R*Y, ... in double; the
 * Y thread rows are added in order, then the R groups in order. R is a
 * function of M only, so a shape always reduces in the same order.
 */
enum { TRN_BN_RED_X = 32, TRN_BN_RED_Y = 8 };

TRN_HD static inline int trn_bn_row_groups(size_t M)
{
    size_t r = M / 512;
    return r < 1 ? 1 : r > 128 ? 128 : (int)r;
}

/* The prepare step for one channel; training when running_mean is not NULL. */
TRN_HD static inline void trn_bn_prepare_one(float mean, float var, double count, double eps,
                                             float mom, float weight, float bias,
                                             float *running_mean, float *running_var, float *invstd,
                                             float *scale, float *shift)
{
    float is =
        running_mean ? (float)(1.0 / sqrt((double)var + eps)) : 1.0f / sqrtf(var + (float)eps);
    *invstd = is;
    *scale = weight * is;
    *shift = fmaf(-mean, *scale, bias);
    if (running_mean) {
        double unbiased = (double)var * count / (count - 1);
        *running_mean = mom * mean + (1 - mom) * *running_mean;
        *running_var = (float)(mom * unbiased + (double)((1 - mom) * *running_var));
    }
}

/* The residual of bn_apply: none, added as is, or through its own batch norm. */
enum trn_bn_res { TRN_BN_RES_NONE, TRN_BN_RES_ADD, TRN_BN_RES_BN };

/* y = relu?(fma(x, a, b) + res'); lo is 0 with the ReLU and -inf without. */
TRN_HD static inline float trn_bn_apply_one(float x, float a, float b, int res_kind, float r,
                                            float ra, float rb, float lo)
{
    float v = fmaf(x, a, b);
    if (res_kind == TRN_BN_RES_ADD)
        v = v + r;
    else if (res_kind == TRN_BN_RES_BN)
        v = v + fmaf(r, ra, rb);
    return v < lo ? 0.0f : v;
}

/* The gradient masked by the following ReLU's output (has_ry: there is one). */
TRN_HD static inline float trn_relu_mask(float g, int has_ry, float ry)
{
    return has_ry && ry <= 0.0f ? 0.0f : g;
}

/* One element's contribution to sum_dy_xmu (accumulated in double). */
TRN_HD static inline double trn_bn_dy_xmu(float g, float x, float mean)
{
    return (double)g * (double)(x - mean);
}

/* Per channel: dx = (g - a - (x - mean) * b) * k1. */
TRN_HD static inline void trn_bn_bwd_coef(float invstd, float weight, float sum_dy,
                                          float sum_dy_xmu, double count, float *k1, float *a,
                                          float *b)
{
    *k1 = invstd * weight;
    *a = (float)(sum_dy / count);
    *b = (float)((double)sum_dy_xmu * invstd * invstd / count);
}

TRN_HD static inline float trn_bn_bwd_input_one(float g, float x, float mean, float k1, float a,
                                                float b)
{
    return (g - a - (x - mean) * b) * k1;
}

TRN_HD static inline void trn_bn_param_grad_one(float invstd, float sum_dy, float sum_dy_xmu,
                                                int accumulate, float *dweight, float *dbias)
{
    float gw = sum_dy_xmu * invstd, gb = sum_dy;
    *dweight = accumulate ? *dweight + gw : gw;
    *dbias = accumulate ? *dbias + gb : gb;
}

/* ReLU backward with the shortcut's gradient added (has_g2). */
TRN_HD static inline float trn_relu_bwd_one(float g, int has_g2, float g2, float y)
{
    float v = has_g2 ? g + g2 : g;
    return y <= 0 ? 0.0f : v;
}

/* ---- pooling (pool.c) ---- */

enum { TRN_POOL_K = 3, TRN_POOL_S = 2, TRN_POOL_P = 1 };

/* Whether v replaces the best so far: larger, or NaN (NaN wins, ties go first). */
TRN_HD static inline int trn_maxpool_takes(float v, float best)
{
    return v > best || v != v;
}

/* Input coordinate of window position k (0..2) of output o. */
TRN_HD static inline int trn_maxpool_in(int o, int k)
{
    return o * TRN_POOL_S - TRN_POOL_P + k;
}

/* The outputs whose window covers input coordinate i: o in [*lo, *hi]
 * (empty when *lo > *hi), for an output extent of n. */
TRN_HD static inline void trn_maxpool_outs(int i, int n, int *lo, int *hi)
{
    /* o * S - P <= i <= o * S - P + K - 1 */
    int a = i + TRN_POOL_P - (TRN_POOL_K - 1), b = i + TRN_POOL_P;
    int l = a <= 0 ? 0 : (a + TRN_POOL_S - 1) / TRN_POOL_S;
    int h = b / TRN_POOL_S;
    *lo = l;
    *hi = h < n - 1 ? h : n - 1;
}

TRN_HD static inline float trn_avgpool_mean(double sum, int hw)
{
    return (float)(sum / hw);
}

TRN_HD static inline float trn_avgpool_grad(float dy, int hw)
{
    return dy / hw;
}

/* ---- softmax cross-entropy (loss.c) ---- */

TRN_HD static inline float trn_xent_prob(float logit, double lse)
{
    return (float)exp((double)logit - lse);
}

/* lse = max + log(sum of exp(l - max)) */
TRN_HD static inline double trn_xent_lse(float max, double sumexp)
{
    return max + log(sumexp);
}

TRN_HD static inline float trn_xent_grad(float p, int is_label, float f)
{
    return (p - (is_label ? 1.0f : 0.0f)) * f;
}

/* ---- SGD (sgd.c) ---- */

enum trn_sgd_mode { TRN_SGD_PLAIN, TRN_SGD_FIRST, TRN_SGD_MOMENTUM };

TRN_HD static inline enum trn_sgd_mode trn_sgd_mode_of(float momentum, int first_step)
{
    return momentum == 0.0f ? TRN_SGD_PLAIN : first_step ? TRN_SGD_FIRST : TRN_SGD_MOMENTUM;
}

/* One element of torch.optim.SGD (dampening 0, no Nesterov); buf unused in PLAIN. */
TRN_HD static inline void trn_sgd_one(float *param, float grad, float *buf, float lr,
                                      float momentum, float weight_decay, int mode)
{
    float d = grad + weight_decay * *param;
    if (mode == TRN_SGD_PLAIN) {
        *param = *param - lr * d;
    } else if (mode == TRN_SGD_FIRST) {
        *buf = d;
        *param = *param - lr * d;
    } else {
        float b = momentum * *buf + d;
        *buf = b;
        *param = *param - lr * b;
    }
}

/* ---- mixed precision (amp.cu; trainer/scaler.h) ---- */

/* GradScaler's unscale of one gradient: g * inv_scale, and whether g (before
 * unscaling, as torch checks) is inf or NaN. */
TRN_HD static inline float trn_unscale_one(float g, float inv_scale, int *found_inf)
{
    if (!isfinite(g))
        *found_inf = 1;
    return g * inv_scale;
}

/* fp32 -> bf16 bits, round to nearest even (NaN stays a quiet NaN), as
 * torch's c10::BFloat16 and __float2bfloat16_rn. */
TRN_HD static inline uint16_t trn_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

TRN_HD static inline float trn_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* fp32 -> IEEE half bits, round to nearest even, overflow to inf, NaN kept
 * (as __float2half_rn). */
TRN_HD static inline uint16_t trn_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u); /* NaN */
    if (a >= 0x477ff000u)                  /* rounds to 65520 or more: inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: a subnormal half (or 0) */
        if (a < 0x33000000u)
            return (uint16_t)sign; /* below half the smallest subnormal: 0 */
        uint32_t m = (a & 0x7fffffu) | 0x800000u, e = a >> 23; /* value m * 2^(e-150) */
        uint32_t shift = 126u - e;                             /* to units of 2^-24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    /* normal: rebias the exponent (127 -> 15), round 13 bits away */
    uint32_t v = a - 0x38000000u;
    v += 0xfffu + ((v >> 13) & 1u);
    return (uint16_t)(sign | (v >> 13));
}

TRN_HD static inline float trn_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13);
    } else if (e == 0) {
        if (m == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            e = 113;
            while (!(m & 0x400u)) {
                m <<= 1;
                e--;
            }
            u = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else {
        u = sign | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* ---- activation storage (--amp: bf16/fp16 activations, fp32 arithmetic) ---- */

/* enum trn_dtype's values (ops.h, which this header does not include; the
 * unit test and backend.cu check that they agree). */
enum { TRN_DT_F32 = 0, TRN_DT_BF16 = 1, TRN_DT_F16 = 2 };

/*
 * Element i of an activation stored as dtype, widened to fp32 (exact), and
 * a value stored into one (rounded to nearest even once: the only rounding
 * a kernel adds under --amp; its arithmetic stays the fp32 functions above).
 * The kernels are templates on dtype, so the test folds at compile time.
 */
TRN_HD static inline float trn_act_get(const void *base, int dtype, size_t i)
{
    if (dtype == TRN_DT_BF16)
        return trn_bf16_to_f32(((const uint16_t *)base)[i]);
    if (dtype == TRN_DT_F16)
        return trn_f16_to_f32(((const uint16_t *)base)[i]);
    return ((const float *)base)[i];
}

TRN_HD static inline void trn_act_put(void *base, int dtype, size_t i, float v)
{
    if (dtype == TRN_DT_BF16)
        ((uint16_t *)base)[i] = trn_f32_to_bf16(v);
    else if (dtype == TRN_DT_F16)
        ((uint16_t *)base)[i] = trn_f32_to_f16(v);
    else
        ((float *)base)[i] = v;
}

/* v as a store into dtype leaves it, read back. */
TRN_HD static inline float trn_act_round(int dtype, float v)
{
    if (dtype == TRN_DT_BF16)
        return trn_bf16_to_f32(trn_f32_to_bf16(v));
    if (dtype == TRN_DT_F16)
        return trn_f16_to_f32(trn_f32_to_f16(v));
    return v;
}

/* The reorder (backend.cu), destination element e of an (N, C, HW)
 * activation: from src (layout snhwc, dtype sdt) into dst (dnhwc, ddt);
 * the network input's NCHW fp32 -> NHWC bf16/fp16 is one such pass. */
TRN_HD static inline void trn_reorder_one(const void *src, int snhwc, int sdt, void *dst, int dnhwc,
                                          int ddt, size_t e, int C, int HW)
{
    int n, c, p;
    trn_act_coords(dnhwc, e, C, HW, &n, &c, &p);
    trn_act_put(dst, ddt, e, trn_act_get(src, sdt, trn_act_off(snhwc, n, c, p, C, HW)));
}

/* ---- convolution: the filter as cuDNN reads it, and padded input channels (conv.cu) ---- */

/*
 * cuDNN may have no algorithm, or only slow ones, for a convolution whose
 * input channels are not a multiple of 8 in NHWC (the ResNet stem's 3):
 * its tensor-core kernels want NHWC channels in multiples of 8, and it pads
 * by itself only packed NCHW tensors. conv.cu then runs it on Cp channels:
 * the input with zero channels after its C, the filter with zero taps for
 * them, which adds only exact zeros to every sum; the weight gradient of
 * the real taps is read back from the first C, the input gradient from the
 * first C channels. Cp = C when C is a multiple of 8.
 */
TRN_HD static inline int trn_conv_pad_channels(int C)
{
    return (C + 7) / 8 * 8;
}

/* Element e of an (N, Cp, HW) activation (layout nhwc, dtype dt) holding
 * the (N, C, HW) src in its first C channels and zeros after. */
TRN_HD static inline float trn_pad_channel_get(const void *src, int dt, int nhwc, size_t e, int C,
                                               int Cp, int HW)
{
    int n, c, p;
    trn_act_coords(nhwc, e, Cp, HW, &n, &c, &p);
    return c < C ? trn_act_get(src, dt, trn_act_off(nhwc, n, c, p, C, HW)) : 0.0f;
}

/* Element e of an (N, C, HW) activation: channel c of the (N, Cp, HW) src. */
TRN_HD static inline float trn_unpad_channel_get(const void *src, int dt, int nhwc, size_t e, int C,
                                                 int Cp, int HW)
{
    int n, c, p;
    trn_act_coords(nhwc, e, C, HW, &n, &c, &p);
    return trn_act_get(src, dt, trn_act_off(nhwc, n, c, p, Cp, HW));
}

/* Element d of an O x Ip x K x K filter (OHWI when ohwi, else OIHW) made
 * from the OIHW fp32 weights w of I input channels: zero taps for i >= I. */
TRN_HD static inline float trn_filter_pad_get(const float *w, size_t d, int I, int Ip, int K,
                                              int ohwi)
{
    int o, i, ky, kx;
    if (ohwi) {
        i = (int)(d % (size_t)Ip);
        kx = (int)((d / Ip) % (size_t)K);
        ky = (int)((d / ((size_t)Ip * K)) % (size_t)K);
        o = (int)(d / ((size_t)Ip * K * K));
    } else {
        kx = (int)(d % (size_t)K);
        ky = (int)((d / K) % (size_t)K);
        i = (int)((d / ((size_t)K * K)) % (size_t)Ip);
        o = (int)(d / ((size_t)K * K * Ip));
    }
    return i < I ? w[trn_oihw_off(o, i, ky, kx, I, K)] : 0.0f;
}

/* Where OIHW weight e (I input channels) sits in an O x Ip x K x K filter
 * (OHWI when ohwi, else OIHW): cuDNN's weight gradient read back. */
TRN_HD static inline size_t trn_filter_unpad_off(size_t e, int I, int Ip, int K, int ohwi)
{
    int kx = (int)(e % (size_t)K), ky = (int)((e / K) % (size_t)K);
    int i = (int)((e / ((size_t)K * K)) % (size_t)I), o = (int)(e / ((size_t)K * K * I));
    return ohwi ? trn_ohwi_off(o, i, ky, kx, Ip, K) : trn_oihw_off(o, i, ky, kx, Ip, K);
}

#endif
