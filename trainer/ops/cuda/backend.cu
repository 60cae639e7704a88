/*
 * backend.cu: the CUDA backend: device, stream, cuDNN and cuBLAS handles,
 * memory, the layout conversions, and the table of ops the other files in
 * ops/cuda/ implement.
 *
 * Activations are NHWC (channels-last), the layout cuDNN's fastest
 * convolutions read and write, kept end to end; the network input may be
 * plain NCHW. Their dtype is opt.act_dtype (be->act_dtype): fp32, or bf16 /
 * fp16 under --amp; the reorder casts between dtypes too. Parameters stay
 * in torchvision's layout in one flat buffer (conv.cu converts weights for
 * cuDNN).
 *
 * Memory: alloc is cudaMalloc, counted so the peak can be reported (the
 * CPU's peak RSS counterpart). The backend's own scratch (cuDNN workspace,
 * converted weights, reduction partials) grows while the plans of a new
 * shape are built, i.e. in the first step of a shape, never after.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trainer/ops/cuda/cuda.h"
#include "trainer/ops/cuda/ops_math.h"

extern "C" {
#include "common/errors.h"
}

/* ---- checks ---- */

void cuda_check_at(cudaError_t st, const char *what, const char *file, int line)
{
    if (st != cudaSuccess)
        trn_fatal_at(file, line, "CUDA error %d (%s: %s) in %s", (int)st, cudaGetErrorName(st),
                     cudaGetErrorString(st), what);
}

void cudnn_check_at(cudnnStatus_t st, const char *what, const char *file, int line)
{
    if (st != CUDNN_STATUS_SUCCESS)
        trn_fatal_at(file, line, "cuDNN error %d (%s) in %s", (int)st, cudnnGetErrorString(st),
                     what);
}

void cublas_check_at(cublasStatus_t st, const char *what, const char *file, int line)
{
    if (st != CUBLAS_STATUS_SUCCESS)
        trn_fatal_at(file, line, "cuBLAS error %d (%s) in %s", (int)st, cublasGetStatusString(st),
                     what);
}

int cuda_nhwc(const struct trn_tensor *t)
{
    if (t->layout == TRN_LAYOUT_NHWC)
        return 1;
    if (t->layout == TRN_LAYOUT_NCHW)
        return 0;
    trn_fatal("CUDA backend: layout %d is not NHWC or NCHW", (int)t->layout);
}

void cuda_reserve(struct trn_backend *be, void **buf, size_t *have, size_t size)
{
    if (size <= *have)
        return;
    struct cuda_backend *cb = cuda_of(be);
    /* A growth synchronises and reallocates: never inside a CUDA graph's
     * capture (graph_plan.c warms a shape up until nothing grows first). */
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    cudaCheck(cudaStreamIsCapturing(cb->stream, &capturing));
    TRN_CHECK(capturing == cudaStreamCaptureStatusNone,
              "CUDA backend: scratch memory would grow to %zu bytes during a CUDA graph capture",
              size);
    cudaCheck(cudaStreamSynchronize(cb->stream));
    if (*buf)
        cudaCheck(cudaFree(*buf));
    *buf = NULL;
    cudaCheck(cudaMalloc(buf, size));
    *have = size;
    cb->reserve_gen++; /* a CUDA graph pointing into the old buffer is stale */
}

/* ---- memory ---- */

static void *cuda_alloc(struct trn_backend *be, size_t bytes)
{
    struct cuda_backend *cb = cuda_of(be);
    size_t rounded = (bytes + 255) / 256 * 256;
    if (!rounded)
        rounded = 256;
    void *p = NULL;
    cudaError_t st = cudaMalloc(&p, rounded);
    if (st == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* clear it: the caller reports out of memory */
        return NULL;
    }
    cudaCheck(st);
    cudaCheck(cudaMemsetAsync(p, 0, rounded, cb->stream));
    if (cb->n_allocs == cb->cap_allocs) {
        cb->cap_allocs = cb->cap_allocs ? 2 * cb->cap_allocs : 64;
        cb->allocs =
            (struct cuda_alloc_rec *)realloc(cb->allocs, cb->cap_allocs * sizeof(*cb->allocs));
        TRN_CHECK(cb->allocs, "out of memory");
    }
    cb->allocs[cb->n_allocs].p = p;
    cb->allocs[cb->n_allocs].bytes = rounded;
    cb->n_allocs++;
    cb->live_bytes += rounded;
    if (cb->live_bytes > cb->peak_bytes)
        cb->peak_bytes = cb->live_bytes;
    return p;
}

static void cuda_free_mem(struct trn_backend *be, void *p)
{
    if (!p)
        return;
    struct cuda_backend *cb = cuda_of(be);
    for (size_t i = 0; i < cb->n_allocs; i++)
        if (cb->allocs[i].p == p) {
            cb->live_bytes -= cb->allocs[i].bytes;
            cb->allocs[i] = cb->allocs[--cb->n_allocs];
            break;
        }
    /* queued work may still use it (an upload into it too) */
    cudaCheck(cudaStreamSynchronize(cb->stream));
    if (cb->copy_stream)
        cudaCheck(cudaStreamSynchronize(cb->copy_stream));
    cudaCheck(cudaFree(p));
}

static void cuda_to_device(struct trn_backend *be, void *dst, const void *src, size_t bytes)
{
    if (bytes)
        cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda_of(be)->stream));
}

static void cuda_to_host(struct trn_backend *be, void *dst, const void *src, size_t bytes)
{
    struct cuda_backend *cb = cuda_of(be);
    if (!bytes)
        return;
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cb->stream));
    cudaCheck(cudaStreamSynchronize(cb->stream));
}

static void cuda_synchronize(struct trn_backend *be)
{
    cudaCheck(cudaStreamSynchronize(cuda_of(be)->stream));
}

static void cuda_copy(struct trn_backend *be, void *dst, const void *src, size_t bytes)
{
    if (bytes)
        cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_of(be)->stream));
}

/* ---- layout conversion ---- */

static_assert(TRN_DT_F32 == (int)TRN_F32 && TRN_DT_BF16 == (int)TRN_BF16 &&
                  TRN_DT_F16 == (int)TRN_F16,
              "ops_math.h's dtype values are ops.h's");

/* One thread per destination element; layout and dtype at once (the
 * network input: NCHW fp32 -> NHWC bf16/fp16 under --amp in one pass). */
template <int SDT, int DDT>
__global__ void reorder_kernel(const void *src, void *dst, int src_nhwc, int dst_nhwc, int N, int C,
                               int HW)
{
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t total = (size_t)N * C * HW;
    if (e >= total)
        return;
    trn_reorder_one(src, src_nhwc, SDT, dst, dst_nhwc, DDT, e, C, HW);
}

void cuda_reorder(struct trn_backend *be, const struct trn_tensor *src, struct trn_tensor *dst)
{
    struct cuda_backend *cb = cuda_of(be);
    int sn = cuda_nhwc(src), dn = cuda_nhwc(dst);
    size_t total = trn_tensor_numel(src);
    if (!total)
        return;
    bool same_order = sn == dn || src->c == 1 || src->h * src->w == 1;
    if (same_order && src->dtype == dst->dtype) {
        cudaCheck(cudaMemcpyAsync(dst->data, src->data, trn_tensor_bytes(src),
                                  cudaMemcpyDeviceToDevice, cb->stream));
        return;
    }
    if (same_order)
        sn = dn; /* only the dtype changes: element order kept */
    cuda_act_dispatch(src->dtype, [&](auto sdt) {
        cuda_act_dispatch(dst->dtype, [&](auto ddt) {
            reorder_kernel<decltype(sdt)::value, decltype(ddt)::value>
                <<<cuda_blocks(total, 256), 256, 0, cb->stream>>>(src->data, dst->data, sn, dn,
                                                                  src->n, src->c, src->h * src->w);
        });
    });
    cudaLaunchCheck();
}

/* ---- the table ---- */

static const struct trn_ops cuda_ops = {
    .name = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free_mem,
    .to_device = cuda_to_device,
    .to_host = cuda_to_host,
    .synchronize = cuda_synchronize,
    .reorder = cuda_reorder,
    .conv_forward = cuda_conv_forward,
    .conv_backward_weights = cuda_conv_backward_weights,
    .conv_backward_data = cuda_conv_backward_data,
    .conv_release = cuda_conv_release,
    .bn_stats = cuda_bn_stats,
    .bn_prepare = cuda_bn_prepare,
    .bn_apply = cuda_bn_apply,
    .bn_backward_reduce = cuda_bn_backward_reduce,
    .bn_param_grads = cuda_bn_param_grads,
    .bn_backward_input = cuda_bn_backward_input,
    .relu_backward = cuda_relu_backward,
    .maxpool_forward = cuda_maxpool_forward,
    .maxpool_backward = cuda_maxpool_backward,
    .avgpool_forward = cuda_avgpool_forward,
    .avgpool_backward = cuda_avgpool_backward,
    .fc_forward = cuda_fc_forward,
    .fc_backward = cuda_fc_backward,
    .xent_forward = cuda_xent_forward,
    .xent_backward = cuda_xent_backward,
    .sgd_step = cuda_sgd_step,
    .unscale = cuda_unscale,
    .copy = cuda_copy,
    .cast_f32_to_bf16 = cuda_cast_f32_to_bf16,
    .cast_bf16_to_f32 = cuda_cast_bf16_to_f32,
    .graph_setup = cuda_graph_setup,
    .graph_begin = cuda_graph_begin,
    .graph_end = cuda_graph_end,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
    .graph_gen = cuda_graph_gen,
    .xent_forward_dev = cuda_xent_forward_dev,
    .xent_backward_dev = cuda_xent_backward_dev,
    .unscale_dev = cuda_unscale_dev,
    .sgd_step_dev = cuda_sgd_step_dev,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .upload = cuda_upload,
    .input_wait = cuda_input_wait,
    .input_done = cuda_input_done,
};

extern "C" int trn_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int trn_backend_cuda_init(struct trn_backend *be, const struct trn_cuda_options *opt,
                                     char *err, size_t errlen)
{
    memset(be, 0, sizeof(*be));
    int count = trn_cuda_device_count();
    if (count == 0) {
        snprintf(err, errlen, "no CUDA device is visible");
        return CDDP_ECONFIG;
    }
    if (opt->device < 0 || opt->device >= count) {
        snprintf(err, errlen, "CUDA device %d requested, %d visible", opt->device, count);
        return CDDP_ECONFIG;
    }
    if (opt->act_dtype != TRN_F32 && opt->act_dtype != TRN_BF16 && opt->act_dtype != TRN_F16) {
        snprintf(err, errlen, "activation dtype %d is not fp32, bf16 or fp16", (int)opt->act_dtype);
        return CDDP_ECONFIG;
    }
    struct cuda_backend *cb = (struct cuda_backend *)calloc(1, sizeof(*cb));
    if (!cb) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    cb->opt = *opt;
    if (!cb->opt.workspace_bytes)
        cb->opt.workspace_bytes = (size_t)256 << 20;
    cb->device = opt->device;
    trn_algo_cache_init(&cb->algos);
    cudaCheck(cudaSetDevice(cb->device));
    cudaCheck(cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking));
    cudnnCheck(cudnnCreate(&cb->cudnn));
    cudnnCheck(cudnnSetStream(cb->cudnn, cb->stream));
    cublasCheck(cublasCreate(&cb->cublas));
    cublasCheck(cublasSetStream(cb->cublas, cb->stream));
    /* fp32 GEMMs: strict fp32 unless TF32 is asked for (PyTorch's
     * allow_tf32 for matmul is off by default). */
    cublasCheck(cublasSetMathMode(cb->cublas, opt->tf32_matmul ? CUBLAS_TF32_TENSOR_OP_MATH
                                                               : CUBLAS_PEDANTIC_MATH));
    cudaCheck(cudaMallocHost((void **)&cb->host_loss, sizeof(double)));
    be->ops = &cuda_ops;
    be->device = TRN_DEVICE_CUDA;
    be->act_layout = TRN_LAYOUT_NHWC;
    be->act_dtype = opt->act_dtype;
    be->threads = 1;
    be->impl = cb;
    return 0;
}

extern "C" size_t trn_backend_cuda_peak_bytes(struct trn_backend *be)
{
    struct cuda_backend *cb = cuda_of(be);
    return cb->peak_bytes + cb->workspace_size + cb->wbuf_size + cb->scratch_size +
           (cb->cublas_ws ? CUDA_GRAPH_CUBLAS_WORKSPACE : 0);
}

extern "C" void *trn_backend_cuda_stream(struct trn_backend *be)
{
    return (void *)cuda_of(be)->stream;
}

extern "C" void trn_backend_cuda_free(struct trn_backend *be)
{
    struct cuda_backend *cb = cuda_of(be);
    if (!cb)
        return;
    cudaCheck(cudaStreamSynchronize(cb->stream));
    cuda_input_release(cb);
    if (cb->workspace)
        cudaCheck(cudaFree(cb->workspace));
    if (cb->wbuf)
        cudaCheck(cudaFree(cb->wbuf));
    if (cb->scratch)
        cudaCheck(cudaFree(cb->scratch));
    cudaCheck(cudaFreeHost(cb->host_loss));
    cublasCheck(cublasDestroy(cb->cublas));
    cuda_graph_free(be); /* cuBLAS's workspace, once the handle is gone */
    cudnnCheck(cudnnDestroy(cb->cudnn));
    cudaCheck(cudaStreamDestroy(cb->stream));
    free(cb->allocs);
    free(cb);
    be->impl = NULL;
}
