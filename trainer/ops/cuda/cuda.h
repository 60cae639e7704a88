/*
 * cuda.h: the CUDA backend's private state and the functions each
 * ops/cuda/ file implements; backend.cu puts them into the trn_ops table.
 *
 * Everything runs on one stream (be->impl->stream) in issue order; the ops
 * return as soon as their work is queued, except xent_forward (it returns
 * the loss) and the copies to the host. Every pointer an op takes is device
 * memory from be->ops->alloc, including the per-channel vectors of the batch
 * norm and the labels.
 *
 * Every CUDA, cuDNN and cuBLAS call is checked: on an error the worker
 * prints file:line, the library's message and the op it was in (with its
 * shapes under CDDP_CUDA_SYNC=1, below) and exits (trainer/fatal.h; the
 * agent restarts it).
 *
 * Finding a failing kernel: errors of kernels are asynchronous, so without
 * help they surface at a later call, in another op. CDDP_CUDA_SYNC=1 (read
 * at backend init; the CUDA_LAUNCH_BLOCKING idea) makes every checked call
 * and launch synchronise the device and check it, so the first error is
 * reported at the launch that made it, with the op and its shapes; slow,
 * for diagnosis. Not inside a CUDA graph's capture, where a synchronisation
 * is not allowed.
 */
#ifndef CDDP_TRAINER_OPS_CUDA_CUDA_H
#define CDDP_TRAINER_OPS_CUDA_CUDA_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

/* (cuDNN's and cuBLAS's functions through tables, opened at init) */
#include "trainer/ops/cuda/libs.h"

#include <type_traits>

extern "C" {
#include "trainer/fatal.h"
#include "trainer/ops/cuda/algo_cache.h"
#include "trainer/ops/ops.h"
}

/* One allocation made through be->ops->alloc (for the peak). */
struct cuda_alloc_rec {
    void *p;
    size_t bytes;
};

struct cuda_backend {
    int device;
    cudaStream_t stream;
    cudnnHandle_t cudnn;
    cublasHandle_t cublas;
    struct trn_cuda_options opt;
    /* cuDNN's workspace: opt.workspace_bytes, allocated when the first
     * convolution plan is built. */
    void *workspace;
    size_t workspace_size;
    /* A conv's weights (or weight gradient) in cuDNN's KRSC layout. */
    void *wbuf;
    size_t wbuf_size;
    /* A conv's input (or input gradient) padded to 8 channels (conv.cu), and
     * CDDP_CUDA_CONV_PAD=1: pad every conv whose channels are not a
     * multiple of 8, whatever cuDNN's search would find. */
    void *padbuf;
    size_t padbuf_size;
    bool pad_small_c;
    /* Reduction partials and per-channel coefficients. */
    void *scratch;
    size_t scratch_size;
    /* The loss, read back by xent_forward (pinned host memory). */
    double *host_loss;
    struct trn_algo_cache algos;
    /* Live allocations through be->ops->alloc: a short list (a model makes
     * a few dozen), searched linearly on free. */
    struct cuda_alloc_rec *allocs;
    size_t n_allocs, cap_allocs;
    size_t peak_bytes, live_bytes;
    /* CUDA graphs (graph.cu): growths of workspace, wbuf and scratch so far
     * (cuda_reserve), and cuBLAS's preallocated workspace. */
    uint64_t reserve_gen;
    void *cublas_ws;
    /* --prefetch's uploads (input.cu), made on first use: the copy
     * stream, and per input slot its copy's event and the compute
     * stream's last use of it. */
    cudaStream_t copy_stream;
    cudaEvent_t input_copied[2], input_used[2];
};

static inline struct cuda_backend *cuda_of(struct trn_backend *be)
{
    return (struct cuda_backend *)be->impl;
}

#define cudaCheck(call) cuda_check_at((call), #call, __FILE__, __LINE__)
#define cudnnCheck(call) cudnn_check_at((call), #call, __FILE__, __LINE__)
#define cublasCheck(call) cublas_check_at((call), #call, __FILE__, __LINE__)
/* After a kernel launch: a bad configuration shows here. */
#define cudaLaunchCheck() cuda_check_at(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

void cuda_check_at(cudaError_t st, const char *what, const char *file, int line);
void cudnn_check_at(cudnnStatus_t st, const char *what, const char *file, int line);
void cublas_check_at(cublasStatus_t st, const char *what, const char *file, int line);

/* The op this thread runs, for the error messages above: called first by
 * each op of the table, with up to two of its tensors (NULL: none), whose
 * shapes are formatted under CDDP_CUDA_SYNC=1 only (a pointer store
 * otherwise). cuda_op_enter_n: the same with a printf-style description. */
void cuda_op_enter(const char *name, const struct trn_tensor *a, const struct trn_tensor *b);
void cuda_op_enter_n(const char *name, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Grows a device buffer to at least size bytes (synchronises first; only
 * while plans are built, on the first step of a shape). */
void cuda_reserve(struct trn_backend *be, void **buf, size_t *have, size_t size);
/* 1 for NHWC, 0 for NCHW; anything else (the CPU's blocked layouts) is fatal. */
int cuda_nhwc(const struct trn_tensor *t);
/* Blocks for n threads of 256. */
static inline unsigned cuda_blocks(size_t n, unsigned threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

/*
 * --amp: activations are stored as fp32, bf16 or fp16 (be->act_dtype), and
 * the kernels that touch them are templates on that dtype (ops_math.h's
 * trn_act_get/put). cuda_act_dispatch(dt, f) calls f with
 * std::integral_constant<int, dt>, for a launcher to instantiate its kernel:
 *     cuda_act_dispatch(x->dtype, [&](auto dt) { k<decltype(dt)::value><<<...>>>(...); });
 * Any other dtype is fatal. cuda_same_dtype checks that two tensors agree.
 */
template <typename F> static inline void cuda_act_dispatch(enum trn_dtype dt, F &&f)
{
    if (dt == TRN_F32)
        f(std::integral_constant<int, (int)TRN_F32>());
    else if (dt == TRN_BF16)
        f(std::integral_constant<int, (int)TRN_BF16>());
    else if (dt == TRN_F16)
        f(std::integral_constant<int, (int)TRN_F16>());
    else
        trn_fatal("CUDA backend: activation dtype %d is not fp32, bf16 or fp16", (int)dt);
}

static inline void cuda_same_dtype(const struct trn_tensor *a, const struct trn_tensor *b,
                                   const char *what)
{
    if (b && a->dtype != b->dtype)
        trn_fatal("CUDA backend: %s: tensors of dtypes %d and %d", what, (int)a->dtype,
                  (int)b->dtype);
}

/* backend.cu */
void cuda_reorder(struct trn_backend *be, const struct trn_tensor *src, struct trn_tensor *dst);

/* conv.cu */
void cuda_conv_forward(struct trn_backend *be, struct trn_conv *conv, const struct trn_tensor *x,
                       const float *w, struct trn_tensor *y);
void cuda_conv_backward_weights(struct trn_backend *be, struct trn_conv *conv,
                                const struct trn_tensor *x, const struct trn_tensor *dy, float *dw,
                                bool accumulate);
void cuda_conv_backward_data(struct trn_backend *be, struct trn_conv *conv, const float *w,
                             const struct trn_tensor *dy, struct trn_tensor *dx);
void cuda_conv_release(struct trn_backend *be, struct trn_conv *conv);

/* bn.cu */
void cuda_bn_stats(struct trn_backend *be, const struct trn_tensor *x, float *mean, float *var);
void cuda_bn_prepare(struct trn_backend *be, int c, const float *mean, const float *var,
                     double count, double eps, double momentum, const float *weight,
                     const float *bias, float *running_mean, float *running_var, float *invstd,
                     float *scale, float *shift);
void cuda_bn_apply(struct trn_backend *be, const struct trn_tensor *x, const float *scale,
                   const float *shift, const struct trn_tensor *res, const float *res_scale,
                   const float *res_shift, bool relu, struct trn_tensor *y);
void cuda_bn_backward_reduce(struct trn_backend *be, const struct trn_tensor *x,
                             const struct trn_tensor *dy, const struct trn_tensor *relu_y,
                             const float *mean, float *sum_dy, float *sum_dy_xmu);
void cuda_bn_param_grads(struct trn_backend *be, int c, const float *invstd, const float *sum_dy,
                         const float *sum_dy_xmu, float *dweight, float *dbias, bool accumulate);
void cuda_bn_backward_input(struct trn_backend *be, const struct trn_tensor *x,
                            const struct trn_tensor *dy, const struct trn_tensor *relu_y,
                            const float *mean, const float *invstd, const float *weight,
                            const float *sum_dy, const float *sum_dy_xmu, double count,
                            struct trn_tensor *dx);
void cuda_relu_backward(struct trn_backend *be, const struct trn_tensor *dy,
                        const struct trn_tensor *dy2, const struct trn_tensor *y,
                        struct trn_tensor *dx);

/* pool.cu */
void cuda_maxpool_forward(struct trn_backend *be, const struct trn_tensor *x, struct trn_tensor *y,
                          uint8_t *argmax);
void cuda_maxpool_backward(struct trn_backend *be, const struct trn_tensor *dy,
                           const uint8_t *argmax, struct trn_tensor *dx);
void cuda_avgpool_forward(struct trn_backend *be, const struct trn_tensor *x, float *y);
void cuda_avgpool_backward(struct trn_backend *be, const float *dy, struct trn_tensor *dx);

/* fc.cu */
void cuda_fc_forward(struct trn_backend *be, int n, int in, int out, const float *x, const float *w,
                     const float *b, float *y);
void cuda_fc_backward(struct trn_backend *be, int n, int in, int out, const float *x,
                      const float *w, const float *dy, float *dx, float *dw, float *db,
                      bool accumulate);

/* loss.cu */
float cuda_xent_forward(struct trn_backend *be, int n, int k, const float *logits,
                        const int32_t *labels, float *probs);
void cuda_xent_backward(struct trn_backend *be, int n, int k, const float *probs,
                        const int32_t *labels, float scale, float *dlogits);

/* sgd.cu */
void cuda_sgd_step(struct trn_backend *be, float *param, const float *grad, float *momentum_buf,
                   size_t n, float lr, float momentum, float weight_decay, bool first_step);

/* input.cu: --prefetch (ops.h: host_alloc ... input_done) */
void *cuda_host_alloc(struct trn_backend *be, size_t bytes);
void cuda_host_free(struct trn_backend *be, void *p);
void cuda_upload(struct trn_backend *be, int slot, void *dst, const void *src, size_t bytes);
void cuda_input_wait(struct trn_backend *be, int slot);
void cuda_input_done(struct trn_backend *be, int slot);
/* Waits for the copy stream and destroys it (trn_backend_cuda_free). */
void cuda_input_release(struct cuda_backend *cb);

/* amp.cu */
bool cuda_unscale(struct trn_backend *be, float *grad, size_t n, float inv_scale);
/* dst (n, bf16 or fp16 bits) = src (n, fp32) rounded to nearest even; and back. */
void cuda_cast_f32_to_bf16(struct trn_backend *be, const float *src, uint16_t *dst, size_t n);
void cuda_cast_f32_to_f16(struct trn_backend *be, const float *src, uint16_t *dst, size_t n);
void cuda_cast_bf16_to_f32(struct trn_backend *be, const uint16_t *src, float *dst, size_t n);
void cuda_cast_f16_to_f32(struct trn_backend *be, const uint16_t *src, float *dst, size_t n);

/* The step's ops with their per-step numbers in device memory (ops.h:
 * xent_forward_dev, ...), for CUDA graphs: loss.cu, amp.cu, sgd.cu. */
void cuda_xent_forward_dev(struct trn_backend *be, int n, int k, const float *logits,
                           const int32_t *labels, float *probs, float *loss);
void cuda_xent_backward_dev(struct trn_backend *be, int n, int k, const float *probs,
                            const int32_t *labels, const float *scale, float *dlogits);
void cuda_unscale_dev(struct trn_backend *be, float *grad, size_t n, const float *inv_scale,
                      int32_t *found_inf);
void cuda_sgd_step_dev(struct trn_backend *be, float *param, const float *grad, float *momentum_buf,
                       size_t n, const float *lr, float momentum, float weight_decay,
                       bool first_step, const int32_t *skip);

/* graph.cu: capture, instantiate, launch, destroy (ops.h: graph_*); the
 * size of cuBLAS's workspace that graph_setup preallocates. */
#define CUDA_GRAPH_CUBLAS_WORKSPACE ((size_t)32 << 20)
void cuda_graph_setup(struct trn_backend *be);
void cuda_graph_begin(struct trn_backend *be);
void *cuda_graph_end(struct trn_backend *be);
void cuda_graph_launch(struct trn_backend *be, void *graph);
void cuda_graph_destroy(struct trn_backend *be, void *graph);
uint64_t cuda_graph_gen(struct trn_backend *be);
/* At backend teardown: what graph_setup allocated. */
void cuda_graph_free(struct trn_backend *be);

#endif
