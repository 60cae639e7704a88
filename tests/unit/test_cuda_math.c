/*
 * Unit tests for trainer/ops/cuda/ops_math.h, the per-element arithmetic of
 * the CUDA kernels, on the CPU: each kernel's work is replayed here over
 * NHWC data, thread by thread in the kernel's order (the reductions with the
 * kernel's partition), and compared with the CPU backend's op on the same
 * values in NCHW. Where the operations are the same the results must be the
 * same bits; the reductions (another summation order, in double) within
 * 1e-6. What is left untested is the launch itself (grids, shared memory,
 * synchronisation): tools/gpu-check.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/ops/cuda/ops_math.h"
#include "trainer/ops/ops.h"

#include "cpu_backend_fixture.h"

static uint64_t rng_state = 7;

static float nrand(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    double u = ((double)(rng_state >> 11) + 1.0) / 9007199254740993.0;
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    double v = (double)(rng_state >> 11) / 9007199254740992.0;
    return (float)(sqrt(-2 * log(u)) * cos(6.283185307179586 * v));
}

static float *randn(size_t n, float offset, float spread)
{
    float *p = malloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++)
        p[i] = offset + spread * nrand();
    return p;
}

static struct trn_tensor nchw(float *data, int n, int c, int h, int w)
{
    struct trn_tensor t = {data, n, c, h, w, TRN_F32, TRN_LAYOUT_NCHW, TRN_DEVICE_CPU};
    return t;
}

/* The dtypes activations are stored in (--amp: bf16, fp16): each kernel
 * replay runs over each, on inputs rounded to it; the CPU backend computes
 * in fp32 on those rounded values, and the kernel's stored result must be
 * the CPU's result rounded once (fp32: the same bits). */
static const int dts[] = {TRN_DT_F32, TRN_DT_BF16, TRN_DT_F16};
#define N_DTS ((int)(sizeof(dts) / sizeof(dts[0])))

/* The values as dt holds them, in place (nothing changes for fp32). */
static void round_to(float *p, size_t n, int dt)
{
    for (size_t i = 0; i < n; i++)
        p[i] = trn_act_round(dt, p[i]);
}

/* NHWC storage of dt (4 or 2 bytes an element) holding NCHW data, through
 * the header's offsets and stores. */
static void *to_store(const float *src, int n, int c, int hw, int dt)
{
    void *dst = malloc((size_t)n * c * hw * (dt == TRN_DT_F32 ? 4 : 2) + 4);
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++)
            for (int p = 0; p < hw; p++)
                trn_act_put(dst, dt, trn_nhwc_off(i, ch, p, c, hw),
                            src[trn_nchw_off(i, ch, p, c, hw)]);
    return dst;
}

/* What the kernel stored (NHWC, dt) is the CPU's NCHW fp32 result rounded
 * once, to the bit (NaN equal to NaN). */
static void assert_stored(const void *got, int dt, const float *want_nchw, int n, int c, int hw)
{
    for (int i = 0; i < n; i++)
        for (int ch = 0; ch < c; ch++)
            for (int p = 0; p < hw; p++) {
                float g = trn_act_get(got, dt, trn_nhwc_off(i, ch, p, c, hw));
                float w = trn_act_round(dt, want_nchw[trn_nchw_off(i, ch, p, c, hw)]);
                if (memcmp(&g, &w, sizeof(float)) != 0 && !(g != g && w != w)) {
                    print_error("dtype %d n %d c %d p %d: got %.9g want %.9g\n", dt, i, ch, p, g,
                                w);
                    fail();
                }
            }
}

static void assert_close(const float *got, const float *want, int n, double tol)
{
    for (int i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]), s = fmax(fabs(want[i]), 1e-3);
        if (d > tol * s) {
            print_error("[%d]: got %.9g want %.9g\n", i, got[i], want[i]);
            fail();
        }
    }
}

/* ---- offsets ---- */

static void test_offsets(void **state)
{
    (void)state;
    const int N = 2, C = 5, HW = 6;
    size_t total = (size_t)N * C * HW;
    char *seen = calloc(total, 1);
    for (int nhwc = 0; nhwc < 2; nhwc++) {
        memset(seen, 0, total);
        for (size_t e = 0; e < total; e++) {
            int n, c, p;
            trn_act_coords(nhwc, e, C, HW, &n, &c, &p);
            assert_int_equal(trn_act_off(nhwc, n, c, p, C, HW), e);
            assert_int_equal(trn_act_channel(nhwc, e, C, HW), c);
            seen[e]++;
        }
        for (size_t e = 0; e < total; e++)
            assert_int_equal(seen[e], 1);
    }
    assert_int_equal(trn_nhwc_off(1, 2, 3, C, HW), ((size_t)1 * HW + 3) * C + 2);
    assert_int_equal(trn_nchw_off(1, 2, 3, C, HW), ((size_t)1 * C + 2) * HW + 3);
    /* OIHW <-> OHWI: a bijection over the weights */
    const int O = 3, I = 4, K = 3;
    size_t nw = (size_t)O * I * K * K;
    char *hit = calloc(nw, 1);
    for (int o = 0; o < O; o++)
        for (int i = 0; i < I; i++)
            for (int y = 0; y < K; y++)
                for (int x = 0; x < K; x++) {
                    size_t a = trn_oihw_off(o, i, y, x, I, K), b = trn_ohwi_off(o, i, y, x, I, K);
                    assert_true(a < nw && b < nw);
                    hit[b]++;
                    if (i == 0 && y == 0 && x == 0)
                        assert_int_equal(a, b); /* both start at o * I * K * K */
                }
    for (size_t e = 0; e < nw; e++)
        assert_int_equal(hit[e], 1);
    free(hit);
    free(seen);
}

/* ---- activation storage (--amp) ---- */

static void test_act_storage(void **state)
{
    (void)state;
    /* ops_math.h's dtype values are ops.h's */
    assert_int_equal(TRN_DT_F32, TRN_F32);
    assert_int_equal(TRN_DT_BF16, TRN_BF16);
    assert_int_equal(TRN_DT_F16, TRN_F16);
    float vals[64] = {0.0f,     -0.0f,     1.0f,        -1.5f,      65504.0f,
                      65520.0f, 1e-7f,     -3e-8f,      1e-40f,     3.4e38f,
                      INFINITY, -INFINITY, 1.00390625f, 1.0078125f, 0.333333343f};
    for (int i = 15; i < 64; i++)
        vals[i] = nrand() * (float)(1 << (i % 20)) * (i % 3 ? 1.0f : 1e-6f);
    uint16_t h[1];
    float f[1];
    for (int i = 0; i < 64; i++) {
        float v = vals[i];
        /* fp32: stored and read back as is */
        trn_act_put(f, TRN_DT_F32, 0, v);
        assert_memory_equal(f, &v, 4);
        float back = trn_act_get(f, TRN_DT_F32, 0), r32 = trn_act_round(TRN_DT_F32, v);
        assert_memory_equal(&back, &v, 4);
        assert_memory_equal(&r32, &v, 4);
        /* bf16 and fp16: the casts' bits, widened exactly, rounding idempotent */
        trn_act_put(h, TRN_DT_BF16, 0, v);
        assert_int_equal(h[0], trn_f32_to_bf16(v));
        back = trn_act_get(h, TRN_DT_BF16, 0);
        float want = trn_bf16_to_f32(trn_f32_to_bf16(v)), rb = trn_act_round(TRN_DT_BF16, v);
        assert_memory_equal(&back, &want, 4);
        assert_memory_equal(&rb, &want, 4);
        float rbb = trn_act_round(TRN_DT_BF16, rb);
        assert_memory_equal(&rbb, &rb, 4);
        trn_act_put(h, TRN_DT_F16, 0, v);
        assert_int_equal(h[0], trn_f32_to_f16(v));
        back = trn_act_get(h, TRN_DT_F16, 0);
        want = trn_f16_to_f32(trn_f32_to_f16(v));
        float rh = trn_act_round(TRN_DT_F16, v);
        assert_memory_equal(&back, &want, 4);
        assert_memory_equal(&rh, &want, 4);
        float rhh = trn_act_round(TRN_DT_F16, rh);
        assert_memory_equal(&rhh, &rh, 4);
    }
    /* two bytes an element: a store touches only its own */
    uint16_t row[3] = {0x1111, 0x2222, 0x3333};
    trn_act_put(row, TRN_DT_BF16, 1, 1.0f);
    assert_int_equal(row[0], 0x1111);
    assert_int_equal(row[1], 0x3f80);
    assert_int_equal(row[2], 0x3333);
    trn_act_put(row, TRN_DT_F16, 2, 1.0f);
    assert_int_equal(row[1], 0x3f80);
    assert_int_equal(row[2], 0x3c00);
}

/* backend.cu's reorder, one destination element at a time: the network
 * input's NCHW fp32 -> NHWC bf16/fp16 (--amp) is each value rounded once in
 * its NHWC place, and back to NCHW fp32 exact; fp32 to fp32 is a copy. */
static void test_reorder_cast(void **state)
{
    (void)state;
    const int N = 2, C = 5, H = 3, W = 4, HW = H * W;
    size_t numel = (size_t)N * C * HW;
    float *x = randn(numel, 0, 3);
    for (size_t i = 0; i < numel; i += 5)
        x[i] *= 1e-6f; /* fp16's subnormals */
    x[7] = 1e5f;       /* past fp16's range: inf */
    float *back = malloc(numel * 4);
    void *st = malloc(numel * 4);
    for (int d = 0; d < N_DTS; d++) {
        int dt = dts[d];
        for (size_t e = 0; e < numel; e++)
            trn_reorder_one(x, 0, TRN_DT_F32, st, 1, dt, e, C, HW);
        assert_stored(st, dt, x, N, C, HW);
        for (size_t e = 0; e < numel; e++)
            trn_reorder_one(st, 1, dt, back, 0, TRN_DT_F32, e, C, HW);
        for (size_t e = 0; e < numel; e++) {
            float want = trn_act_round(dt, x[e]);
            assert_memory_equal(&back[e], &want, 4);
        }
        /* the same order, another dtype: an element-wise cast */
        for (size_t e = 0; e < numel; e++)
            trn_reorder_one(x, 0, TRN_DT_F32, st, 0, dt, e, C, HW);
        for (size_t e = 0; e < numel; e++) {
            float got = trn_act_get(st, dt, e), want = trn_act_round(dt, x[e]);
            assert_memory_equal(&got, &want, 4);
        }
    }
    free(x);
    free(back);
    free(st);
}

/* ---- batch norm ---- */

/* bn.cu's reduction, replayed: for each channel, R groups of Y thread rows,
 * over NHWC storage of dtype dt. */
enum red_mode { RED_SUM, RED_SQDEV, RED_BWD };

static void replay_reduce(int mode, int dt, const void *x, const void *dy, const void *ry,
                          const float *mean, int N, int C, int HW, float *out_a, float *out_b)
{
    size_t M = (size_t)N * HW;
    int R = trn_bn_row_groups(M), Y = TRN_BN_RED_Y;
    for (int c = 0; c < C; c++) {
        double ta_all = 0, tb_all = 0;
        for (int g = 0; g < R; g++) {
            double ta = 0, tb = 0;
            for (int ty = 0; ty < Y; ty++) {
                double a = 0, b = 0;
                for (size_t r = (size_t)g * Y + ty; r < M; r += (size_t)R * Y) {
                    int n = (int)(r / HW), p = (int)(r % HW);
                    size_t o = trn_nhwc_off(n, c, p, C, HW);
                    float xv = trn_act_get(x, dt, o);
                    if (mode == RED_SUM) {
                        a += xv;
                    } else if (mode == RED_SQDEV) {
                        a += trn_bn_sqdev(xv, mean[c]);
                    } else {
                        float gv = trn_relu_mask(trn_act_get(dy, dt, o), ry != NULL,
                                                 ry ? trn_act_get(ry, dt, o) : 0.0f);
                        a += gv;
                        b += trn_bn_dy_xmu(gv, xv, mean[c]);
                    }
                }
                ta += a;
                tb += b;
            }
            ta_all += ta;
            tb_all += tb;
        }
        if (mode == RED_SUM) {
            out_a[c] = trn_bn_mean(ta_all, (double)M);
        } else if (mode == RED_SQDEV) {
            out_a[c] = trn_bn_var(ta_all, (double)M);
        } else {
            out_a[c] = (float)ta_all;
            out_b[c] = (float)tb_all;
        }
    }
}

/* Shapes: small (one row group), and large enough for several groups with
 * a ragged last one. */
static const int bn_shapes[][3] = {{2, 5, 9}, {3, 40, 625}};

static void test_bn_forward(void **state)
{
    (void)state;
    for (size_t s = 0; s < sizeof(bn_shapes) / sizeof(bn_shapes[0]); s++)
        for (int d = 0; d < N_DTS; d++) {
            int N = bn_shapes[s][0], C = bn_shapes[s][1], HW = bn_shapes[s][2], dt = dts[d];
            size_t numel = (size_t)N * C * HW;
            float *x = randn(numel, 3.0f, 2.0f);
            round_to(x, numel, dt);
            void *xs = to_store(x, N, C, HW, dt);
            struct trn_tensor xt = nchw(x, N, C, HW, 1);
            float *mean = malloc(C * 4), *var = malloc(C * 4), *gm = malloc(C * 4),
                  *gv = malloc(C * 4);
            be.ops->bn_stats(&be, &xt, mean, var);
            replay_reduce(RED_SUM, dt, xs, NULL, NULL, NULL, N, C, HW, gm, NULL);
            assert_close(gm, mean, C, 1e-6);
            replay_reduce(RED_SQDEV, dt, xs, NULL, NULL, mean, N, C, HW, gv, NULL);
            assert_close(gv, var, C, 1e-6);

            /* prepare, training and eval: the same bits */
            float *w = randn(C, 1, 0.3f), *b = randn(C, 0, 0.3f);
            float *rm = randn(C, 0, 0.1f), *rv = randn(C, 1, 0.1f);
            float *grm = malloc(C * 4), *grv = malloc(C * 4);
            memcpy(grm, rm, C * 4);
            memcpy(grv, rv, C * 4);
            float *inv = malloc(C * 4), *sc = malloc(C * 4), *sh = malloc(C * 4);
            float ginv, gsc, gsh;
            double count = (double)N * HW;
            be.ops->bn_prepare(&be, C, mean, var, count, 1e-5, 0.1, w, b, rm, rv, inv, sc, sh);
            for (int c = 0; c < C; c++) {
                trn_bn_prepare_one(mean[c], var[c], count, 1e-5, 0.1f, w[c], b[c], &grm[c], &grv[c],
                                   &ginv, &gsc, &gsh);
                assert_memory_equal(&ginv, &inv[c], 4);
                assert_memory_equal(&gsc, &sc[c], 4);
                assert_memory_equal(&gsh, &sh[c], 4);
            }
            assert_memory_equal(grm, rm, C * 4);
            assert_memory_equal(grv, rv, C * 4);
            float *einv = malloc(C * 4), *esc = malloc(C * 4), *esh = malloc(C * 4);
            be.ops->bn_prepare(&be, C, rm, rv, count, 1e-5, 0.1, w, b, NULL, NULL, einv, esc, esh);
            for (int c = 0; c < C; c++) {
                trn_bn_prepare_one(rm[c], rv[c], count, 1e-5, 0.1f, w[c], b[c], NULL, NULL, &ginv,
                                   &gsc, &gsh);
                assert_memory_equal(&ginv, &einv[c], 4);
                assert_memory_equal(&gsc, &esc[c], 4);
                assert_memory_equal(&gsh, &esh[c], 4);
            }

            /* apply: every residual kind, with and without the ReLU; over dt
             * storage, the CPU's fp32 apply rounded once */
            float *r = randn(numel, 0, 1);
            round_to(r, numel, dt);
            void *rs = to_store(r, N, C, HW, dt), *gy = malloc(numel * 4);
            float *ra = randn(C, 1, 0.3f), *rb = randn(C, 0, 0.3f);
            float *y = malloc(numel * 4);
            struct trn_tensor rt = nchw(r, N, C, HW, 1), yt = nchw(y, N, C, HW, 1);
            for (int kind = TRN_BN_RES_NONE; kind <= TRN_BN_RES_BN; kind++)
                for (int relu = 0; relu < 2; relu++) {
                    be.ops->bn_apply(&be, &xt, sc, sh, kind ? &rt : NULL,
                                     kind == TRN_BN_RES_BN ? ra : NULL,
                                     kind == TRN_BN_RES_BN ? rb : NULL, relu, &yt);
                    for (size_t e = 0; e < numel; e++) {
                        int c = trn_act_channel(1, e, C, HW);
                        trn_act_put(gy, dt, e,
                                    trn_bn_apply_one(trn_act_get(xs, dt, e), sc[c], sh[c], kind,
                                                     trn_act_get(rs, dt, e), ra[c], rb[c],
                                                     relu ? 0.0f : -INFINITY));
                    }
                    assert_stored(gy, dt, y, N, C, HW);
                }
            void *bufs[] = {x,   xs, mean, var,  gm,  gv,  w, b,  rm, rv, grm, grv,
                            inv, sc, sh,   einv, esc, esh, r, rs, ra, rb, y,   gy};
            for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
                free(bufs[i]);
        }
}

static void test_bn_backward(void **state)
{
    (void)state;
    for (size_t s = 0; s < sizeof(bn_shapes) / sizeof(bn_shapes[0]); s++)
        for (int d = 0; d < N_DTS; d++) {
            int N = bn_shapes[s][0], C = bn_shapes[s][1], HW = bn_shapes[s][2], dt = dts[d];
            size_t numel = (size_t)N * C * HW;
            double count = (double)N * HW;
            float *x = randn(numel, 1, 2), *dy = randn(numel, 0, 1), *ry = randn(numel, 0, 1);
            for (size_t e = 0; e < numel; e++)
                ry[e] = ry[e] < 0 ? 0 : ry[e];
            round_to(x, numel, dt);
            round_to(dy, numel, dt);
            round_to(ry, numel, dt);
            void *xs = to_store(x, N, C, HW, dt), *dys = to_store(dy, N, C, HW, dt);
            void *rys = to_store(ry, N, C, HW, dt);
            float *mean = randn(C, 1, 0.1f), *inv = randn(C, 0.5f, 0.01f), *w = randn(C, 1, 0.3f);
            struct trn_tensor xt = nchw(x, N, C, HW, 1), dyt = nchw(dy, N, C, HW, 1);
            struct trn_tensor ryt = nchw(ry, N, C, HW, 1);
            float *sdy = malloc(C * 4), *sdx = malloc(C * 4), *gs = malloc(C * 4),
                  *gq = malloc(C * 4);
            float *dx = malloc(numel * 4);
            void *gdx = malloc(numel * 4);
            struct trn_tensor dxt = nchw(dx, N, C, HW, 1);
            for (int masked = 0; masked < 2; masked++) {
                be.ops->bn_backward_reduce(&be, &xt, &dyt, masked ? &ryt : NULL, mean, sdy, sdx);
                replay_reduce(RED_BWD, dt, xs, dys, masked ? rys : NULL, mean, N, C, HW, gs, gq);
                assert_close(gs, sdy, C, 1e-6);
                assert_close(gq, sdx, C, 1e-6);
                /* the input gradient from the same sums: the CPU's rounded once */
                be.ops->bn_backward_input(&be, &xt, &dyt, masked ? &ryt : NULL, mean, inv, w, sdy,
                                          sdx, count, &dxt);
                for (size_t e = 0; e < numel; e++) {
                    int c = trn_act_channel(1, e, C, HW);
                    float k1, a, b;
                    trn_bn_bwd_coef(inv[c], w[c], sdy[c], sdx[c], count, &k1, &a, &b);
                    float g =
                        trn_relu_mask(trn_act_get(dys, dt, e), masked, trn_act_get(rys, dt, e));
                    trn_act_put(gdx, dt, e,
                                trn_bn_bwd_input_one(g, trn_act_get(xs, dt, e), mean[c], k1, a, b));
                }
                assert_stored(gdx, dt, dx, N, C, HW);
            }
            /* parameter gradients, set and accumulated */
            float *dw = randn(C, 0, 1), *db = randn(C, 0, 1), *gdw = malloc(C * 4),
                  *gdb = malloc(C * 4);
            memcpy(gdw, dw, C * 4);
            memcpy(gdb, db, C * 4);
            for (int acc = 0; acc < 2; acc++) {
                be.ops->bn_param_grads(&be, C, inv, sdy, sdx, dw, db, acc);
                for (int c = 0; c < C; c++)
                    trn_bn_param_grad_one(inv[c], sdy[c], sdx[c], acc, &gdw[c], &gdb[c]);
                assert_memory_equal(gdw, dw, C * 4);
                assert_memory_equal(gdb, db, C * 4);
            }
            /* ReLU backward, with and without the shortcut's gradient */
            float *dy2 = randn(numel, 0, 1);
            round_to(dy2, numel, dt);
            void *dy2s = to_store(dy2, N, C, HW, dt);
            struct trn_tensor dy2t = nchw(dy2, N, C, HW, 1);
            for (int two = 0; two < 2; two++) {
                be.ops->relu_backward(&be, &dyt, two ? &dy2t : NULL, &ryt, &dxt);
                for (size_t e = 0; e < numel; e++)
                    trn_act_put(gdx, dt, e,
                                trn_relu_bwd_one(trn_act_get(dys, dt, e), two,
                                                 trn_act_get(dy2s, dt, e),
                                                 trn_act_get(rys, dt, e)));
                assert_stored(gdx, dt, dx, N, C, HW);
            }
            void *bufs[] = {x,  xs, dy, dys, ry, rys, mean, inv, w,   sdy, sdx,
                            gs, gq, dx, gdx, dw, db,  gdw,  gdb, dy2, dy2s};
            for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
                free(bufs[i]);
        }
}

/* ---- pooling ---- */

static void test_maxpool_outs(void **state)
{
    (void)state;
    /* trn_maxpool_outs against the definition, for every input of a few extents */
    for (int h = 1; h <= 12; h++) {
        int oh = (h + 2 * TRN_POOL_P - TRN_POOL_K) / TRN_POOL_S + 1;
        for (int i = 0; i < h; i++) {
            int lo, hi, want_lo = -1, want_hi = -2;
            for (int o = 0; o < oh; o++)
                for (int k = 0; k < TRN_POOL_K; k++)
                    if (trn_maxpool_in(o, k) == i) {
                        if (want_lo < 0)
                            want_lo = o;
                        want_hi = o;
                    }
            trn_maxpool_outs(i, oh, &lo, &hi);
            assert_int_equal(lo, want_lo);
            assert_int_equal(hi, want_hi);
        }
    }
}

/* pool.cu's kernels replayed over storage of dtype dt, against the CPU on
 * the rounded inputs: max-pool's output exact (one of its inputs), the
 * backward sums the CPU's rounded once, the pooled features fp32 the CPU's
 * bits. */
static void pool_check(int dt)
{
    const int N = 2, C = 3, H = 9, W = 9, OH = 5, OW = 5, HW = H * W, OHW = OH * OW;
    size_t numel = (size_t)N * C * HW, onumel = (size_t)N * C * OHW;
    float *x = randn(numel, 0, 1);
    x[4] = x[5] = 7.0f; /* a tie */
    x[40] = NAN;        /* NaN wins */
    x[41] = NAN;
    round_to(x, numel, dt);
    void *xs = to_store(x, N, C, HW, dt);
    float *y = malloc(onumel * 4);
    void *gy = malloc(onumel * 4);
    uint8_t *am = malloc(onumel), *gam = malloc(onumel);
    struct trn_tensor xt = nchw(x, N, C, H, W), yt = nchw(y, N, C, OH, OW);
    be.ops->maxpool_forward(&be, &xt, &yt, am);
    /* pool.cu's forward, one output at a time */
    for (size_t e = 0; e < onumel; e++) {
        int n, c, op;
        trn_act_coords(1, e, C, OHW, &n, &c, &op);
        int oy = op / OW, ox = op % OW, arg = 0;
        float best = -INFINITY;
        for (int ky = 0; ky < TRN_POOL_K; ky++)
            for (int kx = 0; kx < TRN_POOL_K; kx++) {
                int iy = trn_maxpool_in(oy, ky), ix = trn_maxpool_in(ox, kx);
                if (iy < 0 || iy >= H || ix < 0 || ix >= W)
                    continue;
                float v = trn_act_get(xs, dt, trn_nhwc_off(n, c, iy * W + ix, C, HW));
                if (trn_maxpool_takes(v, best)) {
                    best = v;
                    arg = ky * TRN_POOL_K + kx;
                }
            }
        trn_act_put(gy, dt, e, best);
        gam[e] = (uint8_t)arg;
    }
    assert_stored(gy, dt, y, N, C, OHW);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            for (int p = 0; p < OHW; p++)
                assert_int_equal(gam[trn_nhwc_off(n, c, p, C, OHW)],
                                 am[trn_nchw_off(n, c, p, C, OHW)]);
    /* backward: pool.cu gathers per input, the CPU scatters per output */
    float *dy = randn(onumel, 0, 1);
    round_to(dy, onumel, dt);
    void *dys = to_store(dy, N, C, OHW, dt), *gdx = malloc(numel * 4);
    float *dx = malloc(numel * 4);
    struct trn_tensor dyt = nchw(dy, N, C, OH, OW), dxt = nchw(dx, N, C, H, W);
    be.ops->maxpool_backward(&be, &dyt, am, &dxt);
    for (size_t e = 0; e < numel; e++) {
        int n, c, p;
        trn_act_coords(1, e, C, HW, &n, &c, &p);
        int iy = p / W, ix = p % W, y0, y1, x0, x1;
        trn_maxpool_outs(iy, OH, &y0, &y1);
        trn_maxpool_outs(ix, OW, &x0, &x1);
        float sum = 0.0f;
        for (int oy = y0; oy <= y1; oy++)
            for (int ox = x0; ox <= x1; ox++) {
                size_t o = trn_nhwc_off(n, c, oy * OW + ox, C, OHW);
                if (trn_maxpool_in(oy, gam[o] / TRN_POOL_K) == iy &&
                    trn_maxpool_in(ox, gam[o] % TRN_POOL_K) == ix)
                    sum += trn_act_get(dys, dt, o);
            }
        trn_act_put(gdx, dt, e, sum);
    }
    assert_stored(gdx, dt, dx, N, C, HW);
    /* average pool: the same double sums in the same order, fp32 out */
    float *ay = malloc((size_t)N * C * 4), *gay = malloc((size_t)N * C * 4);
    for (size_t e = 0; e < numel; e++)
        if (isnan(x[e]))
            x[e] = 1.0f;
    free(xs);
    xs = to_store(x, N, C, HW, dt);
    be.ops->avgpool_forward(&be, &xt, ay);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double sum = 0;
            for (int p = 0; p < HW; p++)
                sum += trn_act_get(xs, dt, trn_nhwc_off(n, c, p, C, HW));
            gay[n * C + c] = trn_avgpool_mean(sum, HW);
        }
    assert_memory_equal(gay, ay, (size_t)N * C * 4);
    be.ops->avgpool_backward(&be, ay, &dxt);
    for (size_t e = 0; e < numel; e++) {
        int n, c, p;
        trn_act_coords(1, e, C, HW, &n, &c, &p);
        trn_act_put(gdx, dt, e, trn_avgpool_grad(ay[n * C + c], HW));
    }
    assert_stored(gdx, dt, dx, N, C, HW);
    void *bufs[] = {x, xs, y, gy, dy, dys, dx, gdx, ay, gay, am, gam};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]);
}

static void test_pool(void **state)
{
    (void)state;
    for (int d = 0; d < N_DTS; d++)
        pool_check(dts[d]);
}

/* ---- loss, SGD ---- */

static void test_xent(void **state)
{
    (void)state;
    const int N = 5, K = 37;
    float *l = randn((size_t)N * K, 0, 3), *p = malloc(N * K * 4), *gp = malloc(N * K * 4);
    int32_t labels[5] = {0, 36, 5, 17, 5};
    float loss = be.ops->xent_forward(&be, N, K, l, labels, p);
    double total = 0;
    for (int i = 0; i < N; i++) {
        const float *row = l + (size_t)i * K;
        float mx = -INFINITY;
        for (int j = 0; j < K; j++)
            mx = row[j] > mx ? row[j] : mx;
        double s = 0;
        for (int j = 0; j < K; j++)
            s += exp((double)row[j] - mx);
        double lse = trn_xent_lse(mx, s);
        for (int j = 0; j < K; j++)
            gp[i * K + j] = trn_xent_prob(row[j], lse);
        total += lse - row[labels[i]];
    }
    /* the kernel sums exp() in a tree, not in order: close, not equal */
    assert_close(gp, p, N * K, 1e-6);
    float gl = (float)(total / N);
    assert_close(&gl, &loss, 1, 1e-6);
    float *d = malloc(N * K * 4), *gd = malloc(N * K * 4);
    be.ops->xent_backward(&be, N, K, p, labels, 0.25f, d);
    for (int e = 0; e < N * K; e++)
        gd[e] = trn_xent_grad(p[e], e % K == labels[e / K], 0.25f / (float)N);
    assert_memory_equal(gd, d, (size_t)N * K * 4);
    free(l);
    free(p);
    free(gp);
    free(d);
    free(gd);
}

static void test_sgd(void **state)
{
    (void)state;
    const size_t n = 1001;
    float *p = randn(n, 0, 1), *g = randn(n, 0, 1), *b = randn(n, 0, 1);
    float *gp = malloc(n * 4), *gb = malloc(n * 4);
    memcpy(gp, p, n * 4);
    memcpy(gb, b, n * 4);
    for (int step = 0; step < 4; step++) {
        float mom = step == 0 ? 0.0f : 0.9f;
        bool first = step == 1;
        be.ops->sgd_step(&be, p, g, b, n, 0.1f, mom, 1e-4f, first);
        int mode = trn_sgd_mode_of(mom, first);
        assert_int_equal(mode, step == 0   ? TRN_SGD_PLAIN
                               : step == 1 ? TRN_SGD_FIRST
                                           : TRN_SGD_MOMENTUM);
        for (size_t i = 0; i < n; i++)
            trn_sgd_one(&gp[i], g[i], &gb[i], 0.1f, mom, 1e-4f, mode);
        assert_memory_equal(gp, p, n * 4);
        assert_memory_equal(gb, b, n * 4);
    }
    free(p);
    free(g);
    free(b);
    free(gp);
    free(gb);
}

/* ---- the padded convolution (conv.cu's fallback for few input channels) ---- */

/* max |got - want| / max |want| over n values. */
static double scale_err(const float *got, const float *want, size_t n)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)got[i] - want[i]));
        s = fmax(s, fabs((double)want[i]));
    }
    return s > 0 ? d / s : d;
}

/* The CPU backend's convolution of NCHW x (N, cin, H, W) with OIHW w: y,
 * the weight gradient and the input gradient for dy (all malloc'd). */
static void cpu_conv(const float *x, const float *w, const float *dy, int N, int cin, int H, int O,
                     int K, int S, int P, float **y, float **dw, float **dx)
{
    int OH = (H + 2 * P - K) / S + 1;
    struct trn_conv conv = {cin, O, K, S, P, true, NULL};
    size_t ny = (size_t)N * O * OH * OH, nx = (size_t)N * cin * H * H;
    *y = malloc(ny * 4);
    *dw = malloc((size_t)O * cin * K * K * 4);
    *dx = malloc(nx * 4);
    struct trn_tensor xt = nchw((float *)x, N, cin, H, H), yt = nchw(*y, N, O, OH, OH);
    struct trn_tensor dyt = nchw((float *)dy, N, O, OH, OH), dxt = nchw(*dx, N, cin, H, H);
    be.ops->conv_forward(&be, &conv, &xt, w, &yt);
    be.ops->conv_backward_weights(&be, &conv, &xt, &dyt, *dw, false);
    be.ops->conv_backward_data(&be, &conv, w, &dyt, &dxt);
    be.ops->conv_release(&be, &conv);
}

static void test_conv_padded(void **state)
{
    (void)state;
    assert_int_equal(trn_conv_pad_channels(3), 8);
    assert_int_equal(trn_conv_pad_channels(8), 8);
    assert_int_equal(trn_conv_pad_channels(9), 16);
    assert_int_equal(trn_conv_pad_channels(64), 64);

    /* the stem's shape, small: 3 -> 16 channels, 7x7 stride 2 pad 3 */
    const int N = 2, C = 3, H = 13, O = 16, K = 7, S = 2, P = 3;
    const int Cp = trn_conv_pad_channels(C), HW = H * H, OH = (H + 2 * P - K) / S + 1;
    size_t nx = (size_t)N * C * HW, nxp = (size_t)N * Cp * HW, nw = (size_t)O * C * K * K,
           nwp = (size_t)O * Cp * K * K, ny = (size_t)N * O * OH * OH;
    float *x = randn(nx, 0, 1), *w = randn(nw, 0, 0.2f), *dy = randn(ny, 0, 1);
    float *y, *dw, *dx;
    cpu_conv(x, w, dy, N, C, H, O, K, S, P, &y, &dw, &dx);

    for (int nhwc = 0; nhwc < 2; nhwc++)
        for (int d = 0; d < N_DTS; d++) {
            int dt = dts[d];
            /* x in the layout and dtype, padded as pad_channels_kernel does */
            void *xs = malloc(nx * 4), *xps = malloc(nxp * 4);
            float *xr = malloc(nx * 4);
            for (size_t e = 0; e < nx; e++) {
                int n, c, p;
                trn_act_coords(0, e, C, HW, &n, &c, &p);
                xr[e] = trn_act_round(dt, x[e]);
                trn_act_put(xs, dt, trn_act_off(nhwc, n, c, p, C, HW), x[e]);
            }
            for (size_t e = 0; e < nxp; e++)
                trn_act_put(xps, dt, e, trn_pad_channel_get(xs, dt, nhwc, e, C, Cp, HW));
            /* back to NCHW fp32: the first C channels are x's values, the rest exact zeros */
            float *xp = malloc(nxp * 4);
            for (size_t e = 0; e < nxp; e++) {
                int n, c, p;
                trn_act_coords(0, e, Cp, HW, &n, &c, &p);
                xp[e] = trn_act_get(xps, dt, trn_act_off(nhwc, n, c, p, Cp, HW));
                float want = c < C ? xr[trn_nchw_off(n, c, p, C, HW)] : 0.0f;
                assert_memory_equal(&xp[e], &want, 4);
            }
            /* unpadding gives the stored x back, to the bit */
            for (size_t e = 0; e < nx; e++) {
                float got = trn_unpad_channel_get(xps, dt, nhwc, e, C, Cp, HW);
                float want = trn_act_get(xs, dt, e);
                assert_memory_equal(&got, &want, 4);
            }
            /* the filter as cuDNN reads it (KRSC for NHWC): zero taps past C,
             * and every real weight where the gradient is read back from */
            float *wps = malloc(nwp * 4);
            for (size_t e = 0; e < nwp; e++)
                wps[e] = trn_filter_pad_get(w, e, C, Cp, K, nhwc);
            for (size_t e = 0; e < nw; e++) {
                size_t at = trn_filter_unpad_off(e, C, Cp, K, nhwc);
                assert_memory_equal(&wps[at], &w[e], 4);
                /* unpadded (Ip == I): the KRSC (or OIHW) offsets, both ways */
                int kx = (int)(e % K), ky = (int)(e / K % K), i = (int)(e / (K * K) % C),
                    o = (int)(e / (K * K * C));
                size_t u = trn_filter_unpad_off(e, C, C, K, nhwc);
                assert_int_equal(u, nhwc ? trn_ohwi_off(o, i, ky, kx, C, K) : e);
                float back = trn_filter_pad_get(w, u, C, C, K, nhwc);
                assert_memory_equal(&back, &w[e], 4);
            }
            size_t zeros = 0;
            for (size_t e = 0; e < nwp; e++)
                zeros += wps[e] == 0.0f;
            assert_true(zeros >= nwp - nw); /* the padded taps */
            free(xs);
            free(xps);
            if (dt != TRN_DT_F32) {
                free(xr);
                free(xp);
                free(wps);
                continue;
            }
            /* fp32: the convolution on 8 channels is the one on 3. The zero
             * channels and taps add exact zeros; what differs is the order
             * of the sums, so within fp32 rounding of the tensor's scale. */
            float *wp = malloc(nwp * 4); /* OIHW, Cp channels, for the CPU */
            for (int o = 0; o < O; o++)
                for (int i = 0; i < Cp; i++)
                    for (int ky = 0; ky < K; ky++)
                        for (int kx = 0; kx < K; kx++)
                            wp[trn_oihw_off(o, i, ky, kx, Cp, K)] =
                                wps[nhwc ? trn_ohwi_off(o, i, ky, kx, Cp, K)
                                         : trn_oihw_off(o, i, ky, kx, Cp, K)];
            float *yp, *dwp, *dxp;
            cpu_conv(xp, wp, dy, N, Cp, H, O, K, S, P, &yp, &dwp, &dxp);
            assert_true(scale_err(yp, y, ny) < 1e-5);
            /* the weight gradient as cuDNN writes it (KRSC for NHWC), read back */
            float *dws = malloc(nwp * 4), *dwb = malloc(nw * 4);
            for (int o = 0; o < O; o++)
                for (int i = 0; i < Cp; i++)
                    for (int ky = 0; ky < K; ky++)
                        for (int kx = 0; kx < K; kx++)
                            dws[nhwc ? trn_ohwi_off(o, i, ky, kx, Cp, K)
                                     : trn_oihw_off(o, i, ky, kx, Cp, K)] =
                                dwp[trn_oihw_off(o, i, ky, kx, Cp, K)];
            for (size_t e = 0; e < nw; e++)
                dwb[e] = dws[trn_filter_unpad_off(e, C, Cp, K, nhwc)];
            assert_true(scale_err(dwb, dw, nw) < 1e-5);
            /* the input gradient in the layout, unpadded, back to NCHW */
            float *dxs = malloc(nxp * 4), *dxb = malloc(nx * 4);
            for (size_t e = 0; e < nxp; e++) {
                int n, c, p;
                trn_act_coords(0, e, Cp, HW, &n, &c, &p);
                dxs[trn_act_off(nhwc, n, c, p, Cp, HW)] = dxp[e];
            }
            for (size_t e = 0; e < nx; e++) {
                int n, c, p;
                trn_act_coords(nhwc, e, C, HW, &n, &c, &p);
                dxb[trn_nchw_off(n, c, p, C, HW)] =
                    trn_unpad_channel_get(dxs, TRN_DT_F32, nhwc, e, C, Cp, HW);
            }
            assert_true(scale_err(dxb, dx, nx) < 1e-5);
            void *bufs[] = {xr, xp, wps, wp, yp, dwp, dxp, dws, dwb, dxs, dxb};
            for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
                free(bufs[i]);
        }
    void *bufs[] = {x, w, dy, y, dw, dx};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        free(bufs[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offsets),      cmocka_unit_test(test_act_storage),
        cmocka_unit_test(test_reorder_cast), cmocka_unit_test(test_bn_forward),
        cmocka_unit_test(test_bn_backward),  cmocka_unit_test(test_maxpool_outs),
        cmocka_unit_test(test_pool),         cmocka_unit_test(test_xent),
        cmocka_unit_test(test_sgd),          cmocka_unit_test(test_conv_padded),
    };
    return cmocka_run_group_tests(tests, cpu_backend_setup, cpu_backend_teardown);
}
