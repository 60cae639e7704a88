/*
 * amp.cu: mixed precision's kernels: GradScaler's unscale with the inf/NaN
 * check over the flat gradient buffer, and the fp32 <-> bf16/fp16 casts.
 * The per-element work is ops_math.h's (trn_unscale_one, trn_f32_to_bf16,
 * ...), unit-tested on the CPU (tests/unit/test_scaler.c); only the launches
 * are new here.
 *
 * unscale is one pass: each thread unscales its element and, when it was
 * not finite, sets the flag (a plain store of 1: any order gives 1). The
 * flag is read back with the loss-scale decision on the host (a pinned
 * int, one synchronisation per step, as torch's scaler.step() has with
 * found_inf.item()).
 */
#include "trainer/ops/cuda/cuda.h"
#include "trainer/ops/cuda/ops_math.h"

/* inv_dev: unscale_dev's inverse scale in device memory (NULL: inv_scale). */
__global__ void unscale_kernel(float *grad, size_t n, float inv_scale, const float *inv_dev,
                               int *found_inf)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    if (inv_dev)
        inv_scale = *inv_dev;
    int found = 0;
    grad[i] = trn_unscale_one(grad[i], inv_scale, &found);
    if (found)
        *found_inf = 1;
}

bool cuda_unscale(struct trn_backend *be, float *grad, size_t n, float inv_scale)
{
    cuda_op_enter_n("unscale", "%zu gradients", n);
    struct cuda_backend *cb = cuda_of(be);
    if (!n)
        return false;
    cuda_reserve(be, &cb->scratch, &cb->scratch_size, sizeof(int));
    int *flag = (int *)cb->scratch;
    cudaCheck(cudaMemsetAsync(flag, 0, sizeof(int), cb->stream));
    unscale_kernel<<<cuda_blocks(n, 256), 256, 0, cb->stream>>>(grad, n, inv_scale, NULL, flag);
    cudaLaunchCheck();
    int host = 0;
    cudaCheck(cudaMemcpyAsync(&host, flag, sizeof(int), cudaMemcpyDeviceToHost, cb->stream));
    cudaCheck(cudaStreamSynchronize(cb->stream));
    return host != 0;
}

/* Under CUDA graphs: the flag is the caller's device word, read after the
 * step (train.c), and nothing here waits. */
void cuda_unscale_dev(struct trn_backend *be, float *grad, size_t n, const float *inv_scale,
                      int32_t *found_inf)
{
    cuda_op_enter_n("unscale_dev", "%zu gradients", n);
    struct cuda_backend *cb = cuda_of(be);
    cudaCheck(cudaMemsetAsync(found_inf, 0, sizeof(int32_t), cb->stream));
    if (!n)
        return;
    unscale_kernel<<<cuda_blocks(n, 256), 256, 0, cb->stream>>>(grad, n, 0.0f, inv_scale,
                                                                (int *)found_inf);
    cudaLaunchCheck();
}

/* One kernel for the four casts: Kind picks the conversion at compile time. */
enum cast_kind { TO_BF16, TO_F16, FROM_BF16, FROM_F16 };

template <int Kind, typename S, typename D>
__global__ void cast_kernel(const S *src, D *dst, size_t n)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    if constexpr (Kind == TO_BF16)
        dst[i] = trn_f32_to_bf16(src[i]);
    else if constexpr (Kind == TO_F16)
        dst[i] = trn_f32_to_f16(src[i]);
    else if constexpr (Kind == FROM_BF16)
        dst[i] = trn_bf16_to_f32(src[i]);
    else
        dst[i] = trn_f16_to_f32(src[i]);
}

template <int Kind, typename S, typename D>
static void cast(struct trn_backend *be, const S *src, D *dst, size_t n)
{
    if (!n)
        return;
    cast_kernel<Kind><<<cuda_blocks(n, 256), 256, 0, cuda_of(be)->stream>>>(src, dst, n);
    cudaLaunchCheck();
}

void cuda_cast_f32_to_bf16(struct trn_backend *be, const float *src, uint16_t *dst, size_t n)
{
    cuda_op_enter_n("cast_f32_to_bf16", "%zu values", n);
    cast<TO_BF16>(be, src, dst, n);
}

void cuda_cast_f32_to_f16(struct trn_backend *be, const float *src, uint16_t *dst, size_t n)
{
    cuda_op_enter_n("cast_f32_to_f16", "%zu values", n);
    cast<TO_F16>(be, src, dst, n);
}

void cuda_cast_bf16_to_f32(struct trn_backend *be, const uint16_t *src, float *dst, size_t n)
{
    cuda_op_enter_n("cast_bf16_to_f32", "%zu values", n);
    cast<FROM_BF16>(be, src, dst, n);
}

void cuda_cast_f16_to_f32(struct trn_backend *be, const uint16_t *src, float *dst, size_t n)
{
    cuda_op_enter_n("cast_f16_to_f32", "%zu values", n);
    cast<FROM_F16>(be, src, dst, n);
}
