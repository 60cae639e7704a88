/*
 * loss.cu: softmax cross-entropy, torch.nn.CrossEntropyLoss() with its
 * defaults (mean over the batch), as ops/cpu/loss.c.
 *
 * One block per row: the row maximum, the sum of exponentials in double
 * (tree-reduced in shared memory), the softmax kept for backward, and the
 * row's loss lse - logit[label]. One more block adds the rows' losses in
 * order; the mean is copied to pinned host memory, which is the one place
 * an op waits for the GPU (the caller wants the number). Under CUDA graphs
 * (xent_forward_dev) the sum's block writes the mean to device memory
 * instead and nothing waits; xent_backward_dev reads its scale there.
 */
#include "trainer/ops/cuda/cuda.h"
#include "trainer/ops/cuda/ops_math.h"

enum { XENT_THREADS = 256 };

/* ---- kernels ---- */

__global__ void xent_row_kernel(const float *logits, const int32_t *labels, int k, float *probs,
                                double *row_loss)
{
    __shared__ float smax[XENT_THREADS];
    __shared__ double ssum[XENT_THREADS];
    int i = blockIdx.x, t = threadIdx.x;
    const float *l = logits + (size_t)i * k;
    float mx = -INFINITY;
    for (int j = t; j < k; j += XENT_THREADS)
        mx = l[j] > mx ? l[j] : mx;
    smax[t] = mx;
    __syncthreads();
    for (int s = XENT_THREADS / 2; s > 0; s /= 2) {
        if (t < s)
            smax[t] = smax[t + s] > smax[t] ? smax[t + s] : smax[t];
        __syncthreads();
    }
    mx = smax[0];
    double acc = 0;
    for (int j = t; j < k; j += XENT_THREADS)
        acc += exp((double)l[j] - mx);
    ssum[t] = acc;
    __syncthreads();
    for (int s = XENT_THREADS / 2; s > 0; s /= 2) {
        if (t < s)
            ssum[t] += ssum[t + s];
        __syncthreads();
    }
    double lse = trn_xent_lse(mx, ssum[0]);
    for (int j = t; j < k; j += XENT_THREADS)
        probs[(size_t)i * k + j] = trn_xent_prob(l[j], lse);
    if (t == 0)
        row_loss[i] = lse - l[labels[i]];
}

/* With mean not NULL (xent_forward_dev) also the mean, as the host makes it. */
__global__ void xent_total_kernel(const double *row_loss, int n, double *total, float *mean)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += row_loss[i];
    *total = s;
    if (mean)
        *mean = (float)(s / n);
}

/* f, or with scale not NULL (xent_backward_dev) *scale / n as the host makes f. */
__global__ void xent_grad_kernel(const float *probs, const int32_t *labels, int n, int k, float f,
                                 const float *scale, float *dlogits)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)n * k)
        return;
    if (scale)
        f = *scale / (float)n;
    int i = (int)(e / k), j = (int)(e % k);
    dlogits[e] = trn_xent_grad(probs[e], j == labels[i], f);
}

/* ---- launchers ---- */

/* The rows and their sum into the scratch (the total at [n]); *mean too unless NULL. */
static double *xent_queue(struct trn_backend *be, int n, int k, const float *logits,
                          const int32_t *labels, float *probs, float *mean)
{
    struct cuda_backend *cb = cuda_of(be);
    cuda_reserve(be, &cb->scratch, &cb->scratch_size, ((size_t)n + 1) * sizeof(double));
    double *row_loss = (double *)cb->scratch, *total = row_loss + n;
    xent_row_kernel<<<(unsigned)n, XENT_THREADS, 0, cb->stream>>>(logits, labels, k, probs,
                                                                  row_loss);
    cudaLaunchCheck();
    xent_total_kernel<<<1, 1, 0, cb->stream>>>(row_loss, n, total, mean);
    cudaLaunchCheck();
    return total;
}

float cuda_xent_forward(struct trn_backend *be, int n, int k, const float *logits,
                        const int32_t *labels, float *probs)
{
    cuda_op_enter_n("xent_forward", "n %d, classes %d", n, k);
    struct cuda_backend *cb = cuda_of(be);
    double *total = xent_queue(be, n, k, logits, labels, probs, NULL);
    cudaCheck(
        cudaMemcpyAsync(cb->host_loss, total, sizeof(double), cudaMemcpyDeviceToHost, cb->stream));
    cudaCheck(cudaStreamSynchronize(cb->stream));
    return (float)(*cb->host_loss / n);
}

void cuda_xent_backward(struct trn_backend *be, int n, int k, const float *probs,
                        const int32_t *labels, float scale, float *dlogits)
{
    cuda_op_enter_n("xent_backward", "n %d, classes %d", n, k);
    struct cuda_backend *cb = cuda_of(be);
    size_t total = (size_t)n * k;
    xent_grad_kernel<<<cuda_blocks(total, 256), 256, 0, cb->stream>>>(
        probs, labels, n, k, scale / (float)n, NULL, dlogits);
    cudaLaunchCheck();
}

void cuda_xent_forward_dev(struct trn_backend *be, int n, int k, const float *logits,
                           const int32_t *labels, float *probs, float *loss)
{
    cuda_op_enter_n("xent_forward_dev", "n %d, classes %d", n, k);
    (void)xent_queue(be, n, k, logits, labels, probs, loss);
}

void cuda_xent_backward_dev(struct trn_backend *be, int n, int k, const float *probs,
                            const int32_t *labels, const float *scale, float *dlogits)
{
    cuda_op_enter_n("xent_backward_dev", "n %d, classes %d", n, k);
    struct cuda_backend *cb = cuda_of(be);
    size_t total = (size_t)n * k;
    xent_grad_kernel<<<cuda_blocks(total, 256), 256, 0, cb->stream>>>(probs, labels, n, k, 0.0f,
                                                                      scale, dlogits);
    cudaLaunchCheck();
}
