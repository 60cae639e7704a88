/*
 * sgd.cu: torch.optim.SGD's update over the flat buffers in one kernel
 * (weight decay, momentum and the step fused: one read of param, grad and
 * the momentum buffer, one write of param and the buffer). The update is
 * ops_math.h's trn_sgd_one, the same float operations in the same order as
 * ops/cpu/sgd.c, so the two backends agree to the bit.
 */
#include "trainer/ops/cuda/cuda.h"
#include "trainer/ops/cuda/ops_math.h"

/* lr_dev, skip: sgd_step_dev's (NULL for sgd_step): the rate read from the
 * device, and GradScaler's skipped step (found_inf). */
__global__ void sgd_kernel(float *param, const float *grad, float *buf, size_t n, float lr,
                           float momentum, float weight_decay, int mode, const float *lr_dev,
                           const int32_t *skip)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || (skip && *skip))
        return;
    if (lr_dev)
        lr = *lr_dev;
    trn_sgd_one(param + i, grad[i], mode == TRN_SGD_PLAIN ? NULL : buf + i, lr, momentum,
                weight_decay, mode);
}

void cuda_sgd_step(struct trn_backend *be, float *param, const float *grad, float *momentum_buf,
                   size_t n, float lr, float momentum, float weight_decay, bool first_step)
{
    cuda_op_enter_n("sgd_step", "%zu parameters", n);
    struct cuda_backend *cb = cuda_of(be);
    if (!n)
        return;
    int mode = trn_sgd_mode_of(momentum, first_step);
    sgd_kernel<<<cuda_blocks(n, 256), 256, 0, cb->stream>>>(
        param, grad, momentum_buf, n, lr, momentum, weight_decay, mode, NULL, NULL);
    cudaLaunchCheck();
}

void cuda_sgd_step_dev(struct trn_backend *be, float *param, const float *grad, float *momentum_buf,
                       size_t n, const float *lr, float momentum, float weight_decay,
                       bool first_step, const int32_t *skip)
{
    cuda_op_enter_n("sgd_step_dev", "%zu parameters", n);
    struct cuda_backend *cb = cuda_of(be);
    if (!n)
        return;
    int mode = trn_sgd_mode_of(momentum, first_step);
    sgd_kernel<<<cuda_blocks(n, 256), 256, 0, cb->stream>>>(param, grad, momentum_buf, n, 0.0f,
                                                            momentum, weight_decay, mode, lr, skip);
    cudaLaunchCheck();
}
