/*
 * bn.c: batch normalisation, and the ReLU and residual add fused with it.
 *
 * Training-mode batch norm normalises each channel with the mean and
 * (biased) variance of the batch over (N, H, W), then scales and shifts:
 * y = weight * (x - mean) / sqrt(var + eps) + bias. PyTorch splits it into
 * statistics and an elementwise transform, and SyncBatchNorm replaces the
 * statistics with all ranks'; we split it the same way (see ops.h), and do
 * the same in backward (per-channel sums, then the elementwise gradient).
 *
 * Layouts: the kernels take any layout of the form (N, C/B, H, W, B): the
 * blocked nChw8c/nChw16c (B = 8, 16) and plain NCHW (B = 1). A channel's
 * values are then B-strided runs of H*W, one run per image.
 *
 * Numerics follow PyTorch's CPU kernels: statistics and backward sums are
 * accumulated in double. Per-image partial results are combined in a fixed
 * order (Chan's formula for the variance), so the result does not depend on
 * the number of threads, and neither does anything else here.
 *
 * ResNet always follows a batch norm with a ReLU, sometimes after adding
 * the shortcut; bn_apply does the three in one pass, and the backward
 * functions take the ReLU's output to mask the incoming gradient on the fly.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/ops/cpu/cpu.h"

/* Index helpers for the (N, C/B, HW, B) view. */
struct view {
    int n, c, hw, b, cb; /* cb = C / B channel blocks */
};

static struct view view_of(const struct trn_tensor *t)
{
    struct view v = {t->n, t->c, t->h * t->w, trn_layout_block(t->layout), 0};
    TRN_CHECK(v.c % v.b == 0, "batch norm: %d channels in a %d-blocked layout", v.c, v.b);
    v.cb = v.c / v.b;
    return v;
}

/* Start of the run of image i, channel block j. */
static inline size_t run_off(const struct view *v, int i, int j)
{
    return ((size_t)i * v->cb + j) * (size_t)v->hw * v->b;
}

/* ---- statistics ---- */

/* Per image and channel: mean and sum of squared deviations of one run. The
 * run (H*W*B floats) is read twice while it sits in cache. */
static inline __attribute__((always_inline)) void run_moments(const float *x, int hw, const int B,
                                                              double *mean, double *m2)
{
    double s[16] = {0}, q[16] = {0};
    for (int p = 0; p < hw; p++)
        for (int l = 0; l < B; l++)
            s[l] += x[(size_t)p * B + l];
    for (int l = 0; l < B; l++)
        s[l] /= hw;
    for (int p = 0; p < hw; p++)
        for (int l = 0; l < B; l++) {
            double d = x[(size_t)p * B + l] - s[l];
            q[l] += d * d;
        }
    for (int l = 0; l < B; l++) {
        mean[l] = s[l];
        m2[l] = q[l];
    }
}

void cpu_bn_stats(struct trn_backend *be, const struct trn_tensor *x, float *mean, float *var)
{
    (void)be;
    struct view v = view_of(x);
    /* part_mean/part_m2: (N, C) per-image moments, merged below in image order. */
    double *part = trn_malloc(sizeof(double) * 2 * (size_t)v.n * v.c);
    double *pmean = part, *pm2 = part + (size_t)v.n * v.c;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < v.n * v.cb; t++) {
        int i = t / v.cb, j = t % v.cb;
        const float *xp = x->data + run_off(&v, i, j);
        size_t o = (size_t)i * v.c + (size_t)j * v.b;
        switch (v.b) {
        case 16:
            run_moments(xp, v.hw, 16, pmean + o, pm2 + o);
            break;
        case 8:
            run_moments(xp, v.hw, 8, pmean + o, pm2 + o);
            break;
        default:
            run_moments(xp, v.hw, 1, pmean + o, pm2 + o);
            break;
        }
    }
    /* Chan et al.: merge equal-sized groups of hw values one image at a time. */
    for (int c = 0; c < v.c; c++) {
        double m = pmean[c], m2 = pm2[c], cnt = v.hw;
        for (int i = 1; i < v.n; i++) {
            double mi = pmean[(size_t)i * v.c + c], d = mi - m, tot = cnt + v.hw;
            m += d * v.hw / tot;
            m2 += pm2[(size_t)i * v.c + c] + d * d * cnt * v.hw / tot;
            cnt = tot;
        }
        mean[c] = (float)m;
        var[c] = (float)(m2 / cnt);
    }
    free(part);
}

void cpu_bn_prepare(struct trn_backend *be, int c, const float *mean, const float *var,
                    double count, double eps, double momentum, const float *weight,
                    const float *bias, float *running_mean, float *running_var, float *invstd,
                    float *scale, float *shift)
{
    (void)be;
    for (int i = 0; i < c; i++) {
        float is = (float)(1.0 / sqrt((double)var[i] + eps));
        invstd[i] = is;
        scale[i] = weight[i] * is;
        shift[i] = bias[i] - mean[i] * scale[i];
        if (running_mean) {
            /* count 1 cannot happen: resnet.c refuses a batch with one value per channel. */
            double unbiased = (double)var[i] * count / (count - 1);
            running_mean[i] = (float)(momentum * mean[i] + (1 - momentum) * running_mean[i]);
            running_var[i] = (float)(momentum * unbiased + (1 - momentum) * running_var[i]);
        }
    }
}

/* ---- the transform (+ residual) (+ ReLU) ---- */

static inline __attribute__((always_inline)) void
apply_run(const float *x, const float *r, float *y, int hw, const int B, const float *a,
          const float *b, const float *ra, const float *rb, bool relu)
{
    float A[16], Bc[16], RA[16], RB[16];
    for (int l = 0; l < B; l++) {
        A[l] = a[l];
        Bc[l] = b[l];
        RA[l] = ra ? ra[l] : 1.0f;
        RB[l] = rb ? rb[l] : 0.0f;
    }
    if (!r) {
        for (int p = 0; p < hw; p++)
            for (int l = 0; l < B; l++) {
                float v = A[l] * x[(size_t)p * B + l] + Bc[l];
                y[(size_t)p * B + l] = relu && v < 0 ? 0 : v;
            }
    } else {
        for (int p = 0; p < hw; p++)
            for (int l = 0; l < B; l++) {
                float v = A[l] * x[(size_t)p * B + l] + Bc[l];
                v += RA[l] * r[(size_t)p * B + l] + RB[l];
                y[(size_t)p * B + l] = relu && v < 0 ? 0 : v;
            }
    }
}

void cpu_bn_apply(struct trn_backend *be, const struct trn_tensor *x, const float *scale,
                  const float *shift, const struct trn_tensor *res, const float *res_scale,
                  const float *res_shift, bool relu, struct trn_tensor *y)
{
    (void)be;
    struct view v = view_of(x);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < v.n * v.cb; t++) {
        int i = t / v.cb, j = t % v.cb, c0 = j * v.b;
        size_t o = run_off(&v, i, j);
        const float *r = res ? res->data + o : NULL;
        const float *ra = res_scale ? res_scale + c0 : NULL;
        const float *rb = res_shift ? res_shift + c0 : NULL;
        switch (v.b) {
        case 16:
            apply_run(x->data + o, r, y->data + o, v.hw, 16, scale + c0, shift + c0, ra, rb, relu);
            break;
        case 8:
            apply_run(x->data + o, r, y->data + o, v.hw, 8, scale + c0, shift + c0, ra, rb, relu);
            break;
        default:
            apply_run(x->data + o, r, y->data + o, v.hw, 1, scale + c0, shift + c0, ra, rb, relu);
            break;
        }
    }
}

/* ---- backward ---- */

static inline __attribute__((always_inline)) void reduce_run(const float *x, const float *dy,
                                                             const float *ry, int hw, const int B,
                                                             const float *mean, double *sdy,
                                                             double *sdx)
{
    double s[16] = {0}, q[16] = {0};
    float M[16];
    for (int l = 0; l < B; l++)
        M[l] = mean[l];
    for (int p = 0; p < hw; p++)
        for (int l = 0; l < B; l++) {
            size_t e = (size_t)p * B + l;
            float g = ry && ry[e] <= 0 ? 0 : dy[e];
            s[l] += g;
            q[l] += (double)g * (x[e] - M[l]);
        }
    for (int l = 0; l < B; l++) {
        sdy[l] = s[l];
        sdx[l] = q[l];
    }
}

void cpu_bn_backward_reduce(struct trn_backend *be, const struct trn_tensor *x,
                            const struct trn_tensor *dy, const struct trn_tensor *relu_y,
                            const float *mean, float *sum_dy, float *sum_dy_xmu)
{
    (void)be;
    struct view v = view_of(x);
    double *part = trn_malloc(sizeof(double) * 2 * (size_t)v.n * v.c);
    double *ps = part, *pq = part + (size_t)v.n * v.c;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < v.n * v.cb; t++) {
        int i = t / v.cb, j = t % v.cb, c0 = j * v.b;
        size_t o = run_off(&v, i, j), po = (size_t)i * v.c + c0;
        const float *ry = relu_y ? relu_y->data + o : NULL;
        switch (v.b) {
        case 16:
            reduce_run(x->data + o, dy->data + o, ry, v.hw, 16, mean + c0, ps + po, pq + po);
            break;
        case 8:
            reduce_run(x->data + o, dy->data + o, ry, v.hw, 8, mean + c0, ps + po, pq + po);
            break;
        default:
            reduce_run(x->data + o, dy->data + o, ry, v.hw, 1, mean + c0, ps + po, pq + po);
            break;
        }
    }
    for (int c = 0; c < v.c; c++) {
        double s = 0, q = 0;
        for (int i = 0; i < v.n; i++) {
            s += ps[(size_t)i * v.c + c];
            q += pq[(size_t)i * v.c + c];
        }
        sum_dy[c] = (float)s;
        sum_dy_xmu[c] = (float)q;
    }
    free(part);
}

void cpu_bn_param_grads(struct trn_backend *be, int c, const float *invstd, const float *sum_dy,
                        const float *sum_dy_xmu, float *dweight, float *dbias, bool accumulate)
{
    (void)be;
    for (int i = 0; i < c; i++) {
        float gw = sum_dy_xmu[i] * invstd[i], gb = sum_dy[i];
        dweight[i] = accumulate ? dweight[i] + gw : gw;
        dbias[i] = accumulate ? dbias[i] + gb : gb;
    }
}

static inline __attribute__((always_inline)) void
input_run(const float *x, const float *dy, const float *ry, float *dx, int hw, const int B,
          const float *mean, const float *k1, const float *a, const float *b)
{
    float M[16], K[16], A[16], Bq[16];
    for (int l = 0; l < B; l++) {
        M[l] = mean[l];
        K[l] = k1[l];
        A[l] = a[l];
        Bq[l] = b[l];
    }
    for (int p = 0; p < hw; p++)
        for (int l = 0; l < B; l++) {
            size_t e = (size_t)p * B + l;
            float g = ry && ry[e] <= 0 ? 0 : dy[e];
            dx[e] = (g - A[l] - (x[e] - M[l]) * Bq[l]) * K[l];
        }
}

void cpu_bn_backward_input(struct trn_backend *be, const struct trn_tensor *x,
                           const struct trn_tensor *dy, const struct trn_tensor *relu_y,
                           const float *mean, const float *invstd, const float *weight,
                           const float *sum_dy, const float *sum_dy_xmu, double count,
                           struct trn_tensor *dx)
{
    (void)be;
    struct view v = view_of(x);
    /* Per channel: dx = (g - a - (x - mean) * b) * k1. */
    float *coef = trn_malloc(sizeof(float) * 3 * (size_t)v.c);
    float *k1 = coef, *a = coef + v.c, *b = coef + 2 * v.c;
    for (int c = 0; c < v.c; c++) {
        k1[c] = invstd[c] * weight[c];
        a[c] = (float)(sum_dy[c] / count);
        b[c] = (float)((double)sum_dy_xmu[c] * invstd[c] * invstd[c] / count);
    }
#pragma omp parallel for schedule(static)
    for (int t = 0; t < v.n * v.cb; t++) {
        int i = t / v.cb, j = t % v.cb, c0 = j * v.b;
        size_t o = run_off(&v, i, j);
        const float *ry = relu_y ? relu_y->data + o : NULL;
        switch (v.b) {
        case 16:
            input_run(x->data + o, dy->data + o, ry, dx->data + o, v.hw, 16, mean + c0, k1 + c0,
                      a + c0, b + c0);
            break;
        case 8:
            input_run(x->data + o, dy->data + o, ry, dx->data + o, v.hw, 8, mean + c0, k1 + c0,
                      a + c0, b + c0);
            break;
        default:
            input_run(x->data + o, dy->data + o, ry, dx->data + o, v.hw, 1, mean + c0, k1 + c0,
                      a + c0, b + c0);
            break;
        }
    }
    free(coef);
}

/* ---- ReLU backward (with the shortcut's gradient added) ---- */

void cpu_relu_backward(struct trn_backend *be, const struct trn_tensor *dy,
                       const struct trn_tensor *dy2, const struct trn_tensor *y,
                       struct trn_tensor *dx)
{
    (void)be;
    size_t n = trn_tensor_numel(dy);
    const float *g = dy->data, *g2 = dy2 ? dy2->data : NULL, *yy = y->data;
    float *out = dx->data;
    if (g2) {
#pragma omp parallel for simd schedule(static)
        for (size_t e = 0; e < n; e++)
            out[e] = yy[e] > 0 ? g[e] + g2[e] : 0.0f;
    } else {
#pragma omp parallel for simd schedule(static)
        for (size_t e = 0; e < n; e++)
            out[e] = yy[e] > 0 ? g[e] : 0.0f;
    }
}
