/*
 * cuda-opcheck: every op of the CUDA backend against the CPU backend, on
 * random inputs, the same values given to both (NCHW on the CPU, NHWC on the
 * GPU). Prints one line per check with its error, its tolerance and ok/FAIL,
 * and exits 0 when all pass, 1 when one fails, 77 (skip) with one line when
 * no CUDA device is visible.
 *
 * The error of a check is max |gpu - cpu| / max |cpu| over the tensor: the
 * worst difference relative to the tensor's scale (a per-element relative
 * error means nothing where the reference is near zero). Tolerances: fp32
 * with TF32 off 1e-4; with --tf32 (TF32 convolutions and fc) 1e-2.
 *
 * With --deterministic only deterministic convolution algorithms are taken,
 * and a weight gradient computed twice must come out the same bits.
 *
 * With --amp bf16|fp16 the GPU's activations are bf16 or fp16 (as
 * cddp-train --amp runs them): every input is rounded to that type on the
 * host first, so both backends see the same values, the CPU computing in
 * fp32 on them; an activation the GPU writes (rounded once on the store, or
 * by cuDNN) is checked within 2e-2 (bf16) or 1e-2 (fp16), what it computes
 * in fp32 from them (BN statistics and sums, the pooled features) within
 * the fp32 tolerance. The conv weights are rounded too (the GPU casts its
 * fp32 copy); the weight gradient arrives in the low type. The reorder must
 * round exactly as the host does. fc, the loss, SGD and unscale are fp32
 * under --amp too and are left to the fp32 run.
 *
 * The stem (3 input channels) is checked twice: as cuDNN's search decides,
 * and padded to 8 channels (CDDP_CUDA_CONV_PAD=1, conv.cu), the fallback
 * for when cuDNN has no algorithm for 3 channels.
 *
 * --json FILE gets JSON lines, each written and flushed as it is known: a
 * first line with the settings, one per check ({"op", "max_rel_err" (null
 * when not finite), "tol", "ok"}), a last with the totals. A check that
 * dies (a CUDA error is fatal) leaves the lines before it intact, and
 * tools/gpu-check reports what ran and where it stopped.
 *
 *   cuda-opcheck [--tf32] [--deterministic] [--amp bf16|fp16] [--json FILE] [--device N]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/strutil.h"
#include "trainer/ops/cuda/ops_math.h"
#include "trainer/ops/ops.h"

static struct trn_backend cpu, gpu;
static double tol = 1e-4;
/* --amp: the GPU's activation dtype and the tolerance of what it stores in it */
static enum trn_dtype act_dt = TRN_F32;
static double amp_tol;
static int failures, checks;
static FILE *json;
static bool deterministic;
static const char *name_suffix = ""; /* " (padded)": the stem's second round */

/* ---- random data, host and device ---- */

static uint64_t rng = 12345;

static float nrand(void)
{
    double u, v;
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    u = ((double)(rng >> 11) + 1.0) / 9007199254740993.0;
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    v = (double)(rng >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

static float *randn(size_t n)
{
    float *p = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++)
        p[i] = nrand();
    return p;
}

static float *copy_of(const float *src, size_t n)
{
    float *p = malloc(n * sizeof(float) + 1);
    memcpy(p, src, n * sizeof(float));
    return p;
}

/* Values as the GPU's activations hold them under --amp (unchanged in fp32). */
static void round_host(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = trn_act_round((int)act_dt, p[i]);
}

/* The tolerance of an activation the GPU writes: limit in fp32, amp_tol under --amp. */
static double at(double limit)
{
    return act_dt == TRN_F32 ? limit : amp_tol;
}

static void *dev(const void *host, size_t bytes)
{
    void *d = gpu.ops->alloc(&gpu, bytes);
    if (!d) {
        fprintf(stderr, "cuda-opcheck: out of device memory\n");
        exit(1);
    }
    if (host)
        gpu.ops->to_device(&gpu, d, host, bytes);
    return d;
}

static float *host_of(const float *d, size_t n)
{
    float *h = malloc(n * sizeof(float) + 1);
    gpu.ops->to_host(&gpu, h, d, n * sizeof(float));
    return h;
}

/* An activation given as NCHW host data: the CPU's tensor (its own copy,
 * NCHW fp32, of the values rounded to act_dt) and the GPU's (NHWC, act_dt),
 * reordered from the same rounded values, or (rounded false: the reorder's
 * own rounding check) from the values as given. */
struct act {
    struct trn_tensor c, g;
};

static struct act act_of_values(const float *nchw, int n, int c, int h, int w, bool rounded)
{
    size_t numel = (size_t)n * c * h * w;
    struct act a;
    struct trn_tensor t = {copy_of(nchw, numel), n, c, h, w, TRN_F32, TRN_LAYOUT_NCHW,
                           TRN_DEVICE_CPU};
    round_host(t.data, numel);
    a.c = t;
    const float *from = rounded ? t.data : nchw;
    struct trn_tensor src = {
        dev(from, numel * sizeof(float)), n, c, h, w, TRN_F32, TRN_LAYOUT_NCHW, TRN_DEVICE_CUDA};
    a.g = src;
    a.g.dtype = act_dt;
    a.g.layout = TRN_LAYOUT_NHWC;
    a.g.data = dev(NULL, trn_tensor_bytes(&a.g));
    gpu.ops->reorder(&gpu, &src, &a.g);
    gpu.ops->free(&gpu, src.data);
    return a;
}

static struct act act_of(const float *nchw, int n, int c, int h, int w)
{
    return act_of_values(nchw, n, c, h, w, true);
}

static struct act act_zeros(int n, int c, int h, int w)
{
    size_t numel = (size_t)n * c * h * w;
    float *z = calloc(numel + 1, sizeof(float));
    struct act a = act_of(z, n, c, h, w);
    free(z);
    return a;
}

static struct act act_randn(int n, int c, int h, int w)
{
    float *r = randn((size_t)n * c * h * w);
    struct act a = act_of(r, n, c, h, w);
    free(r);
    return a;
}

/* The GPU tensor's values as NCHW fp32 host data. */
static float *act_host(const struct trn_tensor *g)
{
    size_t numel = trn_tensor_numel(g);
    struct trn_tensor dst = *g;
    dst.data = dev(NULL, numel * sizeof(float));
    dst.layout = TRN_LAYOUT_NCHW;
    dst.dtype = TRN_F32;
    gpu.ops->reorder(&gpu, g, &dst);
    float *h = host_of(dst.data, numel);
    gpu.ops->free(&gpu, dst.data);
    return h;
}

static void act_free(struct act *a)
{
    free(a->c.data);
    gpu.ops->free(&gpu, a->g.data);
}

/* ---- comparing ---- */

static double rel_err(const float *got, const float *want, size_t n)
{
    double diff = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (d > diff || d != d)
            diff = d != d ? INFINITY : d;
        if (fabs(want[i]) > scale)
            scale = fabs(want[i]);
    }
    return scale > 0 ? diff / scale : diff;
}

static void report(const char *name, double err, double limit)
{
    bool ok = err <= limit;
    checks++;
    failures += !ok;
    printf("  %-40s%s %10.3e  (tol %.0e)  %s\n", name, name_suffix, err, limit, ok ? "ok" : "FAIL");
    fflush(stdout);
    if (json) {
        char e[32] = "null"; /* JSON has no inf or NaN */
        if (isfinite(err))
            snprintf(e, sizeof(e), "%.6e", err);
        fprintf(json, "{\"op\": \"%s%s\", \"max_rel_err\": %s, \"tol\": %.1e, \"ok\": %s}\n", name,
                name_suffix, e, limit, ok ? "true" : "false");
        fflush(json);
    }
}

/* Compares a GPU activation with the CPU's. */
static void check_act(const char *name, const struct act *a, double limit)
{
    float *h = act_host(&a->g);
    report(name, rel_err(h, a->c.data, trn_tensor_numel(&a->c)), limit);
    free(h);
}

/* Compares n device floats with n host floats. */
static void check_vec(const char *name, const float *d, const float *want, size_t n, double limit)
{
    float *h = host_of(d, n);
    report(name, rel_err(h, want, n), limit);
    free(h);
}

/* ---- the checks ---- */

static void check_conv(int n, int cin, int cout, int hw, int k, int stride, int pad, double limit)
{
    char name[96];
    struct trn_conv cc = {cin, cout, k, stride, pad, true, NULL};
    struct trn_conv gc = cc;
    int oh = (hw + 2 * pad - k) / stride + 1;
    size_t nw = (size_t)cout * cin * k * k;
    struct act x = act_randn(n, cin, hw, hw), y = act_zeros(n, cout, oh, oh);
    struct act dy = act_randn(n, cout, oh, oh), dx = act_zeros(n, cin, hw, hw);
    float *w = randn(nw), *dw0 = randn(nw);
    round_host(w, nw); /* the GPU casts its fp32 copy to act_dt: the same values */
    float *gw = dev(w, nw * sizeof(float));
    float *cdw = copy_of(dw0, nw), *gdw = dev(dw0, nw * sizeof(float));

    cpu.ops->conv_forward(&cpu, &cc, &x.c, w, &y.c);
    gpu.ops->conv_forward(&gpu, &gc, &x.g, gw, &y.g);
    snprintf(name, sizeof(name), "conv_forward %d->%d k%d s%d %dx%d", cin, cout, k, stride, hw, hw);
    check_act(name, &y, at(limit));

    for (int acc = 0; acc < 2; acc++) {
        cpu.ops->conv_backward_weights(&cpu, &cc, &x.c, &dy.c, cdw, acc);
        gpu.ops->conv_backward_weights(&gpu, &gc, &x.g, &dy.g, gdw, acc);
        snprintf(name, sizeof(name), "conv_backward_weights%s %d->%d k%d s%d", acc ? "+=" : "", cin,
                 cout, k, stride);
        check_vec(name, gdw, cdw, nw, at(limit)); /* cuDNN's gradient is act_dt */
    }
    if (deterministic) {
        /* the same weight gradient twice: the same bits */
        gpu.ops->conv_backward_weights(&gpu, &gc, &x.g, &dy.g, gdw, false);
        float *once = host_of(gdw, nw);
        gpu.ops->conv_backward_weights(&gpu, &gc, &x.g, &dy.g, gdw, false);
        snprintf(name, sizeof(name), "conv_backward_weights repeat %d->%d k%d s%d", cin, cout, k,
                 stride);
        check_vec(name, gdw, once, nw, 0);
        free(once);
    }

    cpu.ops->conv_backward_data(&cpu, &cc, w, &dy.c, &dx.c);
    gpu.ops->conv_backward_data(&gpu, &gc, gw, &dy.g, &dx.g);
    snprintf(name, sizeof(name), "conv_backward_data %d->%d k%d s%d", cin, cout, k, stride);
    check_act(name, &dx, at(limit));

    cpu.ops->conv_release(&cpu, &cc);
    gpu.ops->conv_release(&gpu, &gc);
    act_free(&x);
    act_free(&y);
    act_free(&dy);
    act_free(&dx);
    free(w);
    free(dw0);
    free(cdw);
    gpu.ops->free(&gpu, gw);
    gpu.ops->free(&gpu, gdw);
}

/* Per-channel vector on both sides. */
struct vec {
    float *h, *d;
    int n;
};

static struct vec vec_of(const float *h, int n)
{
    struct vec v = {copy_of(h, (size_t)n), dev(h, (size_t)n * sizeof(float)), n};
    return v;
}

static struct vec vec_randn(int n, float offset, float spread)
{
    float *h = randn((size_t)n);
    for (int i = 0; i < n; i++)
        h[i] = offset + spread * h[i];
    struct vec v = vec_of(h, n);
    free(h);
    return v;
}

static void vec_check(const char *name, const struct vec *v, double limit)
{
    check_vec(name, v->d, v->h, (size_t)v->n, limit);
}

static void vec_free(struct vec *v)
{
    free(v->h);
    gpu.ops->free(&gpu, v->d);
}

static void check_bn(int n, int c, int hw)
{
    char name[96];
    double count = (double)n * hw * hw;
    /* shifted and spread so the mean is not near zero */
    float *tmp = randn((size_t)n * c * hw * hw);
    for (size_t i = 0; i < (size_t)n * c * hw * hw; i++)
        tmp[i] = 0.5f + 2.0f * tmp[i];
    struct act x = act_of(tmp, n, c, hw, hw);
    free(tmp);
    struct vec mean = vec_randn(c, 0, 0), var = vec_randn(c, 0, 0);
    cpu.ops->bn_stats(&cpu, &x.c, mean.h, var.h);
    gpu.ops->bn_stats(&gpu, &x.g, mean.d, var.d);
    snprintf(name, sizeof(name), "bn_stats mean C%d %dx%d", c, hw, hw);
    vec_check(name, &mean, tol);
    snprintf(name, sizeof(name), "bn_stats var C%d %dx%d", c, hw, hw);
    vec_check(name, &var, tol);

    struct vec weight = vec_randn(c, 1, 0.3f), bias = vec_randn(c, 0, 0.3f);
    struct vec rmean = vec_randn(c, 0, 0.1f), rvar = vec_randn(c, 1, 0.1f);
    struct vec invstd = vec_randn(c, 0, 0), scale = vec_randn(c, 0, 0), shift = vec_randn(c, 0, 0);
    /* Both sides from the CPU's statistics, so the check is of prepare alone. */
    gpu.ops->to_device(&gpu, mean.d, mean.h, (size_t)c * sizeof(float));
    gpu.ops->to_device(&gpu, var.d, var.h, (size_t)c * sizeof(float));
    cpu.ops->bn_prepare(&cpu, c, mean.h, var.h, count, 1e-5, 0.1, weight.h, bias.h, rmean.h, rvar.h,
                        invstd.h, scale.h, shift.h);
    gpu.ops->bn_prepare(&gpu, c, mean.d, var.d, count, 1e-5, 0.1, weight.d, bias.d, rmean.d, rvar.d,
                        invstd.d, scale.d, shift.d);
    vec_check("bn_prepare invstd", &invstd, tol);
    vec_check("bn_prepare scale", &scale, tol);
    vec_check("bn_prepare shift", &shift, tol);
    vec_check("bn_prepare running_mean", &rmean, tol);
    vec_check("bn_prepare running_var", &rvar, tol);
    {
        struct vec e_inv = vec_randn(c, 0, 0), e_sc = vec_randn(c, 0, 0), e_sh = vec_randn(c, 0, 0);
        cpu.ops->bn_prepare(&cpu, c, rmean.h, rvar.h, count, 1e-5, 0.1, weight.h, bias.h, NULL,
                            NULL, e_inv.h, e_sc.h, e_sh.h);
        gpu.ops->bn_prepare(&gpu, c, rmean.d, rvar.d, count, 1e-5, 0.1, weight.d, bias.d, NULL,
                            NULL, e_inv.d, e_sc.d, e_sh.d);
        vec_check("bn_prepare (eval) scale", &e_sc, tol);
        vec_check("bn_prepare (eval) shift", &e_sh, tol);
        vec_free(&e_inv);
        vec_free(&e_sc);
        vec_free(&e_sh);
    }
    /* From here on both sides use the CPU's per-channel values. */
    gpu.ops->to_device(&gpu, invstd.d, invstd.h, (size_t)c * sizeof(float));
    gpu.ops->to_device(&gpu, scale.d, scale.h, (size_t)c * sizeof(float));
    gpu.ops->to_device(&gpu, shift.d, shift.h, (size_t)c * sizeof(float));

    struct act res = act_randn(n, c, hw, hw);
    struct vec rs = vec_randn(c, 1, 0.3f), rb = vec_randn(c, 0, 0.3f);
    static const char *const res_names[] = {"", " +res", " +bn(res)"};
    struct act y = act_zeros(n, c, hw, hw);
    for (int kind = 0; kind < 3; kind++)
        for (int relu = 0; relu < 2; relu++) {
            const struct trn_tensor *rc = kind ? &res.c : NULL, *rg = kind ? &res.g : NULL;
            cpu.ops->bn_apply(&cpu, &x.c, scale.h, shift.h, rc, kind == 2 ? rs.h : NULL,
                              kind == 2 ? rb.h : NULL, relu, &y.c);
            gpu.ops->bn_apply(&gpu, &x.g, scale.d, shift.d, rg, kind == 2 ? rs.d : NULL,
                              kind == 2 ? rb.d : NULL, relu, &y.g);
            snprintf(name, sizeof(name), "bn_apply%s%s", res_names[kind], relu ? " relu" : "");
            check_act(name, &y, at(tol));
        }
    /* y now holds relu(bn(x) + bn(res)): the mask for backward */
    struct act dy = act_randn(n, c, hw, hw), dx = act_zeros(n, c, hw, hw);
    struct vec sdy = vec_randn(c, 0, 0), sdx = vec_randn(c, 0, 0);
    for (int masked = 0; masked < 2; masked++) {
        const struct trn_tensor *mc = masked ? &y.c : NULL, *mg = masked ? &y.g : NULL;
        cpu.ops->bn_backward_reduce(&cpu, &x.c, &dy.c, mc, mean.h, sdy.h, sdx.h);
        gpu.ops->bn_backward_reduce(&gpu, &x.g, &dy.g, mg, mean.d, sdy.d, sdx.d);
        snprintf(name, sizeof(name), "bn_backward_reduce sum_dy%s", masked ? " relu" : "");
        vec_check(name, &sdy, tol);
        snprintf(name, sizeof(name), "bn_backward_reduce sum_dy_xmu%s", masked ? " relu" : "");
        vec_check(name, &sdx, tol);
        gpu.ops->to_device(&gpu, sdy.d, sdy.h, (size_t)c * sizeof(float));
        gpu.ops->to_device(&gpu, sdx.d, sdx.h, (size_t)c * sizeof(float));
        cpu.ops->bn_backward_input(&cpu, &x.c, &dy.c, mc, mean.h, invstd.h, weight.h, sdy.h, sdx.h,
                                   count, &dx.c);
        gpu.ops->bn_backward_input(&gpu, &x.g, &dy.g, mg, mean.d, invstd.d, weight.d, sdy.d, sdx.d,
                                   count, &dx.g);
        snprintf(name, sizeof(name), "bn_backward_input%s", masked ? " relu" : "");
        check_act(name, &dx, at(tol));
    }
    struct vec dwt = vec_randn(c, 0, 1), dbs = vec_randn(c, 0, 1);
    for (int acc = 0; acc < 2; acc++) {
        cpu.ops->bn_param_grads(&cpu, c, invstd.h, sdy.h, sdx.h, dwt.h, dbs.h, acc);
        gpu.ops->bn_param_grads(&gpu, c, invstd.d, sdy.d, sdx.d, dwt.d, dbs.d, acc);
        vec_check(acc ? "bn_param_grads+= dweight" : "bn_param_grads dweight", &dwt, tol);
        vec_check(acc ? "bn_param_grads+= dbias" : "bn_param_grads dbias", &dbs, tol);
    }
    for (int two = 0; two < 2; two++) {
        cpu.ops->relu_backward(&cpu, &dy.c, two ? &res.c : NULL, &y.c, &dx.c);
        gpu.ops->relu_backward(&gpu, &dy.g, two ? &res.g : NULL, &y.g, &dx.g);
        check_act(two ? "relu_backward +dy2" : "relu_backward", &dx, at(tol));
    }
    struct act *acts[] = {&x, &res, &y, &dy, &dx};
    for (size_t i = 0; i < sizeof(acts) / sizeof(acts[0]); i++)
        act_free(acts[i]);
    struct vec *vecs[] = {&mean,  &var, &weight, &bias, &rmean, &rvar, &invstd, &scale,
                          &shift, &rs,  &rb,     &sdy,  &sdx,   &dwt,  &dbs};
    for (size_t i = 0; i < sizeof(vecs) / sizeof(vecs[0]); i++)
        vec_free(vecs[i]);
}

static void check_pool(int n, int c, int hw)
{
    int oh = (hw + 2 - 3) / 2 + 1;
    struct act x = act_randn(n, c, hw, hw), y = act_zeros(n, c, oh, oh);
    size_t ny = (size_t)n * c * oh * oh;
    uint8_t *cam = malloc(ny), *gam = dev(NULL, ny);
    cpu.ops->maxpool_forward(&cpu, &x.c, &y.c, cam);
    gpu.ops->maxpool_forward(&gpu, &x.g, &y.g, gam);
    check_act("maxpool_forward", &y, at(tol));
    /* The argmax bytes are in each backend's layout; backward, which routes
     * the gradient by them, is what compares them. */
    struct act dy = act_randn(n, c, oh, oh), dx = act_zeros(n, c, hw, hw);
    cpu.ops->maxpool_backward(&cpu, &dy.c, cam, &dx.c);
    gpu.ops->maxpool_backward(&gpu, &dy.g, gam, &dx.g);
    check_act("maxpool_backward", &dx, at(tol));

    float *cy = malloc((size_t)n * c * sizeof(float));
    float *gy = dev(NULL, (size_t)n * c * sizeof(float));
    cpu.ops->avgpool_forward(&cpu, &x.c, cy);
    gpu.ops->avgpool_forward(&gpu, &x.g, gy);
    check_vec("avgpool_forward", gy, cy, (size_t)n * c, tol);
    float *dyv = randn((size_t)n * c);
    float *gdyv = dev(dyv, (size_t)n * c * sizeof(float));
    cpu.ops->avgpool_backward(&cpu, dyv, &dx.c);
    gpu.ops->avgpool_backward(&gpu, gdyv, &dx.g);
    check_act("avgpool_backward", &dx, at(tol));

    act_free(&x);
    act_free(&y);
    act_free(&dy);
    act_free(&dx);
    free(cam);
    free(cy);
    free(dyv);
    gpu.ops->free(&gpu, gam);
    gpu.ops->free(&gpu, gy);
    gpu.ops->free(&gpu, gdyv);
}

static void check_fc(int n, int in, int out, double limit)
{
    float *x = randn((size_t)n * in), *w = randn((size_t)out * in), *b = randn((size_t)out);
    float *dy = randn((size_t)n * out), *dw = randn((size_t)out * in), *db = randn((size_t)out);
    float *gx = dev(x, (size_t)n * in * 4), *gw = dev(w, (size_t)out * in * 4);
    float *gb = dev(b, (size_t)out * 4), *gdy = dev(dy, (size_t)n * out * 4);
    float *gdw = dev(dw, (size_t)out * in * 4), *gdb = dev(db, (size_t)out * 4);
    float *y = malloc((size_t)n * out * 4), *gy = dev(NULL, (size_t)n * out * 4);
    float *dx = malloc((size_t)n * in * 4), *gdx = dev(NULL, (size_t)n * in * 4);
    cpu.ops->fc_forward(&cpu, n, in, out, x, w, b, y);
    gpu.ops->fc_forward(&gpu, n, in, out, gx, gw, gb, gy);
    check_vec("fc_forward", gy, y, (size_t)n * out, limit);
    for (int acc = 0; acc < 2; acc++) {
        cpu.ops->fc_backward(&cpu, n, in, out, x, w, dy, dx, dw, db, acc);
        gpu.ops->fc_backward(&gpu, n, in, out, gx, gw, gdy, gdx, gdw, gdb, acc);
        check_vec(acc ? "fc_backward+= dw" : "fc_backward dw", gdw, dw, (size_t)out * in, limit);
        check_vec(acc ? "fc_backward+= db" : "fc_backward db", gdb, db, (size_t)out, limit);
        check_vec("fc_backward dx", gdx, dx, (size_t)n * in, limit);
    }
    float *hs[] = {x, w, b, dy, dw, db, y, dx};
    float *ds[] = {gx, gw, gb, gdy, gdw, gdb, gy, gdx};
    for (int i = 0; i < 8; i++) {
        free(hs[i]);
        gpu.ops->free(&gpu, ds[i]);
    }
}

static void check_xent(int n, int k)
{
    float *logits = randn((size_t)n * k);
    for (size_t i = 0; i < (size_t)n * k; i++)
        logits[i] *= 3;
    int32_t *labels = malloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++)
        labels[i] = (int32_t)((i * 7919) % k);
    float *gl = dev(logits, (size_t)n * k * 4);
    int32_t *glab = dev(labels, (size_t)n * sizeof(int32_t));
    float *p = malloc((size_t)n * k * 4), *gp = dev(NULL, (size_t)n * k * 4);
    float lc = cpu.ops->xent_forward(&cpu, n, k, logits, labels, p);
    float lg = gpu.ops->xent_forward(&gpu, n, k, gl, glab, gp);
    report("xent_forward loss", fabs((double)lg - lc) / fabs((double)lc), tol);
    check_vec("xent_forward probs", gp, p, (size_t)n * k, tol);
    gpu.ops->to_device(&gpu, gp, p, (size_t)n * k * 4);
    float *d = malloc((size_t)n * k * 4), *gd = dev(NULL, (size_t)n * k * 4);
    cpu.ops->xent_backward(&cpu, n, k, p, labels, 0.5f, d);
    gpu.ops->xent_backward(&gpu, n, k, gp, glab, 0.5f, gd);
    check_vec("xent_backward", gd, d, (size_t)n * k, tol);
    free(logits);
    free(labels);
    free(p);
    free(d);
    gpu.ops->free(&gpu, gl);
    gpu.ops->free(&gpu, glab);
    gpu.ops->free(&gpu, gp);
    gpu.ops->free(&gpu, gd);
}

static void check_sgd(size_t n)
{
    float *p = randn(n), *g = randn(n), *b = randn(n);
    float *gp = dev(p, n * 4), *gg = dev(g, n * 4), *gb = dev(b, n * 4);
    static const char *const names[] = {"sgd_step momentum 0", "sgd_step first", "sgd_step"};
    for (int mode = 0; mode < 3; mode++) {
        float mom = mode == 0 ? 0.0f : 0.9f;
        cpu.ops->sgd_step(&cpu, p, g, b, n, 0.1f, mom, 1e-4f, mode == 1);
        gpu.ops->sgd_step(&gpu, gp, gg, gb, n, 0.1f, mom, 1e-4f, mode == 1);
        check_vec(names[mode], gp, p, n, tol);
    }
    check_vec("sgd_step momentum buffer", gb, b, n, tol);
    free(p);
    free(g);
    free(b);
    gpu.ops->free(&gpu, gp);
    gpu.ops->free(&gpu, gg);
    gpu.ops->free(&gpu, gb);
}

/* GradScaler's unscale (--amp fp16): the same products (exact), and both
 * backends see an inf or a NaN wherever it is, and nothing when there is none. */
static void check_unscale(size_t n)
{
    float *g = randn(n);
    float *gg = dev(g, n * 4);
    float inv = 1.0f / 65536.0f;
    bool cf = cpu.ops->unscale(&cpu, g, n, inv), gf = gpu.ops->unscale(&gpu, gg, n, inv);
    check_vec("unscale", gg, g, n, 0);
    report("unscale: no inf/NaN found", cf == gf && !gf ? 0 : INFINITY, 0);
    static const float bad[2] = {INFINITY, NAN};
    for (int k = 0; k < 2; k++) {
        size_t at = k == 0 ? n - 1 : n / 3; /* the last element: the partial block */
        float v = bad[k];
        gpu.ops->to_device(&gpu, gg + at, &v, sizeof(v));
        g[at] = v;
        cf = cpu.ops->unscale(&cpu, g, n, 1.0f);
        gf = gpu.ops->unscale(&gpu, gg, n, 1.0f);
        report(k == 0 ? "unscale: inf found" : "unscale: NaN found", cf && gf ? 0 : INFINITY, 0);
        g[at] = 0;
        gpu.ops->to_device(&gpu, gg + at, &g[at], sizeof(float));
    }
    free(g);
    gpu.ops->free(&gpu, gg);
}

static void check_reorder(void)
{
    struct act a = act_randn(2, 5, 3, 7); /* NCHW -> NHWC on the GPU, back in check_act */
    check_act("reorder NCHW<->NHWC", &a, 0);
    act_free(&a);
    if (act_dt == TRN_F32)
        return;
    /* --amp: the reorder's cast (the network input's NCHW fp32 -> NHWC
     * act_dt) rounds each value as the host does, to the bit */
    size_t numel = (size_t)3 * 5 * 9 * 11;
    float *v = randn(numel);
    for (size_t i = 0; i < numel; i += 7)
        v[i] *= 1e-6f; /* small ones too: fp16's subnormals */
    struct act b = act_of_values(v, 3, 5, 9, 11, false);
    check_act("reorder NCHW fp32 -> NHWC cast", &b, 0);
    act_free(&b);
    free(v);
}

int main(int argc, char **argv)
{
    struct trn_cuda_options opt = {0, 0, false, false, false, TRN_F32};
    const char *json_path = NULL;
    for (int i = 1; i < argc; i++) {
        long v;
        if (strcmp(argv[i], "--tf32") == 0) {
            opt.tf32_conv = opt.tf32_matmul = true;
        } else if (strcmp(argv[i], "--deterministic") == 0) {
            opt.deterministic = deterministic = true;
        } else if (strcmp(argv[i], "--amp") == 0 && i + 1 < argc &&
                   (strcmp(argv[i + 1], "bf16") == 0 || strcmp(argv[i + 1], "fp16") == 0)) {
            bool bf16 = strcmp(argv[++i], "bf16") == 0;
            opt.act_dtype = act_dt = bf16 ? TRN_BF16 : TRN_F16;
            amp_tol = bf16 ? 2e-2 : 1e-2;
        } else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
            json_path = argv[++i];
        } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc &&
                   cddp_parse_long(argv[i + 1], 0, 1024, &v) == 0) {
            opt.device = (int)v;
            i++;
        } else {
            fprintf(
                stderr,
                "usage: cuda-opcheck [--tf32] [--deterministic] [--amp bf16|fp16] [--json FILE] "
                "[--device N]\n");
            return 2;
        }
    }
    int count = trn_cuda_device_count();
    if (count < 0) {
        /* a driver problem, not "no GPU" (T2008 above says which) */
        fprintf(stderr, "cuda-opcheck: the CUDA driver or runtime failed to count the devices\n");
        return 1;
    }
    if (count == 0) {
        printf("cuda-opcheck: skipped: no CUDA device visible\n");
        return 77;
    }
    char err[256];
    if (trn_backend_cpu_init(&cpu, 0, err, sizeof(err)) != 0 ||
        trn_backend_cuda_init(&gpu, &opt, err, sizeof(err)) != 0) {
        fprintf(stderr, "cuda-opcheck: %s\n", err);
        return 1;
    }
    double mm_tol = opt.tf32_conv ? 1e-2 : tol;
    if (json_path && !(json = fopen(json_path, "w"))) {
        fprintf(stderr, "cuda-opcheck: cannot write %s\n", json_path);
        return 1;
    }
    const char *amp = act_dt == TRN_BF16 ? "bf16" : act_dt == TRN_F16 ? "fp16" : "off";
    if (json) {
        fprintf(json, "{\"tf32\": %s, \"deterministic\": %s, \"amp\": \"%s\"}\n",
                opt.tf32_conv ? "true" : "false", deterministic ? "true" : "false", amp);
        fflush(json);
    }
    printf("cuda-opcheck: CUDA backend against the CPU backend (%s activations, TF32 %s%s)\n",
           act_dt == TRN_F32 ? "fp32" : amp, opt.tf32_conv ? "on" : "off",
           deterministic ? ", deterministic" : "");
    check_reorder();
    /* the stem, a bottleneck's 1x1 and 3x3, a strided 3x3 and a downsample */
    check_conv(4, 3, 64, 32, 7, 2, 3, mm_tol);
    check_conv(4, 64, 64, 16, 1, 1, 0, mm_tol);
    check_conv(4, 64, 64, 16, 3, 1, 1, mm_tol);
    check_conv(4, 64, 128, 16, 3, 2, 1, mm_tol);
    check_conv(4, 128, 256, 8, 1, 2, 0, mm_tol);
    check_bn(4, 64, 14);
    check_bn(3, 24, 5); /* odd sizes: partial blocks, channels not a multiple of 32 */
    check_pool(3, 16, 15);
    check_pool(2, 8, 16);
    if (act_dt == TRN_F32) {
        check_fc(8, 512, 100, mm_tol);
        check_xent(8, 1000);
        check_sgd(100003);
        check_unscale(100003);
    } else {
        printf("  (fc, the loss, SGD and unscale are fp32 under --amp too: the fp32 run checks "
               "them)\n");
    }
    size_t peak = trn_backend_cuda_peak_bytes(&gpu);
    /* The stem again on a backend that pads it (read at init). */
    trn_backend_cuda_free(&gpu);
    setenv("CDDP_CUDA_CONV_PAD", "1", 1);
    if (trn_backend_cuda_init(&gpu, &opt, err, sizeof(err)) != 0) {
        fprintf(stderr, "cuda-opcheck: %s\n", err);
        return 1;
    }
    name_suffix = " (padded)";
    check_conv(4, 3, 64, 32, 7, 2, 3, mm_tol);
    printf("cuda-opcheck: %d checks, %d failed; peak device memory %.1f MiB\n", checks, failures,
           (double)peak / (1 << 20));
    if (json) {
        fprintf(json, "{\"checks\": %d, \"failed\": %d, \"peak_device_bytes\": %zu}\n", checks,
                failures, peak);
        fclose(json);
    }
    trn_backend_cuda_free(&gpu);
    trn_backend_cpu_free(&cpu);
    return failures ? 1 : 0;
}
