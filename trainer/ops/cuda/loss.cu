/*
 * loss.cu: softmax cross-entropy, torch.nn.CrossEntropyLoss() with its
 * defaults (mean over the batch), as ops/cpu/loss.c.
 *
 * One block per row: the row maximum, the sum of exponentials in double
 * (tree-reduced in shared memory), the softmax kept for backward, and the
 * row's loss lse - logit[label]. One more block adds the rows' losses in
 * order; the mean is copied to pinned host memory, which is the one place
 * an op waits for the GPU (the caller wants the number).
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

__global__ void xent_total_kernel(const double *row_loss, int n, double *total)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += row_loss[i];
    *total = s;
}

__global__ void xent_grad_kernel(const float *probs, const int32_t *labels, int n, int k, float f,
                                 float *dlogits)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (size_t)n * k)
        return;
    int i = (int)(e / k), j = (int)(e % k);
    dlogits[e] = trn_xent_grad(probs[e], j == labels[i], f);
}

/* ---- launchers ---- */

float cuda_xent_forward(struct trn_backend *be, int n, int k, const float *logits,
                        const int32_t *labels, float *probs)
{
    struct cuda_backend *cb = cuda_of(be);
    cuda_reserve(be, &cb->scratch, &cb->scratch_size, ((size_t)n + 1) * sizeof(double));
    double *row_loss = (double *)cb->scratch, *total = row_loss + n;
    xent_row_kernel<<<(unsigned)n, XENT_THREADS, 0, cb->stream>>>(logits, labels, k, probs,
                                                                  row_loss);
    cudaLaunchCheck();
    xent_total_kernel<<<1, 1, 0, cb->stream>>>(row_loss, n, total);
    cudaLaunchCheck();
    cudaCheck(
        cudaMemcpyAsync(cb->host_loss, total, sizeof(double), cudaMemcpyDeviceToHost, cb->stream));
    cudaCheck(cudaStreamSynchronize(cb->stream));
    return (float)(*cb->host_loss / n);
}

void cuda_xent_backward(struct trn_backend *be, int n, int k, const float *probs,
                        const int32_t *labels, float scale, float *dlogits)
{
    struct cuda_backend *cb = cuda_of(be);
    size_t total = (size_t)n * k;
    xent_grad_kernel<<<cuda_blocks(total, 256), 256, 0, cb->stream>>>(probs, labels, n, k,
                                                                      scale / (float)n, dlogits);
    cudaLaunchCheck();
}
