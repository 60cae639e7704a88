/*
 * pool.c: the two poolings of a ResNet.
 *
 * Max-pool 3x3, stride 2, padding 1 (the stem): each output keeps the index
 * (0..8, row-major in its window) of the value it took, so backward routes
 * the gradient there; windows overlap, so several outputs may add into one
 * input. Ties go to the first index and NaN wins, as PyTorch's CPU kernel.
 *
 * Adaptive average pool to 1x1 (the head): the mean over H*W of every
 * channel, written as a plain (N, C) matrix for the fully connected layer.
 *
 * Both take the (N, C/B, H, W, B) layouts of bn.c (B = 1 is plain NCHW); a
 * channel block's H*W*B run is independent of the others, which is what the
 * threads split.
 */
#include <math.h>
#include <string.h>

#include "trainer/ops/cpu/cpu.h"

enum { POOL_K = 3, POOL_S = 2, POOL_P = 1 };

static inline __attribute__((always_inline)) void
maxpool_run(const float *x, float *y, uint8_t *am, int h, int w, int oh, int ow, const int B)
{
    for (int oy = 0; oy < oh; oy++)
        for (int ox = 0; ox < ow; ox++) {
            float best[16];
            uint8_t arg[16];
            for (int l = 0; l < B; l++) {
                best[l] = -INFINITY;
                arg[l] = 0;
            }
            for (int ky = 0; ky < POOL_K; ky++) {
                int iy = oy * POOL_S - POOL_P + ky;
                if (iy < 0 || iy >= h)
                    continue;
                for (int kx = 0; kx < POOL_K; kx++) {
                    int ix = ox * POOL_S - POOL_P + kx;
                    if (ix < 0 || ix >= w)
                        continue;
                    const float *xp = x + ((size_t)iy * w + ix) * B;
                    for (int l = 0; l < B; l++)
                        if (xp[l] > best[l] || isnan(xp[l])) {
                            best[l] = xp[l];
                            arg[l] = (uint8_t)(ky * POOL_K + kx);
                        }
                }
            }
            size_t o = ((size_t)oy * ow + ox) * B;
            for (int l = 0; l < B; l++) {
                y[o + l] = best[l];
                am[o + l] = arg[l];
            }
        }
}

void cpu_maxpool_forward(struct trn_backend *be, const struct trn_tensor *x, struct trn_tensor *y,
                         uint8_t *argmax)
{
    (void)be;
    int B = trn_layout_block(x->layout), cb = x->c / B;
    size_t in_run = (size_t)x->h * x->w * B, out_run = (size_t)y->h * y->w * B;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < x->n * cb; t++) {
        const float *xp = x->data + t * in_run;
        float *yp = y->data + t * out_run;
        uint8_t *ap = argmax + t * out_run;
        switch (B) {
        case 16:
            maxpool_run(xp, yp, ap, x->h, x->w, y->h, y->w, 16);
            break;
        case 8:
            maxpool_run(xp, yp, ap, x->h, x->w, y->h, y->w, 8);
            break;
        default:
            maxpool_run(xp, yp, ap, x->h, x->w, y->h, y->w, 1);
            break;
        }
    }
}

void cpu_maxpool_backward(struct trn_backend *be, const struct trn_tensor *dy,
                          const uint8_t *argmax, struct trn_tensor *dx)
{
    (void)be;
    int B = trn_layout_block(dx->layout), cb = dx->c / B;
    int h = dx->h, w = dx->w, oh = dy->h, ow = dy->w;
    size_t in_run = (size_t)h * w * B, out_run = (size_t)oh * ow * B;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < dx->n * cb; t++) {
        float *dxp = dx->data + t * in_run;
        const float *dyp = dy->data + t * out_run;
        const uint8_t *ap = argmax + t * out_run;
        memset(dxp, 0, in_run * sizeof(float));
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++)
                for (int l = 0; l < B; l++) {
                    size_t o = ((size_t)oy * ow + ox) * B + l;
                    int iy = oy * POOL_S - POOL_P + ap[o] / POOL_K;
                    int ix = ox * POOL_S - POOL_P + ap[o] % POOL_K;
                    dxp[((size_t)iy * w + ix) * B + l] += dyp[o];
                }
    }
}

void cpu_avgpool_forward(struct trn_backend *be, const struct trn_tensor *x, float *y)
{
    (void)be;
    int B = trn_layout_block(x->layout), cb = x->c / B, hw = x->h * x->w;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < x->n * cb; t++) {
        int i = t / cb, j = t % cb;
        const float *xp = x->data + (size_t)t * hw * B;
        for (int l = 0; l < B; l++) {
            double s = 0;
            for (int p = 0; p < hw; p++)
                s += xp[(size_t)p * B + l];
            y[(size_t)i * x->c + (size_t)j * B + l] = (float)(s / hw);
        }
    }
}

void cpu_avgpool_backward(struct trn_backend *be, const float *dy, struct trn_tensor *dx)
{
    (void)be;
    int B = trn_layout_block(dx->layout), cb = dx->c / B, hw = dx->h * dx->w;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < dx->n * cb; t++) {
        int i = t / cb, j = t % cb;
        float *dxp = dx->data + (size_t)t * hw * B;
        for (int p = 0; p < hw; p++)
            for (int l = 0; l < B; l++)
                dxp[(size_t)p * B + l] = dy[(size_t)i * dx->c + (size_t)j * B + l] / hw;
    }
}
