/*
 * fc.c: the fully connected head, torch.nn.Linear: y = x w^T + b with w
 * stored (out, in). Three matrix products through oneDNN's sgemm (row-major,
 * on the same OpenMP threads as everything else); the bias gradient is the
 * column sum of dy, accumulated in double.
 */
#include "trainer/ops/cpu/cpu.h"

void cpu_fc_forward(struct trn_backend *be, int n, int in, int out, const float *x, const float *w,
                    const float *b, float *y)
{
    (void)be;
    /* y (n, out) = x (n, in) . w^T (in, out) */
    dnnlCheck(dnnl_sgemm('N', 'T', n, out, in, 1.0f, x, in, w, in, 0.0f, y, out));
    for (int i = 0; i < n; i++)
        for (int o = 0; o < out; o++)
            y[(size_t)i * out + o] += b[o];
}

void cpu_fc_backward(struct trn_backend *be, int n, int in, int out, const float *x, const float *w,
                     const float *dy, float *dx, float *dw, float *db, bool accumulate)
{
    (void)be;
    /* dw (out, in) = dy^T (out, n) . x (n, in) */
    dnnlCheck(
        dnnl_sgemm('T', 'N', out, in, n, 1.0f, dy, out, x, in, accumulate ? 1.0f : 0.0f, dw, in));
    for (int o = 0; o < out; o++) {
        double s = 0;
        for (int i = 0; i < n; i++)
            s += dy[(size_t)i * out + o];
        db[o] = accumulate ? db[o] + (float)s : (float)s;
    }
    /* dx (n, in) = dy (n, out) . w (out, in) */
    if (dx)
        dnnlCheck(dnnl_sgemm('N', 'N', n, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in));
}
