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
 *
 * Diagnostics (cuda.h, "Finding a failing kernel"): the checks name the op
 * they are in, CDDP_CUDA_SYNC=1 synchronises after every checked call, and
 * the cuDNN and cuBLAS actually loaded are logged once (T2003): the GPU
 * machine's pip wheels need not be the versions built against.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "trainer/ops/cuda/cuda.h"
#include "trainer/ops/cuda/ops_math.h"

extern "C" {
#include "common/errors.h"
#include "common/log.h"
}

/* ---- checks ---- */

/* CDDP_CUDA_SYNC=1, and the stream whose capture forbids a synchronisation
 * (set at backend init; one backend at a time). */
static bool diag_sync;
static cudaStream_t diag_stream;
/* The op this thread is in (cuda_op_enter), and its shapes under sync. */
static thread_local const char *tl_op;
static thread_local char tl_shapes[256];

void cuda_op_enter(const char *name, const struct trn_tensor *a, const struct trn_tensor *b)
{
    tl_op = name;
    tl_shapes[0] = '\0';
    if (!diag_sync)
        return;
    const struct trn_tensor *ts[2] = {a, b};
    size_t len = 0;
    for (int i = 0; i < 2 && len < sizeof(tl_shapes); i++) {
        const struct trn_tensor *t = ts[i];
        if (!t)
            continue;
        len += (size_t)snprintf(tl_shapes + len, sizeof(tl_shapes) - len, "%s%dx%dx%dx%d %s %s",
                                len ? ", " : "", t->n, t->c, t->h, t->w,
                                t->layout == TRN_LAYOUT_NHWC ? "NHWC" : "NCHW",
                                t->dtype == TRN_BF16  ? "bf16"
                                : t->dtype == TRN_F16 ? "fp16"
                                                      : "fp32");
    }
}

void cuda_op_enter_n(const char *name, const char *fmt, ...)
{
    tl_op = name;
    tl_shapes[0] = '\0';
    if (!diag_sync)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_shapes, sizeof(tl_shapes), fmt, ap);
    va_end(ap);
}

/* " (last op: NAME: SHAPES)", or "" before the first: the op this thread
 * entered last, which the failing call is in or was queued by. */
static const char *op_context(char *buf, size_t len)
{
    if (!tl_op)
        return "";
    snprintf(buf, len, " (last op: %s%s%s)", tl_op, tl_shapes[0] ? ": " : "", tl_shapes);
    return buf;
}

/* What a message adds about where an asynchronous error came from. */
static const char *sync_hint(void)
{
    return diag_sync ? "" : "; an earlier launch may have caused it: CDDP_CUDA_SYNC=1 names it";
}

/* Under CDDP_CUDA_SYNC=1, after a call that succeeded: the device, now. */
static void sync_after(const char *what, const char *file, int line)
{
    if (!diag_sync)
        return;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (diag_stream && cudaStreamIsCapturing(diag_stream, &cs) == cudaSuccess &&
        cs != cudaStreamCaptureStatusNone)
        return;
    cudaError_t st = cudaDeviceSynchronize();
    if (st == cudaSuccess)
        st = cudaGetLastError();
    if (st != cudaSuccess) {
        char ctx[320];
        trn_fatal_at(file, line,
                     "CUDA error %d (%s: %s) after %s%s (CDDP_CUDA_SYNC=1: the first "
                     "failing call)",
                     (int)st, cudaGetErrorName(st), cudaGetErrorString(st), what,
                     op_context(ctx, sizeof(ctx)));
    }
}

void cuda_check_at(cudaError_t st, const char *what, const char *file, int line)
{
    if (st == cudaSuccess) {
        sync_after(what, file, line);
        return;
    }
    char ctx[320];
    trn_fatal_at(file, line, "CUDA error %d (%s: %s) in %s%s%s", (int)st, cudaGetErrorName(st),
                 cudaGetErrorString(st), what, op_context(ctx, sizeof(ctx)), sync_hint());
}

void cudnn_check_at(cudnnStatus_t st, const char *what, const char *file, int line)
{
    if (st == CUDNN_STATUS_SUCCESS) {
        sync_after(what, file, line);
        return;
    }
    char ctx[320], last[256] = "";
    cudnnGetLastErrorString(last, sizeof(last));
    trn_fatal_at(file, line, "cuDNN error %d (%s) in %s%s%s%s%s", (int)st, cudnnGetErrorString(st),
                 what, op_context(ctx, sizeof(ctx)), last[0] ? ": " : "", last, sync_hint());
}

void cublas_check_at(cublasStatus_t st, const char *what, const char *file, int line)
{
    if (st == CUBLAS_STATUS_SUCCESS) {
        sync_after(what, file, line);
        return;
    }
    char ctx[320];
    trn_fatal_at(file, line, "cuBLAS error %d (%s) in %s%s%s", (int)st, cublasGetStatusString(st),
                 what, op_context(ctx, sizeof(ctx)), sync_hint());
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
    cuda_op_enter_n("alloc", "%zu bytes", bytes);
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
    cuda_op_enter("free", NULL, NULL);
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
    cuda_op_enter_n("to_device", "%zu bytes", bytes);
    if (bytes)
        cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cuda_of(be)->stream));
}

static void cuda_to_host(struct trn_backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_op_enter_n("to_host", "%zu bytes", bytes);
    struct cuda_backend *cb = cuda_of(be);
    if (!bytes)
        return;
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cb->stream));
    cudaCheck(cudaStreamSynchronize(cb->stream));
}

static void cuda_synchronize(struct trn_backend *be)
{
    cuda_op_enter("synchronize", NULL, NULL);
    cudaCheck(cudaStreamSynchronize(cuda_of(be)->stream));
}

static void cuda_copy(struct trn_backend *be, void *dst, const void *src, size_t bytes)
{
    cuda_op_enter_n("copy", "%zu bytes", bytes);
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
    cuda_op_enter("reorder", src, dst);
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

/* Driver and runtime versions (1000 * major + 10 * minor) as "13.0". */
static void cuda_version_text(int v, char *buf, size_t len)
{
    snprintf(buf, len, "%d.%d", v / 1000, (v % 1000) / 10);
}

extern "C" int trn_cuda_device_count(void)
{
    int n = 0;
    cudaError_t st = cudaGetDeviceCount(&n);
    if (st == cudaSuccess)
        return n;
    (void)cudaGetLastError();
    int driver = 0, runtime = 0;
    bool have_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0;
    /* No device, or no driver at all (cudaDriverGetVersion: 0 when none is
     * installed; the runtime then says "insufficient driver"): no GPU here. */
    if (st == cudaErrorNoDevice || (st == cudaErrorInsufficientDriver && !have_driver))
        return 0;
    static std::atomic_flag logged; /* (C++20: clear) */
    if (!logged.test_and_set()) {
        char dv[16], rv[16];
        (void)cudaRuntimeGetVersion(&runtime);
        cuda_version_text(driver, dv, sizeof(dv));
        cuda_version_text(runtime, rv, sizeof(rv));
        log_error("T2008",
                  "cudaGetDeviceCount: %s (%s); driver %s, runtime %s: the driver or the runtime "
                  "failed, which is not the same as no GPU",
                  cudaGetErrorName(st), cudaGetErrorString(st), have_driver ? dv : "none", rv);
    }
    return -1;
}

/* cuDNN and cuBLAS as loaded (the GPU machine's may not be the headers'),
 * the runtime and the driver, once; a warning when a library is older
 * than its headers or of another major version. */
static void log_versions_once(void)
{
    static std::atomic_flag logged;
    if (logged.test_and_set())
        return;
    size_t dnn = cudnnGetVersion();
    int blas[3] = {0, 0, 0}, driver = 0, runtime = 0;
    (void)cublasGetProperty(MAJOR_VERSION, &blas[0]);
    (void)cublasGetProperty(MINOR_VERSION, &blas[1]);
    (void)cublasGetProperty(PATCH_LEVEL, &blas[2]);
    (void)cudaDriverGetVersion(&driver);
    (void)cudaRuntimeGetVersion(&runtime);
    char dv[16], rv[16];
    cuda_version_text(driver, dv, sizeof(dv));
    cuda_version_text(runtime, rv, sizeof(rv));
    int blas_v = blas[0] * 10000 + blas[1] * 100 + blas[2];
    /* cuDNN 9 numbers itself major * 10000 + minor * 100 + patch. */
    bool older = dnn < (size_t)CUDNN_VERSION || blas_v < CUBLAS_VERSION ||
                 dnn / 10000 != CUDNN_MAJOR || blas[0] != CUBLAS_VER_MAJOR;
    if (older)
        log_warn("T2003",
                 "cuDNN %zu.%zu.%zu (built against %d.%d.%d), cuBLAS %d.%d.%d (built against "
                 "%d.%d.%d), CUDA runtime %s, driver %s: a library older than its headers, or "
                 "of another major version",
                 dnn / 10000, dnn / 100 % 100, dnn % 100, CUDNN_MAJOR, CUDNN_MINOR,
                 CUDNN_PATCHLEVEL, blas[0], blas[1], blas[2], CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR,
                 CUBLAS_VER_PATCH, rv, dv);
    else
        log_info("T2003",
                 "cuDNN %zu.%zu.%zu (built against %d.%d.%d), cuBLAS %d.%d.%d (built against "
                 "%d.%d.%d), CUDA runtime %s, driver %s",
                 dnn / 10000, dnn / 100 % 100, dnn % 100, CUDNN_MAJOR, CUDNN_MINOR,
                 CUDNN_PATCHLEVEL, blas[0], blas[1], blas[2], CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR,
                 CUBLAS_VER_PATCH, rv, dv);
}

/* An environment flag: set to anything but "" and "0". */
static bool env_on(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

extern "C" int trn_backend_cuda_init(struct trn_backend *be, const struct trn_cuda_options *opt,
                                     char *err, size_t errlen)
{
    memset(be, 0, sizeof(*be));
    int count = trn_cuda_device_count();
    if (count < 0) {
        snprintf(err, errlen,
                 "the CUDA driver or runtime failed to count the devices (T2008 says why)");
        return CDDP_ECONFIG;
    }
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
    /* cuDNN and cuBLAS, opened now (libs.h): before their first call */
    int rc = trn_cuda_libs_load(err, errlen);
    if (rc)
        return rc;
    struct cuda_backend *cb = (struct cuda_backend *)calloc(1, sizeof(*cb));
    if (!cb) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    cb->opt = *opt;
    if (!cb->opt.workspace_bytes)
        cb->opt.workspace_bytes = (size_t)256 << 20;
    cb->device = opt->device;
    cb->pad_small_c = env_on("CDDP_CUDA_CONV_PAD");
    trn_algo_cache_init(&cb->algos);
    diag_sync = env_on("CDDP_CUDA_SYNC");
    if (diag_sync)
        log_warn("T2005", "CDDP_CUDA_SYNC=1: the device is synchronised after every CUDA call "
                          "and launch (slow: for finding a failing kernel)");
    cudaCheck(cudaSetDevice(cb->device));
    cudaCheck(cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking));
    diag_stream = cb->stream;
    cudnnCheck(cudnnCreate(&cb->cudnn));
    cudnnCheck(cudnnSetStream(cb->cudnn, cb->stream));
    cublasCheck(cublasCreate(&cb->cublas));
    cublasCheck(cublasSetStream(cb->cublas, cb->stream));
    /* fp32 GEMMs: strict fp32 unless TF32 is asked for (PyTorch's
     * allow_tf32 for matmul is off by default). */
    cublasCheck(cublasSetMathMode(cb->cublas, opt->tf32_matmul ? CUBLAS_TF32_TENSOR_OP_MATH
                                                               : CUBLAS_PEDANTIC_MATH));
    cudaCheck(cudaMallocHost((void **)&cb->host_loss, sizeof(double)));
    log_versions_once();
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
    return cb->peak_bytes + cb->workspace_size + cb->wbuf_size + cb->padbuf_size +
           cb->scratch_size + (cb->cublas_ws ? CUDA_GRAPH_CUBLAS_WORKSPACE : 0);
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
    if (cb->padbuf)
        cudaCheck(cudaFree(cb->padbuf));
    if (cb->scratch)
        cudaCheck(cudaFree(cb->scratch));
    cudaCheck(cudaFreeHost(cb->host_loss));
    cublasCheck(cublasDestroy(cb->cublas));
    cuda_graph_free(be); /* cuBLAS's workspace, once the handle is gone */
    cudnnCheck(cudnnDestroy(cb->cudnn));
    diag_stream = NULL;
    cudaCheck(cudaStreamDestroy(cb->stream));
    free(cb->allocs);
    free(cb);
    be->impl = NULL;
}
