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
 * Numerics follow PyTorch's CPU kernels: the forward step for step (see
 * below), so a value near zero lands on the same side of the next ReLU as
 * in PyTorch; backward sums are accumulated in double. Per-image partial
 * results are combined in a fixed order, so nothing here depends on the
 * number of threads.
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

/*
 * PyTorch's arithmetic, step for step, so the normalised values (and hence
 * which side of zero the following ReLU puts them) agree to the bit:
 *   mean    = (float)(sum of x, in double / N)
 *   var_sum = (float)(sum, in double, of the float (x - mean)^2)
 *   var     = var_sum / N, in float
 * Per-image partial sums are added in image order (deterministic for any
 * number of threads; in double the order hardly ever shows in the float).
 */
static inline __attribute__((always_inline)) void run_sum(const float *x, int hw, const int B,
                                                          double *out)
{
    double s[16] = {0};
    for (int p = 0; p < hw; p++)
        for (int l = 0; l < B; l++)
            s[l] += x[(size_t)p * B + l];
    for (int l = 0; l < B; l++)
        out[l] = s[l];
}

static inline __attribute__((always_inline)) void run_sqdev(const float *x, int hw, const int B,
                                                            const float *mean, double *out)
{
    double q[16] = {0};
    float m[16];
    for (int l = 0; l < B; l++)
        m[l] = mean[l];
    for (int p = 0; p < hw; p++)
        for (int l = 0; l < B; l++) {
            float d = x[(size_t)p * B + l] - m[l];
            q[l] += d * d;
        }
    for (int l = 0; l < B; l++)
        out[l] = q[l];
}

/* Sums part (N, C) over the images, in order, into out (C). */
static void merge_images(const struct view *v, const double *part, double *out)
{
    for (int c = 0; c < v->c; c++) {
        double s = 0;
        for (int i = 0; i < v->n; i++)
            s += part[(size_t)i * v->c + c];
        out[c] = s;
    }
}

TRN_CPU_CLONES
void cpu_bn_stats(struct trn_backend *be, const struct trn_tensor *x, float *mean, float *var)
{
    (void)be;
    struct view v = view_of(x);
    double *part = trn_malloc(sizeof(double) * (size_t)(v.n + 1) * v.c);
    double *tot = part + (size_t)v.n * v.c;
    long count = (long)v.n * v.hw;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < v.n * v.cb; t++) {
        int i = t / v.cb, j = t % v.cb;
        const float *xp = x->data + run_off(&v, i, j);
        double *o = part + (size_t)i * v.c + (size_t)j * v.b;
        switch (v.b) {
        case 16:
            run_sum(xp, v.hw, 16, o);
            break;
        case 8:
            run_sum(xp, v.hw, 8, o);
            break;
        default:
            run_sum(xp, v.hw, 1, o);
            break;
        }
    }
    merge_images(&v, part, tot);
    for (int c = 0; c < v.c; c++)
        mean[c] = (float)(tot[c] / (double)count);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < v.n * v.cb; t++) {
        int i = t / v.cb, j = t % v.cb;
        const float *xp = x->data + run_off(&v, i, j);
        double *o = part + (size_t)i * v.c + (size_t)j * v.b;
        switch (v.b) {
        case 16:
            run_sqdev(xp, v.hw, 16, mean + j * 16, o);
            break;
        case 8:
            run_sqdev(xp, v.hw, 8, mean + j * 8, o);
            break;
        default:
            run_sqdev(xp, v.hw, 1, mean + j, o);
            break;
        }
    }
    merge_images(&v, part, tot);
    for (int c = 0; c < v.c; c++)
        var[c] = (float)tot[c] / (float)count;
    free(part);
}

void cpu_bn_prepare(struct trn_backend *be, int c, const float *mean, const float *var,
                    double count, double eps, double momentum, const float *weight,
                    const float *bias, float *running_mean, float *running_var, float *invstd,
                    float *scale, float *shift)
{
    (void)be;
    float mom = (float)momentum; /* PyTorch casts the momentum to the parameters' type */
    for (int i = 0; i < c; i++) {
        /* training: 1/sqrt in double from the batch variance; eval (no running
         * pointers): in float from the running variance, as PyTorch does */
        float is = running_mean ? (float)(1.0 / sqrt((double)var[i] + eps))
                                : 1.0f / sqrtf(var[i] + (float)eps);
        invstd[i] = is;
        scale[i] = weight[i] * is;
        shift[i] = fmaf(-mean[i], scale[i], bias[i]);
        if (running_mean) {
            /* count 1 cannot happen: resnet.c refuses a batch with one value per channel. */
            double unbiased = (double)var[i] * count / (count - 1);
            running_mean[i] = mom * mean[i] + (1 - mom) * running_mean[i];
            running_var[i] = (float)(mom * unbiased + (double)((1 - mom) * running_var[i]));
        }
    }
}

/* ---- the transform (+ residual) (+ ReLU) ---- */

/*
 * y = relu?(fma(x, a, b) [+ r | + fma(r, ra, rb)]): PyTorch computes the batch
 * norm as one fused multiply-add, then adds the shortcut. Every condition is
 * hoisted out of the loops (the ReLU as a floor of 0 or -inf) so the lane
 * loops compile to vector instructions without branches: a branch on the
 * sign of an activation is a coin flip the CPU mispredicts half the time.
 */
static inline __attribute__((always_inline)) void
apply_run(const float *x, const float *r, float *y, int hw, const int B, const float *a,
          const float *b, const float *ra, const float *rb, float lo)
{
    float A[16], S[16], RA[16], RB[16];
    for (int l = 0; l < B; l++) {
        A[l] = a[l];
        S[l] = b[l];
        RA[l] = ra ? ra[l] : 1.0f;
        RB[l] = rb ? rb[l] : 0.0f;
    }
    if (!r) {
        for (int p = 0; p < hw; p++) {
            const float *xp = x + (size_t)p * B;
            float *yp = y + (size_t)p * B;
#pragma omp simd
            for (int l = 0; l < B; l++) {
                float v = fmaf(xp[l], A[l], S[l]);
                yp[l] = v < lo ? 0.0f : v;
            }
        }
    } else if (!ra) {
        for (int p = 0; p < hw; p++) {
            const float *xp = x + (size_t)p * B, *rp = r + (size_t)p * B;
            float *yp = y + (size_t)p * B;
#pragma omp simd
            for (int l = 0; l < B; l++) {
                float v = fmaf(xp[l], A[l], S[l]) + rp[l];
                yp[l] = v < lo ? 0.0f : v;
            }
        }
    } else {
        for (int p = 0; p < hw; p++) {
            const float *xp = x + (size_t)p * B, *rp = r + (size_t)p * B;
            float *yp = y + (size_t)p * B;
#pragma omp simd
            for (int l = 0; l < B; l++) {
                float v = fmaf(xp[l], A[l], S[l]) + fmaf(rp[l], RA[l], RB[l]);
                yp[l] = v < lo ? 0.0f : v;
            }
        }
    }
}

TRN_CPU_CLONES
void cpu_bn_apply(struct trn_backend *be, const struct trn_tensor *x, const float *scale,
                  const float *shift, const struct trn_tensor *res, const float *res_scale,
                  const float *res_shift, bool relu, struct trn_tensor *y)
{
    (void)be;
    struct view v = view_of(x);
    float lo = relu ? 0.0f : -INFINITY;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < v.n * v.cb; t++) {
        int i = t / v.cb, j = t % v.cb, c0 = j * v.b;
        size_t o = run_off(&v, i, j);
        const float *r = res ? res->data + o : NULL;
        const float *ra = res_scale ? res_scale + c0 : NULL;
        const float *rb = res_shift ? res_shift + c0 : NULL;
        switch (v.b) {
        case 16:
            apply_run(x->data + o, r, y->data + o, v.hw, 16, scale + c0, shift + c0, ra, rb, lo);
            break;
        case 8:
            apply_run(x->data + o, r, y->data + o, v.hw, 8, scale + c0, shift + c0, ra, rb, lo);
            break;
        default:
            apply_run(x->data + o, r, y->data + o, v.hw, 1, scale + c0, shift + c0, ra, rb, lo);
            break;
        }
    }
}

/* ---- backward ---- */

/* g = dy, masked by ry > 0 when ry is given (the ReLU after this batch norm). */
static inline __attribute__((always_inline)) void reduce_run(const float *x, const float *dy,
                                                             const float *ry, int hw, const int B,
                                                             const float *mean, double *sdy,
                                                             double *sdx)
{
    double s[B], q[B]; /* B is a constant here (inlined): registers */
    float M[B];
    for (int l = 0; l < B; l++) {
        M[l] = mean[l];
        s[l] = q[l] = 0;
    }
    for (int p = 0; p < hw; p++) {
        const float *xp = x + (size_t)p * B, *gp = dy + (size_t)p * B;
        if (ry) {
            const float *yp = ry + (size_t)p * B;
#pragma omp simd
            for (int l = 0; l < B; l++) {
                float gl = gp[l], g = yp[l] <= 0.0f ? 0.0f : gl;
                s[l] += g;
                q[l] += (double)g * (double)(xp[l] - M[l]);
            }
        } else {
#pragma omp simd
            for (int l = 0; l < B; l++) {
                s[l] += gp[l];
                q[l] += (double)gp[l] * (double)(xp[l] - M[l]);
            }
        }
    }
    for (int l = 0; l < B; l++) {
        sdy[l] = s[l];
        sdx[l] = q[l];
    }
}

TRN_CPU_CLONES
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
    for (int p = 0; p < hw; p++) {
        const float *xp = x + (size_t)p * B, *gp = dy + (size_t)p * B;
        float *dp = dx + (size_t)p * B;
        if (ry) {
            const float *yp = ry + (size_t)p * B;
#pragma omp simd
            for (int l = 0; l < B; l++) {
                float gl = gp[l], g = yp[l] <= 0.0f ? 0.0f : gl;
                dp[l] = (g - A[l] - (xp[l] - M[l]) * Bq[l]) * K[l];
            }
        } else {
#pragma omp simd
            for (int l = 0; l < B; l++)
                dp[l] = (gp[l] - A[l] - (xp[l] - M[l]) * Bq[l]) * K[l];
        }
    }
}

TRN_CPU_CLONES
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

TRN_CPU_CLONES
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
        for (size_t e = 0; e < n; e++) {
            float v = g[e] + g2[e]; /* loaded unconditionally: no branch in the loop */
            out[e] = yy[e] <= 0 ? 0.0f : v;
        }
    } else {
#pragma omp parallel for simd schedule(static)
        for (size_t e = 0; e < n; e++) {
            float v = g[e];
            out[e] = yy[e] <= 0 ? 0.0f : v;
        }
    }
}
