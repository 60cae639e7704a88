/*
 * sgd.c: torch.optim.SGD's update (PyTorch 1.13, dampening 0, no Nesterov),
 * elementwise over a slice of the flat buffers:
 *
 *     d = grad + weight_decay * param        (weight decay on every parameter)
 *     buf = d                                 on the first step
 *     buf = momentum * buf + d                after it
 *     param = param - lr * buf
 *
 * (with momentum 0 the buffer is not touched and d itself is the step). The
 * operations are done in float in this order, as PyTorch does, so the
 * result agrees to the last bit or so.
 */
#include <math.h>

#include "trainer/ops/cpu/cpu.h"

void cpu_sgd_step(struct trn_backend *be, float *param, const float *grad, float *momentum_buf,
                  size_t n, float lr, float momentum, float weight_decay, bool first_step)
{
    (void)be;
    if (momentum == 0.0f) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) {
            float d = grad[i] + weight_decay * param[i];
            param[i] = param[i] - lr * d;
        }
        return;
    }
    if (first_step) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) {
            float d = grad[i] + weight_decay * param[i];
            momentum_buf[i] = d;
            param[i] = param[i] - lr * d;
        }
        return;
    }
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float d = grad[i] + weight_decay * param[i];
        float b = momentum * momentum_buf[i] + d;
        momentum_buf[i] = b;
        param[i] = param[i] - lr * b;
    }
}

/* GradScaler's unscale_: every gradient times inv_scale, noting inf or NaN
 * (checked before unscaling, as torch does). */
bool cpu_unscale(struct trn_backend *be, float *grad, size_t n, float inv_scale)
{
    (void)be;
    int found = 0;
#pragma omp parallel for reduction(| : found) schedule(static)
    for (size_t i = 0; i < n; i++) {
        found |= !isfinite(grad[i]);
        grad[i] *= inv_scale;
    }
    return found != 0;
}
