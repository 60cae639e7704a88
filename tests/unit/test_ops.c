/*
 * Unit tests for the CPU ops backend (trainer/ops/cpu/), through the trn_ops
 * table a CUDA backend will fill too.
 *
 * Each op's forward is compared with a plain reference written here (loops
 * over NCHW, double accumulation), and each op's backward with central
 * finite differences of a scalar loss L = sum(r * y) for a fixed random r:
 * the analytic gradient must match (L(p + eps) - L(p - eps)) / 2 eps, the
 * loss evaluated in double. Activations are tested in the backend's blocked
 * layout and in plain NCHW.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/ops/ops.h"

#include "cpu_backend_fixture.h"

/* ---- helpers ---- */

static uint64_t rng_state = 42;

static double urand(void) /* [0, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static float nrand(void)
{
    double u = urand() + 1e-12, v = urand();
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

static float *randn(size_t n)
{
    float *p = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        p[i] = nrand();
    return p;
}

static float *zeros(size_t n)
{
    return calloc(n, sizeof(float));
}

static struct trn_tensor tensor(float *data, int n, int c, int h, int w, enum trn_layout l)
{
    struct trn_tensor t = {data, n, c, h, w, TRN_F32, l, TRN_DEVICE_CPU};
    return t;
}

/* A copy of NCHW data in layout l (the caller frees .data). */
static struct trn_tensor to_layout(const float *nchw, int n, int c, int h, int w, enum trn_layout l)
{
    size_t numel = (size_t)n * c * h * w;
    struct trn_tensor src = tensor((float *)nchw, n, c, h, w, TRN_LAYOUT_NCHW);
    struct trn_tensor dst = tensor(be.ops->alloc(&be, numel * sizeof(float)), n, c, h, w, l);
    be.ops->reorder(&be, &src, &dst);
    return dst;
}

/* t's data as NCHW (malloc'd). */
static float *to_nchw(const struct trn_tensor *t)
{
    size_t numel = trn_tensor_numel(t);
    float *out = malloc(numel * sizeof(float));
    struct trn_tensor dst = tensor(out, t->n, t->c, t->h, t->w, TRN_LAYOUT_NCHW);
    be.ops->reorder(&be, t, &dst);
    return out;
}

static double dot(const float *a, const float *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* max |got - want| / max(max |want|, floor): one number per tensor. */
static double rel_err(const float *got, const double *want, size_t n, double floor)
{
    double d = 0, m = floor;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs(got[i] - want[i]));
        m = fmax(m, fabs(want[i]));
    }
    return d / m;
}

/* A scalar loss of the current inputs, for finite differences. A loss with
 * a kink (a ReLU) sets kink_sig to a hash of which side of it each value is
 * on, so fd_check can tell when a perturbation crossed one. */
typedef double (*loss_fn)(void *ctx);
static uint64_t kink_sig;

static uint64_t mask_hash(const float *y, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (y[i] > 0)) * 1099511628211ull;
    return h;
}

/*
 * Checks analytic[i] against central differences of loss() for `samples`
 * indices spread over p[0..n) (all of them if n <= samples). Fails with the
 * worst index when the error exceeds tol relative to the largest gradient.
 */
static void fd_check(const char *what, float *p, size_t n, const float *analytic, loss_fn loss,
                     void *ctx, float eps, size_t samples, double tol)
{
    size_t step = n <= samples ? 1 : n / samples;
    double worst = 0, scale = 1e-3;
    size_t worst_i = 0;
    double worst_fd = 0;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(analytic[i]));
    for (size_t i = 0; i < n; i += step) {
        float keep = p[i], e = eps;
        double lp, lm;
        /* Shrink the step while it crosses a kink; skip the index if it still does. */
        int tries = 0;
        for (;; tries++) {
            kink_sig = 0;
            loss(ctx);
            uint64_t sig = kink_sig;
            p[i] = keep + e;
            lp = loss(ctx);
            uint64_t sp = kink_sig;
            p[i] = keep - e;
            lm = loss(ctx);
            uint64_t sm = kink_sig;
            p[i] = keep;
            if ((sp == sig && sm == sig) || tries == 4)
                break;
            e /= 4;
        }
        if (tries == 4)
            continue;
        double fd = (lp - lm) / (2.0 * (double)e);
        double err = fabs(fd - analytic[i]) / scale;
        if (err > worst) {
            worst = err;
            worst_i = i;
            worst_fd = fd;
        }
    }
    if (worst > tol)
        fail_msg("%s: gradient[%zu] = %g, finite difference %g (error %.3g of max %.3g > %.3g)",
                 what, worst_i, (double)analytic[worst_i], worst_fd, worst, scale, tol);
}

static const enum trn_layout layouts[] = {TRN_LAYOUT_NCHW, TRN_LAYOUT_NCHW8C};

/* ---- convolution ---- */

static void conv_ref(const float *x, const float *w, double *y, int n, int cin, int h, int wd,
                     int cout, int k, int s, int pad, int oh, int ow)
{
    for (int i = 0; i < n; i++)
        for (int o = 0; o < cout; o++)
            for (int oy = 0; oy < oh; oy++)
                for (int ox = 0; ox < ow; ox++) {
                    double acc = 0;
                    for (int c = 0; c < cin; c++)
                        for (int ky = 0; ky < k; ky++)
                            for (int kx = 0; kx < k; kx++) {
                                int iy = oy * s - pad + ky, ix = ox * s - pad + kx;
                                if (iy < 0 || iy >= h || ix < 0 || ix >= wd)
                                    continue;
                                acc += (double)x[(((size_t)i * cin + c) * h + iy) * wd + ix] *
                                       w[(((size_t)o * cin + c) * k + ky) * k + kx];
                            }
                    y[(((size_t)i * cout + o) * oh + oy) * ow + ox] = acc;
                }
}

struct conv_case {
    struct trn_conv conv;
    int n, h, w, oh, ow;
    enum trn_layout xl, yl;
    float *x, *wt, *r; /* NCHW input, OIHW weights, loss weights (NCHW, like y) */
};

static double conv_loss(void *ctx)
{
    struct conv_case *cc = ctx;
    struct trn_conv *c = &cc->conv;
    struct trn_tensor x = to_layout(cc->x, cc->n, c->cin, cc->h, cc->w, cc->xl);
    size_t ny = (size_t)cc->n * c->cout * cc->oh * cc->ow;
    struct trn_tensor y =
        tensor(be.ops->alloc(&be, ny * sizeof(float)), cc->n, c->cout, cc->oh, cc->ow, cc->yl);
    be.ops->conv_forward(&be, c, &x, cc->wt, &y);
    float *yn = to_nchw(&y);
    double l = dot(yn, cc->r, ny);
    free(yn);
    be.ops->free(&be, x.data);
    be.ops->free(&be, y.data);
    return l;
}

static void check_conv(int n, int cin, int h, int w, int cout, int k, int s, int pad,
                       enum trn_layout xl, enum trn_layout yl)
{
    struct conv_case cc = {.conv = {cin, cout, k, s, pad, true, NULL}, .n = n, .h = h, .w = w};
    cc.oh = (h + 2 * pad - k) / s + 1;
    cc.ow = (w + 2 * pad - k) / s + 1;
    cc.xl = xl;
    cc.yl = yl;
    size_t nx = (size_t)n * cin * h * w, nw = (size_t)cout * cin * k * k;
    size_t ny = (size_t)n * cout * cc.oh * cc.ow;
    cc.x = randn(nx);
    cc.wt = randn(nw);
    cc.r = randn(ny);

    /* forward against the reference */
    struct trn_tensor x = to_layout(cc.x, n, cin, h, w, xl);
    struct trn_tensor y = tensor(be.ops->alloc(&be, ny * sizeof(float)), n, cout, cc.oh, cc.ow, yl);
    be.ops->conv_forward(&be, &cc.conv, &x, cc.wt, &y);
    float *yn = to_nchw(&y);
    double *ref = malloc(ny * sizeof(double));
    conv_ref(cc.x, cc.wt, ref, n, cin, h, w, cout, k, s, pad, cc.oh, cc.ow);
    assert_true(rel_err(yn, ref, ny, 1) < 1e-5);

    /* backward: dy = r; dw twice to test accumulation */
    struct trn_tensor dy = to_layout(cc.r, n, cout, cc.oh, cc.ow, yl);
    struct trn_tensor dx = tensor(be.ops->alloc(&be, nx * sizeof(float)), n, cin, h, w, xl);
    float *dw = zeros(nw), *dw2 = zeros(nw);
    be.ops->conv_backward_weights(&be, &cc.conv, &x, &dy, dw, false);
    be.ops->conv_backward_data(&be, &cc.conv, cc.wt, &dy, &dx);
    memcpy(dw2, dw, nw * sizeof(float));
    be.ops->conv_backward_weights(&be, &cc.conv, &x, &dy, dw2, true);
    for (size_t i = 0; i < nw; i++)
        assert_true(fabsf(dw2[i] - 2 * dw[i]) <= 1e-5f * (1 + fabsf(dw[i])));
    float *dxn = to_nchw(&dx);

    char what[128];
    snprintf(what, sizeof(what), "conv %dx%d/%d pad %d cin %d dx", k, k, s, pad, cin);
    fd_check(what, cc.x, nx, dxn, conv_loss, &cc, 1e-2f, 40, 2e-3);
    snprintf(what, sizeof(what), "conv %dx%d/%d pad %d cin %d dw", k, k, s, pad, cin);
    fd_check(what, cc.wt, nw, dw, conv_loss, &cc, 1e-2f, 40, 2e-3);

    be.ops->conv_release(&be, &cc.conv);
    be.ops->free(&be, x.data);
    be.ops->free(&be, y.data);
    be.ops->free(&be, dy.data);
    be.ops->free(&be, dx.data);
    free(yn);
    free(ref);
    free(dxn);
    free(dw);
    free(dw2);
    free(cc.x);
    free(cc.wt);
    free(cc.r);
}

static void test_conv(void **state)
{
    (void)state;
    enum trn_layout bl = be.act_layout;
    int b = trn_layout_block(bl);
    /* the ResNet shapes, small: 3x3/1, 3x3/2, 1x1/1, 1x1/2 between blocked layouts */
    check_conv(2, b, 6, 6, 2 * b, 3, 1, 1, bl, bl);
    check_conv(2, 2 * b, 7, 7, b, 3, 2, 1, bl, bl);
    check_conv(3, 2 * b, 5, 5, b, 1, 1, 0, bl, bl);
    check_conv(2, b, 6, 6, 2 * b, 1, 2, 0, bl, bl);
    /* small maps, where the weight gradient is an sgemm (and oneDNN has no
     * direct kernel for 3x3 on 2x2 or 1x1) */
    check_conv(2, 2 * b, 2, 2, 2 * b, 3, 1, 1, bl, bl);
    check_conv(3, b, 1, 1, b, 3, 1, 1, bl, bl);
    check_conv(2, b, 3, 3, 2 * b, 1, 1, 0, bl, bl);
    /* the stem: plain 3-channel input, 7x7/2 pad 3 */
    check_conv(2, 3, 11, 11, b, 7, 2, 3, TRN_LAYOUT_NCHW, bl);
    /* all plain */
    check_conv(2, 4, 5, 5, 3, 3, 1, 1, TRN_LAYOUT_NCHW, TRN_LAYOUT_NCHW);
}

/* A batch of 2 then of 3 through one conv: plans per shape must not mix. */
static void test_conv_shape_change(void **state)
{
    (void)state;
    enum trn_layout bl = be.act_layout;
    int b = trn_layout_block(bl);
    struct trn_conv conv = {b, b, 3, 1, 1, true, NULL};
    float *wt = randn((size_t)b * b * 9);
    for (int round = 0; round < 2; round++)
        for (int n = 1; n <= 5; n++) {
            size_t numel = (size_t)n * b * 4 * 4;
            float *xn = randn(numel);
            struct trn_tensor x = to_layout(xn, n, b, 4, 4, bl);
            struct trn_tensor y = tensor(be.ops->alloc(&be, numel * 4), n, b, 4, 4, bl);
            be.ops->conv_forward(&be, &conv, &x, wt, &y);
            float *yn = to_nchw(&y);
            double *ref = malloc(numel * sizeof(double));
            conv_ref(xn, wt, ref, n, b, 4, 4, b, 3, 1, 1, 4, 4);
            assert_true(rel_err(yn, ref, numel, 1) < 1e-5);
            free(ref);
            free(yn);
            free(xn);
            be.ops->free(&be, x.data);
            be.ops->free(&be, y.data);
        }
    be.ops->conv_release(&be, &conv);
    free(wt);
}

/* ---- batch norm (+ residual) (+ ReLU) ---- */

struct bn_case {
    int n, c, h, w;
    enum trn_layout l;
    bool relu, res, res_bn; /* fused ReLU; residual added; residual through its own BN */
    float *x, *weight, *bias, *r;
    float *xr, *rweight, *rbias; /* the residual input and its BN */
};

/* Training-mode forward through the ops: y (NCHW, malloc'd). */
static float *bn_forward_ops(struct bn_case *bc, float *mean, float *var, float *invstd)
{
    size_t numel = (size_t)bc->n * bc->c * bc->h * bc->w;
    int c = bc->c;
    struct trn_tensor x = to_layout(bc->x, bc->n, c, bc->h, bc->w, bc->l);
    struct trn_tensor y =
        tensor(be.ops->alloc(&be, numel * sizeof(float)), bc->n, c, bc->h, bc->w, bc->l);
    float *scale = zeros(c), *shift = zeros(c), *rm = zeros(c), *rv = zeros(c);
    be.ops->bn_stats(&be, &x, mean, var);
    be.ops->bn_prepare(&be, c, mean, var, (double)bc->n * bc->h * bc->w, 1e-5, 0.1, bc->weight,
                       bc->bias, rm, rv, invstd, scale, shift);
    struct trn_tensor xr = {0};
    float *rscale = NULL, *rshift = NULL;
    if (bc->res) {
        xr = to_layout(bc->xr, bc->n, c, bc->h, bc->w, bc->l);
        if (bc->res_bn) {
            float *m2 = zeros(c), *v2 = zeros(c), *is2 = zeros(c);
            rscale = zeros(c);
            rshift = zeros(c);
            be.ops->bn_stats(&be, &xr, m2, v2);
            be.ops->bn_prepare(&be, c, m2, v2, (double)bc->n * bc->h * bc->w, 1e-5, 0.1,
                               bc->rweight, bc->rbias, NULL, NULL, is2, rscale, rshift);
            free(m2);
            free(v2);
            free(is2);
        }
    }
    be.ops->bn_apply(&be, &x, scale, shift, bc->res ? &xr : NULL, rscale, rshift, bc->relu, &y);
    float *yn = to_nchw(&y);
    be.ops->free(&be, x.data);
    be.ops->free(&be, y.data);
    if (bc->res)
        be.ops->free(&be, xr.data);
    free(scale);
    free(shift);
    free(rm);
    free(rv);
    free(rscale);
    free(rshift);
    return yn;
}

static double bn_loss(void *ctx)
{
    struct bn_case *bc = ctx;
    int c = bc->c;
    float *m = zeros(c), *v = zeros(c), *is = zeros(c);
    float *y = bn_forward_ops(bc, m, v, is);
    double l = dot(y, bc->r, (size_t)bc->n * c * bc->h * bc->w);
    if (bc->relu)
        kink_sig = mask_hash(y, (size_t)bc->n * c * bc->h * bc->w);
    free(y);
    free(m);
    free(v);
    free(is);
    return l;
}

static void check_bn(int n, int c, int h, int w, enum trn_layout l, bool relu, bool res,
                     bool res_bn)
{
    struct bn_case bc = {n,    c,    h,    w,    l,    relu, res, res_bn,
                         NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t numel = (size_t)n * c * h * w, hw = (size_t)h * w;
    bc.x = randn(numel);
    for (size_t i = 0; i < numel; i++) /* an offset and scale per channel, as real activations */
        bc.x[i] = bc.x[i] * (1.0f + 0.5f * (float)((i / hw) % c)) + 3.0f;
    bc.weight = randn(c);
    bc.bias = randn(c);
    bc.r = randn(numel);
    if (res) {
        bc.xr = randn(numel);
        bc.rweight = randn(c);
        bc.rbias = randn(c);
    }
    float *mean = zeros(c), *var = zeros(c), *invstd = zeros(c);
    float *y = bn_forward_ops(&bc, mean, var, invstd);

    /* forward against a double reference */
    double *ref = malloc(numel * sizeof(double));
    double cnt = (double)n * hw;
    for (int ch = 0; ch < c; ch++) {
        double s = 0, q = 0, rs = 0, rq = 0;
        for (int i = 0; i < n; i++)
            for (size_t p = 0; p < hw; p++) {
                size_t e = ((size_t)i * c + ch) * hw + p;
                s += bc.x[e];
                if (res)
                    rs += bc.xr[e];
            }
        double m = s / cnt, rm = rs / cnt;
        for (int i = 0; i < n; i++)
            for (size_t p = 0; p < hw; p++) {
                size_t e = ((size_t)i * c + ch) * hw + p;
                q += (bc.x[e] - m) * (bc.x[e] - m);
                if (res)
                    rq += (bc.xr[e] - rm) * (bc.xr[e] - rm);
            }
        double v = q / cnt, rv = rq / cnt;
        assert_true(fabs(mean[ch] - m) <= 1e-6 * (1 + fabs(m)));
        assert_true(fabs(var[ch] - v) <= 1e-6 * (1 + v));
        for (int i = 0; i < n; i++)
            for (size_t p = 0; p < hw; p++) {
                size_t e = ((size_t)i * c + ch) * hw + p;
                double o = (bc.x[e] - m) / sqrt(v + 1e-5) * bc.weight[ch] + bc.bias[ch];
                if (res)
                    o += res_bn ? (bc.xr[e] - rm) / sqrt(rv + 1e-5) * bc.rweight[ch] + bc.rbias[ch]
                                : bc.xr[e];
                ref[e] = relu && o < 0 ? 0 : o;
            }
    }
    assert_true(rel_err(y, ref, numel, 1) < 2e-6);

    /* backward: relu_backward for the mask (as resnet.c does for a block's
     * output), or the mask fused into the batch-norm backward. */
    struct trn_tensor x = to_layout(bc.x, n, c, h, w, l);
    struct trn_tensor yt = to_layout(y, n, c, h, w, l);
    struct trn_tensor dy = to_layout(bc.r, n, c, h, w, l);
    struct trn_tensor dx = tensor(be.ops->alloc(&be, numel * sizeof(float)), n, c, h, w, l);
    float *sdy = zeros(c), *sdx = zeros(c), *dweight = zeros(c), *dbias = zeros(c);
    const struct trn_tensor *mask = relu ? &yt : NULL;
    if (res && relu) {
        be.ops->relu_backward(&be, &dy, NULL, &yt, &dy);
        mask = NULL;
    }
    be.ops->bn_backward_reduce(&be, &x, &dy, mask, mean, sdy, sdx);
    be.ops->bn_param_grads(&be, c, invstd, sdy, sdx, dweight, dbias, false);
    be.ops->bn_backward_input(&be, &x, &dy, mask, mean, invstd, bc.weight, sdy, sdx, cnt, &dx);
    float *dxn = to_nchw(&dx);

    char what[128];
    snprintf(what, sizeof(what), "bn n%d c%d %dx%d layout %d relu %d res %d/%d", n, c, h, w, (int)l,
             relu, res, res_bn);
    char wx[160], ww[160], wb[160];
    snprintf(wx, sizeof(wx), "%s dx", what);
    snprintf(ww, sizeof(ww), "%s dweight", what);
    snprintf(wb, sizeof(wb), "%s dbias", what);
    fd_check(wx, bc.x, numel, dxn, bn_loss, &bc, 2e-3f, 60, 5e-3);
    fd_check(ww, bc.weight, c, dweight, bn_loss, &bc, 2e-3f, 64, 5e-3);
    fd_check(wb, bc.bias, c, dbias, bn_loss, &bc, 2e-3f, 64, 5e-3);

    /* accumulation adds */
    be.ops->bn_param_grads(&be, c, invstd, sdy, sdx, dweight, dbias, true);
    for (int ch = 0; ch < c; ch++)
        assert_true(fabsf(dbias[ch] - 2 * sdy[ch]) <= 1e-5f * (1 + fabsf(sdy[ch])));

    be.ops->free(&be, x.data);
    be.ops->free(&be, yt.data);
    be.ops->free(&be, dy.data);
    be.ops->free(&be, dx.data);
    free(sdy);
    free(sdx);
    free(dweight);
    free(dbias);
    free(dxn);
    free(ref);
    free(y);
    free(mean);
    free(var);
    free(invstd);
    free(bc.x);
    free(bc.weight);
    free(bc.bias);
    free(bc.r);
    free(bc.xr);
    free(bc.rweight);
    free(bc.rbias);
}

static void test_bn(void **state)
{
    (void)state;
    for (size_t li = 0; li < sizeof(layouts) / sizeof(layouts[0]); li++) {
        enum trn_layout l = layouts[li] == TRN_LAYOUT_NCHW ? TRN_LAYOUT_NCHW : be.act_layout;
        int c = 2 * trn_layout_block(be.act_layout);
        check_bn(3, c, 4, 5, l, false, false, false);
        check_bn(2, c, 3, 3, l, true, false, false);
        check_bn(2, c, 3, 3, l, true, true, false);
        check_bn(2, c, 3, 3, l, true, true, true);
        check_bn(4, c, 1, 1, l, false, false, false); /* the last layer at 32x32: 1x1 */
    }
}

static void test_bn_running_stats(void **state)
{
    (void)state;
    enum { C = 4 };
    float mean[C] = {1, -2, 0.5f, 0}, var[C] = {4, 0.25f, 1, 0};
    float w[C] = {1, 1, 2, 0}, b[C] = {0, 1, 0, 0};
    float rm[C] = {0, 0, 0, 0}, rv[C] = {1, 1, 1, 1};
    float is[C], sc[C], sh[C];
    double count = 10;
    be.ops->bn_prepare(&be, C, mean, var, count, 1e-5, 0.1, w, b, rm, rv, is, sc, sh);
    for (int c = 0; c < C; c++) {
        double inv = 1 / sqrt(var[c] + 1e-5);
        assert_true(fabs(is[c] - inv) < 1e-6 * inv);
        assert_true(fabs(sc[c] - w[c] * inv) < 1e-6 * (1 + inv));
        assert_true(fabs(sh[c] - (b[c] - mean[c] * w[c] * inv)) < 1e-5);
        assert_true(fabs(rm[c] - 0.1 * mean[c]) < 1e-7);
        /* unbiased: var * n / (n - 1) */
        assert_true(fabs(rv[c] - (0.9 + 0.1 * var[c] * count / (count - 1))) < 1e-6);
    }
    /* eval: running stats in, nothing updated */
    be.ops->bn_prepare(&be, C, rm, rv, 0, 1e-5, 0.1, w, b, NULL, NULL, is, sc, sh);
    assert_true(fabs(sh[0] - (0 - rm[0] * w[0] / sqrt(rv[0] + 1e-5))) < 1e-6);
}

/* The statistics do not depend on how the channels are split over images. */
static void test_bn_stats_large_offset(void **state)
{
    (void)state;
    int c = trn_layout_block(be.act_layout);
    int n = 8, h = 16, w = 16;
    size_t numel = (size_t)n * c * h * w;
    float *x = randn(numel);
    for (size_t i = 0; i < numel; i++)
        x[i] = 1000.0f + x[i] * 0.01f; /* variance 1e-4 on a mean of 1000 */
    struct trn_tensor t = to_layout(x, n, c, h, w, be.act_layout);
    float mean[16], var[16];
    be.ops->bn_stats(&be, &t, mean, var);
    for (int ch = 0; ch < c; ch++) {
        assert_true(fabs(mean[ch] - 1000.0) < 1e-3);
        assert_true(fabs(var[ch] - 1e-4) < 2e-5);
    }
    be.ops->free(&be, t.data);
    free(x);
}

/* ---- ReLU backward with the shortcut's gradient ---- */

static void test_relu_backward(void **state)
{
    (void)state;
    int n = 2, c = trn_layout_block(be.act_layout), h = 3, w = 3;
    size_t numel = (size_t)n * c * h * w;
    float *y = randn(numel), *g1 = randn(numel), *g2 = randn(numel);
    for (size_t i = 0; i < numel; i++)
        y[i] = y[i] > 0 ? y[i] : 0;
    struct trn_tensor ty = to_layout(y, n, c, h, w, be.act_layout);
    struct trn_tensor t1 = to_layout(g1, n, c, h, w, be.act_layout);
    struct trn_tensor t2 = to_layout(g2, n, c, h, w, be.act_layout);
    be.ops->relu_backward(&be, &t1, &t2, &ty, &t1); /* in place */
    float *out = to_nchw(&t1);
    for (size_t i = 0; i < numel; i++)
        assert_true(out[i] == (y[i] > 0 ? g1[i] + g2[i] : 0.0f));
    free(out);
    be.ops->free(&be, ty.data);
    be.ops->free(&be, t1.data);
    be.ops->free(&be, t2.data);
    free(y);
    free(g1);
    free(g2);
}

/* ---- pooling ---- */

struct pool_case {
    int n, c, h, w, oh, ow;
    enum trn_layout l;
    float *x, *r;
    bool avg;
};

static double pool_loss(void *ctx)
{
    struct pool_case *pc = ctx;
    struct trn_tensor x = to_layout(pc->x, pc->n, pc->c, pc->h, pc->w, pc->l);
    double l;
    if (pc->avg) {
        float *y = zeros((size_t)pc->n * pc->c);
        be.ops->avgpool_forward(&be, &x, y);
        l = dot(y, pc->r, (size_t)pc->n * pc->c);
        free(y);
    } else {
        size_t ny = (size_t)pc->n * pc->c * pc->oh * pc->ow;
        struct trn_tensor y =
            tensor(be.ops->alloc(&be, ny * 4), pc->n, pc->c, pc->oh, pc->ow, pc->l);
        uint8_t *am = malloc(ny);
        be.ops->maxpool_forward(&be, &x, &y, am);
        float *yn = to_nchw(&y);
        l = dot(yn, pc->r, ny);
        free(yn);
        free(am);
        be.ops->free(&be, y.data);
    }
    be.ops->free(&be, x.data);
    return l;
}

static void check_maxpool(int n, int c, int h, int w, enum trn_layout l)
{
    struct pool_case pc = {n, c,    h,    w,    (h + 2 - 3) / 2 + 1, (w + 2 - 3) / 2 + 1,
                           l, NULL, NULL, false};
    size_t nx = (size_t)n * c * h * w, ny = (size_t)n * c * pc.oh * pc.ow;
    /* values 0.01 apart in a random order: a perturbation of 1e-3 never changes a window's max */
    pc.x = malloc(nx * sizeof(float));
    for (size_t i = 0; i < nx; i++)
        pc.x[i] = 0.01f * (float)i - 0.005f * (float)nx;
    for (size_t i = nx - 1; i > 0; i--) {
        size_t j = (size_t)(urand() * (double)(i + 1));
        float t = pc.x[i];
        pc.x[i] = pc.x[j];
        pc.x[j] = t;
    }
    pc.r = randn(ny);
    struct trn_tensor x = to_layout(pc.x, n, c, h, w, l);
    struct trn_tensor y = tensor(be.ops->alloc(&be, ny * 4), n, c, pc.oh, pc.ow, l);
    uint8_t *am = malloc(ny);
    be.ops->maxpool_forward(&be, &x, &y, am);
    float *yn = to_nchw(&y);
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++)
            for (int oy = 0; oy < pc.oh; oy++)
                for (int ox = 0; ox < pc.ow; ox++) {
                    float m = -INFINITY;
                    for (int ky = 0; ky < 3; ky++)
                        for (int kx = 0; kx < 3; kx++) {
                            int iy = oy * 2 - 1 + ky, ix = ox * 2 - 1 + kx;
                            if (iy >= 0 && iy < h && ix >= 0 && ix < w)
                                m = fmaxf(m, pc.x[(((size_t)i * c + ch) * h + iy) * w + ix]);
                        }
                    assert_true(yn[(((size_t)i * c + ch) * pc.oh + oy) * pc.ow + ox] == m);
                }
    struct trn_tensor dy = to_layout(pc.r, n, c, pc.oh, pc.ow, l);
    struct trn_tensor dx = tensor(be.ops->alloc(&be, nx * 4), n, c, h, w, l);
    be.ops->maxpool_backward(&be, &dy, am, &dx);
    float *dxn = to_nchw(&dx);
    fd_check("maxpool dx", pc.x, nx, dxn, pool_loss, &pc, 1e-3f, nx, 1e-3);
    free(dxn);
    free(yn);
    free(am);
    be.ops->free(&be, x.data);
    be.ops->free(&be, y.data);
    be.ops->free(&be, dy.data);
    be.ops->free(&be, dx.data);
    free(pc.x);
    free(pc.r);
}

static void test_maxpool(void **state)
{
    (void)state;
    int c = trn_layout_block(be.act_layout);
    check_maxpool(2, c, 8, 8, be.act_layout);
    check_maxpool(1, c, 7, 5, be.act_layout); /* odd sizes: the last window is clipped */
    check_maxpool(2, 3, 6, 7, TRN_LAYOUT_NCHW);
}

static void test_maxpool_ties_and_nan(void **state)
{
    (void)state;
    /* one channel, plain layout: a window of equal values picks the first;
     * NaN wins over numbers (PyTorch's CPU max-pool). */
    float x[16];
    for (int i = 0; i < 16; i++)
        x[i] = 1.0f;
    struct trn_tensor tx = tensor(x, 1, 1, 4, 4, TRN_LAYOUT_NCHW);
    float y[4];
    uint8_t am[4];
    struct trn_tensor ty = tensor(y, 1, 1, 2, 2, TRN_LAYOUT_NCHW);
    be.ops->maxpool_forward(&be, &tx, &ty, am);
    assert_int_equal(am[0], 4); /* window (-1..1)^2: first in-bounds cell is (0,0) = index 4 */
    x[5] = NAN;
    be.ops->maxpool_forward(&be, &tx, &ty, am);
    assert_true(isnan(y[0]));
}

static void test_avgpool(void **state)
{
    (void)state;
    for (size_t li = 0; li < 2; li++) {
        enum trn_layout l = li == 0 ? TRN_LAYOUT_NCHW : be.act_layout;
        int n = 3, c = 2 * trn_layout_block(be.act_layout), h = 3, w = 4;
        struct pool_case pc = {n, c, h, w, 1, 1, l, NULL, NULL, true};
        size_t nx = (size_t)n * c * h * w;
        pc.x = randn(nx);
        pc.r = randn((size_t)n * c);
        struct trn_tensor x = to_layout(pc.x, n, c, h, w, l);
        float *y = zeros((size_t)n * c);
        be.ops->avgpool_forward(&be, &x, y);
        for (int i = 0; i < n * c; i++) {
            double s = 0;
            for (int p = 0; p < h * w; p++)
                s += pc.x[(size_t)i * h * w + p];
            assert_true(fabs(y[i] - s / (h * w)) < 1e-6);
        }
        struct trn_tensor dx = tensor(be.ops->alloc(&be, nx * 4), n, c, h, w, l);
        be.ops->avgpool_backward(&be, pc.r, &dx);
        float *dxn = to_nchw(&dx);
        fd_check("avgpool dx", pc.x, nx, dxn, pool_loss, &pc, 1e-2f, 50, 1e-3);
        free(dxn);
        free(y);
        be.ops->free(&be, x.data);
        be.ops->free(&be, dx.data);
        free(pc.x);
        free(pc.r);
    }
}

/* ---- fully connected ---- */

struct fc_case {
    int n, in, out;
    float *x, *w, *b, *r;
};

static double fc_loss(void *ctx)
{
    struct fc_case *fc = ctx;
    float *y = zeros((size_t)fc->n * fc->out);
    be.ops->fc_forward(&be, fc->n, fc->in, fc->out, fc->x, fc->w, fc->b, y);
    double l = dot(y, fc->r, (size_t)fc->n * fc->out);
    free(y);
    return l;
}

static void test_fc(void **state)
{
    (void)state;
    struct fc_case fc = {5, 24, 10, NULL, NULL, NULL, NULL};
    size_t nx = (size_t)fc.n * fc.in, nw = (size_t)fc.out * fc.in, ny = (size_t)fc.n * fc.out;
    fc.x = randn(nx);
    fc.w = randn(nw);
    fc.b = randn((size_t)fc.out);
    fc.r = randn(ny);
    float *y = zeros(ny);
    be.ops->fc_forward(&be, fc.n, fc.in, fc.out, fc.x, fc.w, fc.b, y);
    for (int i = 0; i < fc.n; i++)
        for (int o = 0; o < fc.out; o++) {
            double s = fc.b[o];
            for (int k = 0; k < fc.in; k++)
                s += (double)fc.x[i * fc.in + k] * fc.w[o * fc.in + k];
            assert_true(fabs(y[i * fc.out + o] - s) < 1e-5 * (1 + fabs(s)));
        }
    float *dx = zeros(nx), *dw = zeros(nw), *db = zeros((size_t)fc.out);
    be.ops->fc_backward(&be, fc.n, fc.in, fc.out, fc.x, fc.w, fc.r, dx, dw, db, false);
    fd_check("fc dx", fc.x, nx, dx, fc_loss, &fc, 1e-2f, nx, 1e-3);
    fd_check("fc dw", fc.w, nw, dw, fc_loss, &fc, 1e-2f, nw, 1e-3);
    fd_check("fc db", fc.b, (size_t)fc.out, db, fc_loss, &fc, 1e-2f, 64, 1e-3);
    float *dw2 = malloc(nw * 4), *db2 = malloc((size_t)fc.out * 4);
    memcpy(dw2, dw, nw * 4);
    memcpy(db2, db, (size_t)fc.out * 4);
    be.ops->fc_backward(&be, fc.n, fc.in, fc.out, fc.x, fc.w, fc.r, NULL, dw2, db2, true);
    for (size_t i = 0; i < nw; i++)
        assert_true(fabsf(dw2[i] - 2 * dw[i]) <= 1e-5f * (1 + fabsf(dw[i])));
    for (int o = 0; o < fc.out; o++)
        assert_true(fabsf(db2[o] - 2 * db[o]) <= 1e-5f * (1 + fabsf(db[o])));
    free(dw2);
    free(db2);
    free(dx);
    free(dw);
    free(db);
    free(y);
    free(fc.x);
    free(fc.w);
    free(fc.b);
    free(fc.r);
}

/* ---- softmax cross-entropy ---- */

struct xent_case {
    int n, k;
    float *logits;
    int32_t *labels;
};

static double xent_loss(void *ctx)
{
    struct xent_case *xc = ctx;
    float *p = zeros((size_t)xc->n * xc->k);
    double l = be.ops->xent_forward(&be, xc->n, xc->k, xc->logits, xc->labels, p);
    free(p);
    return l;
}

static void test_xent(void **state)
{
    (void)state;
    struct xent_case xc = {6, 7, NULL, NULL};
    size_t nl = (size_t)xc.n * xc.k;
    xc.logits = randn(nl);
    xc.logits[3] = 80.0f; /* a large logit: the max must be subtracted */
    int32_t labels[6] = {0, 6, 3, 3, 1, 5};
    xc.labels = labels;
    float *p = zeros(nl);
    double l = be.ops->xent_forward(&be, xc.n, xc.k, xc.logits, labels, p);
    double ref = 0;
    for (int i = 0; i < xc.n; i++) {
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < xc.k; j++)
            mx = fmax(mx, xc.logits[i * xc.k + j]);
        for (int j = 0; j < xc.k; j++)
            s += exp(xc.logits[i * xc.k + j] - mx);
        ref += mx + log(s) - xc.logits[i * xc.k + labels[i]];
    }
    ref /= xc.n;
    assert_true(fabs(l - ref) < 1e-6 * (1 + fabs(ref)));
    float *d = zeros(nl);
    be.ops->xent_backward(&be, xc.n, xc.k, p, labels, 1.0f, d);
    /* eps: the loss is a float, so differences are taken over a sizeable step */
    fd_check("xent dlogits", xc.logits, nl, d, xent_loss, &xc, 1e-2f, nl, 5e-3);
    float *d2 = zeros(nl);
    be.ops->xent_backward(&be, xc.n, xc.k, p, labels, 0.5f, d2);
    for (size_t i = 0; i < nl; i++)
        assert_true(fabsf(d2[i] - 0.5f * d[i]) <= 1e-7f);
    free(d2);
    free(d);
    free(p);
    free(xc.logits);
}

/* ---- SGD ---- */

static void test_sgd(void **state)
{
    (void)state;
    enum { N = 37 };
    float *p = randn(N), *g = randn(N), *buf = zeros(N);
    double rp[N], rb[N];
    for (int i = 0; i < N; i++)
        rp[i] = p[i];
    const float lr = 0.01f, mom = 0.9f, wd = 1e-4f;
    for (int step = 0; step < 3; step++) {
        be.ops->sgd_step(&be, p, g, buf, N, lr, mom, wd, step == 0);
        for (int i = 0; i < N; i++) {
            double d = g[i] + (double)wd * rp[i];
            rb[i] = step == 0 ? d : mom * rb[i] + d;
            rp[i] -= lr * rb[i];
        }
    }
    assert_true(rel_err(p, rp, N, 1) < 1e-6);
    assert_true(rel_err(buf, rb, N, 1) < 1e-6);
    /* momentum 0: plain SGD, the buffer untouched */
    float *q = randn(N), *untouched = zeros(N);
    double rq[N];
    for (int i = 0; i < N; i++)
        rq[i] = q[i] - lr * (g[i] + (double)wd * q[i]);
    be.ops->sgd_step(&be, q, g, untouched, N, lr, 0.0f, wd, false);
    assert_true(rel_err(q, rq, N, 1) < 1e-6);
    for (int i = 0; i < N; i++)
        assert_true(untouched[i] == 0.0f);
    free(q);
    free(untouched);
    free(p);
    free(g);
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv),
        cmocka_unit_test(test_conv_shape_change),
        cmocka_unit_test(test_bn),
        cmocka_unit_test(test_bn_running_stats),
        cmocka_unit_test(test_bn_stats_large_offset),
        cmocka_unit_test(test_relu_backward),
        cmocka_unit_test(test_maxpool),
        cmocka_unit_test(test_maxpool_ties_and_nan),
        cmocka_unit_test(test_avgpool),
        cmocka_unit_test(test_fc),
        cmocka_unit_test(test_xent),
        cmocka_unit_test(test_sgd),
    };
    return cmocka_run_group_tests(tests, cpu_backend_setup, cpu_backend_teardown);
}
