/*
 * ops.h: the interface between the ResNet graph (resnet.c) and a compute
 * backend. ops/cpu/ implements it on the CPU (oneDNN convolutions, our own
 * kernels for the rest); a CUDA backend (cuDNN, cuBLAS, kernels) implements
 * the same table.
 *
 * Tensors know their device, dtype and layout. Activations live in the
 * backend's preferred layout (be->act_layout): on the CPU that is oneDNN's
 * channel-blocked nChw8c (nChw16c on AVX-512), kept end to end so no op pays
 * a reorder; the network input is plain NCHW. Parameters are always in
 * torchvision's layout (conv weights OIHW, Linear (out, in)): they live in one
 * flat buffer that checkpoints and DDP buckets slice as they are; a backend
 * that wants another weight layout converts on the fly (the CPU one does,
 * like PyTorch's oneDNN path).
 *
 * Every function aborts the worker with file:line on an internal error (the
 * llm.c habit: the agent restarts a failed worker). Shapes are checked by
 * the caller (resnet.c builds them), not here.
 *
 * Batch-norm is split the way SyncBatchNorm needs it: per-channel statistics,
 * then (after an optional exchange between ranks) the elementwise transform;
 * in backward the per-channel reductions, then (after an optional allreduce)
 * the elementwise input gradient.
 */
#ifndef CDDP_TRAINER_OPS_H
#define CDDP_TRAINER_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum trn_device {
    TRN_DEVICE_CPU,
    TRN_DEVICE_CUDA,
};

enum trn_dtype {
    TRN_F32,
    TRN_BF16,
    TRN_F16,
    TRN_I64,
};

enum trn_layout {
    TRN_LAYOUT_NCHW,    /* (N, C, H, W) row-major; also (N, C) with H = W = 1 */
    TRN_LAYOUT_NCHW8C,  /* (N, C/8, H, W, 8): oneDNN nChw8c (C a multiple of 8) */
    TRN_LAYOUT_NCHW16C, /* (N, C/16, H, W, 16): oneDNN nChw16c */
    TRN_LAYOUT_NHWC,    /* (N, H, W, C): cuDNN's fast layout */
};

/*
 * A 4-d activation (N, C, H, W) in some layout. Does not own data. data is
 * raw storage of dtype's elements: fp32, or (on the CUDA backend under
 * --amp, be->act_dtype) bf16/fp16 bits, two bytes each, read through
 * trn_tensor_bytes and the backend's kernels, never as floats.
 */
struct trn_tensor {
    float *data;
    int n, c, h, w;
    enum trn_dtype dtype;
    enum trn_layout layout;
    enum trn_device device;
};

static inline size_t trn_tensor_numel(const struct trn_tensor *t)
{
    return (size_t)t->n * (size_t)t->c * (size_t)t->h * (size_t)t->w;
}

/* Bytes per element of a dtype. */
static inline size_t trn_dtype_size(enum trn_dtype d)
{
    return d == TRN_BF16 || d == TRN_F16 ? 2 : d == TRN_I64 ? 8 : 4;
}

static inline size_t trn_tensor_bytes(const struct trn_tensor *t)
{
    return trn_tensor_numel(t) * trn_dtype_size(t->dtype);
}

/* Channel block of a layout: 8 or 16 for the blocked ones, 1 otherwise. */
static inline int trn_layout_block(enum trn_layout l)
{
    return l == TRN_LAYOUT_NCHW8C ? 8 : l == TRN_LAYOUT_NCHW16C ? 16 : 1;
}

/*
 * A convolution layer as the backend sees it: the shape, and a place for the
 * backend's plans (oneDNN primitives, cuDNN descriptors and algorithms),
 * built on first use for an input shape and rebuilt when it changes (the last
 * batch of an epoch, eval). No bias (torchvision's ResNet convs have none).
 */
struct trn_conv {
    int cin, cout, k, stride, pad;
    bool need_dx; /* false for the first conv: no gradient wanted for the input */
    void *impl;   /* backend-private; freed by ops->conv_release */
};

struct trn_backend;

struct trn_ops {
    const char *name;

    /* Memory on the backend's device, 64-byte aligned, zeroed. NULL if out of memory. */
    void *(*alloc)(struct trn_backend *be, size_t bytes);
    void (*free)(struct trn_backend *be, void *p);
    /* Copies between host memory and the device (plain memcpy on the CPU). */
    void (*to_device)(struct trn_backend *be, void *dst, const void *src, size_t bytes);
    void (*to_host)(struct trn_backend *be, void *dst, const void *src, size_t bytes);
    /* Waits until all queued work is done (no-op on the CPU). */
    void (*synchronize)(struct trn_backend *be);

    /* dst = src converted to dst's layout and dtype (same shape; the CPU's
     * tensors are all fp32; on CUDA fp32 <-> bf16/fp16, round to nearest even). */
    void (*reorder)(struct trn_backend *be, const struct trn_tensor *src, struct trn_tensor *dst);

    /* conv.c: y = conv(x, w); w is (cout, cin, k, k) OIHW. */
    void (*conv_forward)(struct trn_backend *be, struct trn_conv *conv, const struct trn_tensor *x,
                         const float *w, struct trn_tensor *y);
    /* dw (OIHW) = (or +=, with accumulate) the weight gradient. Separate from
     * the input gradient so the weight gradient can be handed to DDP first. */
    void (*conv_backward_weights)(struct trn_backend *be, struct trn_conv *conv,
                                  const struct trn_tensor *x, const struct trn_tensor *dy,
                                  float *dw, bool accumulate);
    /* dx = the input gradient (dx's shape is the input's). */
    void (*conv_backward_data)(struct trn_backend *be, struct trn_conv *conv, const float *w,
                               const struct trn_tensor *dy, struct trn_tensor *dx);
    void (*conv_release)(struct trn_backend *be, struct trn_conv *conv);

    /* bn.c. Per-channel mean and biased variance of x over (N, H, W). */
    void (*bn_stats)(struct trn_backend *be, const struct trn_tensor *x, float *mean, float *var);
    /*
     * Per-channel glue between the two halves, over c channels: invstd =
     * 1/sqrt(var + eps), scale = weight * invstd, shift = bias - mean * scale.
     * With running_mean not NULL (training) also the running statistics:
     * r = (1 - momentum) * r + momentum * batch, the variance unbiased
     * (var * count / (count - 1)) as PyTorch. In eval, pass the running
     * statistics as mean and var and NULL running pointers.
     */
    void (*bn_prepare)(struct trn_backend *be, int c, const float *mean, const float *var,
                       double count, double eps, double momentum, const float *weight,
                       const float *bias, float *running_mean, float *running_var, float *invstd,
                       float *scale, float *shift);
    /*
     * y = relu?(scale[c] * x + shift[c] + res'), where res' is nothing (res
     * NULL), res itself (res_scale NULL), or res_scale[c] * res + res_shift[c]
     * (a second batch-norm folded in: the downsample branch). y may alias x.
     */
    void (*bn_apply)(struct trn_backend *be, const struct trn_tensor *x, const float *scale,
                     const float *shift, const struct trn_tensor *res, const float *res_scale,
                     const float *res_shift, bool relu, struct trn_tensor *y);
    /*
     * Backward reductions over (N, H, W) with g = dy, masked by relu_y > 0 when
     * relu_y is not NULL (the ReLU that followed this batch-norm):
     * sum_dy[c] = sum g, sum_dy_xmu[c] = sum g * (x - mean[c]).
     */
    void (*bn_backward_reduce)(struct trn_backend *be, const struct trn_tensor *x,
                               const struct trn_tensor *dy, const struct trn_tensor *relu_y,
                               const float *mean, float *sum_dy, float *sum_dy_xmu);
    /* dweight = (or +=) sum_dy_xmu * invstd, dbias = (or +=) sum_dy. */
    void (*bn_param_grads)(struct trn_backend *be, int c, const float *invstd, const float *sum_dy,
                           const float *sum_dy_xmu, float *dweight, float *dbias, bool accumulate);
    /*
     * dx = (g - sum_dy/count - (x - mean) * invstd^2 * sum_dy_xmu/count) * invstd * weight,
     * with g as in bn_backward_reduce; count is the number of values the
     * statistics were taken over (all ranks' under SyncBN). dx may alias dy.
     */
    void (*bn_backward_input)(struct trn_backend *be, const struct trn_tensor *x,
                              const struct trn_tensor *dy, const struct trn_tensor *relu_y,
                              const float *mean, const float *invstd, const float *weight,
                              const float *sum_dy, const float *sum_dy_xmu, double count,
                              struct trn_tensor *dx);

    /* pool.c. dx = (dy + dy2) masked by y > 0 (dy2 may be NULL; dx may alias either). */
    void (*relu_backward)(struct trn_backend *be, const struct trn_tensor *dy,
                          const struct trn_tensor *dy2, const struct trn_tensor *y,
                          struct trn_tensor *dx);
    /* 3x3, stride 2, padding 1 max-pool; argmax (one byte per output) saved for backward. */
    void (*maxpool_forward)(struct trn_backend *be, const struct trn_tensor *x,
                            struct trn_tensor *y, uint8_t *argmax);
    void (*maxpool_backward)(struct trn_backend *be, const struct trn_tensor *dy,
                             const uint8_t *argmax, struct trn_tensor *dx);
    /* Adaptive average pool to 1x1: x (N, C, H, W) -> y (N, C) row-major,
     * y fp32 whatever x's dtype (fc and the loss are fp32), and back. */
    void (*avgpool_forward)(struct trn_backend *be, const struct trn_tensor *x, float *y);
    void (*avgpool_backward)(struct trn_backend *be, const float *dy, struct trn_tensor *dx);

    /* fc.c. y (N, out) = x (N, in) w^T + b, torch.nn.Linear's layout. */
    void (*fc_forward)(struct trn_backend *be, int n, int in, int out, const float *x,
                       const float *w, const float *b, float *y);
    /* dw (out, in) and db (out) = (or +=) the gradients; dx (N, in) unless NULL. */
    void (*fc_backward)(struct trn_backend *be, int n, int in, int out, const float *x,
                        const float *w, const float *dy, float *dx, float *dw, float *db,
                        bool accumulate);

    /* loss.c. Softmax cross-entropy, mean over the batch. probs (N, K) saved for
     * backward. Returns the loss (a host value: this synchronises). */
    float (*xent_forward)(struct trn_backend *be, int n, int k, const float *logits,
                          const int32_t *labels, float *probs);
    /* dlogits = scale * (probs - onehot(labels)) / n. */
    void (*xent_backward)(struct trn_backend *be, int n, int k, const float *probs,
                          const int32_t *labels, float scale, float *dlogits);

    /* sgd.c. torch.optim.SGD on n elements (see sgd.c for the exact update). */
    void (*sgd_step)(struct trn_backend *be, float *param, const float *grad, float *momentum_buf,
                     size_t n, float lr, float momentum, float weight_decay, bool first_step);

    /* amp: GradScaler's unscale_ over n gradients: grad *= inv_scale; returns
     * whether any was inf or NaN (a host value: this synchronises). */
    bool (*unscale)(struct trn_backend *be, float *grad, size_t n, float inv_scale);

    /* Optional: NULL where the backend has no use for them (the CPU's).
     * DDP on the device (ddp.c), queued in stream order like the ops:
     * dst = src, bytes of device memory to device memory; and the casts
     * for --grad-reduce-dtype bf16: dst (n bf16 bits) = src (n fp32)
     * rounded to nearest even, and back. */
    void (*copy)(struct trn_backend *be, void *dst, const void *src, size_t bytes);
    void (*cast_f32_to_bf16)(struct trn_backend *be, const float *src, uint16_t *dst, size_t n);
    void (*cast_bf16_to_f32)(struct trn_backend *be, const uint16_t *src, float *dst, size_t n);

    /*
     * Optional (NULL on the CPU): CUDA graphs (--cuda-graphs; train.c's
     * graph step, trainer/graph_plan.h, ops/cuda/graph.cu). graph_setup,
     * once before the first step: what capture needs (cuBLAS's workspace
     * preallocated). graph_begin starts capturing the backend's stream
     * (this thread only); graph_end stops and instantiates it, returning
     * the executable graph; graph_launch queues it on the stream;
     * graph_destroy frees it. graph_gen counts the growths of the
     * backend's own scratch memory (a graph pointing into the old buffers
     * is stale).
     */
    void (*graph_setup)(struct trn_backend *be);
    void (*graph_begin)(struct trn_backend *be);
    void *(*graph_end)(struct trn_backend *be);
    void (*graph_launch)(struct trn_backend *be, void *graph);
    void (*graph_destroy)(struct trn_backend *be, void *graph);
    uint64_t (*graph_gen)(struct trn_backend *be);
    /*
     * The step's ops without a host value in them, for capture: the
     * per-step numbers are read from device memory when the kernel runs.
     * xent_forward_dev writes the mean loss (fp32) to *loss and does not
     * wait; xent_backward_dev is xent_backward with scale read from
     * *scale; unscale_dev zeroes *found_inf, then is unscale with
     * inv_scale read from *inv_scale, setting *found_inf to 1 on an inf
     * or NaN; sgd_step_dev is sgd_step with lr read from *lr, and does
     * nothing when skip is not NULL and *skip is not 0 (GradScaler's
     * skipped step).
     */
    void (*xent_forward_dev)(struct trn_backend *be, int n, int k, const float *logits,
                             const int32_t *labels, float *probs, float *loss);
    void (*xent_backward_dev)(struct trn_backend *be, int n, int k, const float *probs,
                              const int32_t *labels, const float *scale, float *dlogits);
    void (*unscale_dev)(struct trn_backend *be, float *grad, size_t n, const float *inv_scale,
                        int32_t *found_inf);
    void (*sgd_step_dev)(struct trn_backend *be, float *param, const float *grad,
                         float *momentum_buf, size_t n, const float *lr, float momentum,
                         float weight_decay, bool first_step, const int32_t *skip);
    /* Optional (NULL on the CPU): --prefetch's input path (train.c,
     * prefetch.h). host_alloc: page-locked host memory, so copies from it
     * are asynchronous (NULL when out of memory); host_free waits for the
     * copies reading it first. Two device input buffers (slots 0 and 1):
     * upload queues bytes from host src to device dst on a copy stream,
     * after the compute stream's last input_done(slot), and marks slot's
     * copy; input_wait makes the compute stream wait for slot's copy
     * (before the forward that reads it); input_done marks the compute
     * stream's last use of slot's buffer (after the backward that reads
     * it) and waits, on the host, until slot's copy is done (its host
     * source may then be reloaded). */
    void *(*host_alloc)(struct trn_backend *be, size_t bytes);
    void (*host_free)(struct trn_backend *be, void *p);
    void (*upload)(struct trn_backend *be, int slot, void *dst, const void *src, size_t bytes);
    void (*input_wait)(struct trn_backend *be, int slot);
    void (*input_done)(struct trn_backend *be, int slot);
};

/* A backend instance: the table plus its state (oneDNN engine and stream,
 * shared scratch memory; or a CUDA device, streams and handles). */
struct trn_backend {
    const struct trn_ops *ops;
    enum trn_device device;
    enum trn_layout act_layout; /* layout of activations between ops */
    enum trn_dtype act_dtype;   /* their dtype: TRN_F32, or bf16/fp16 on CUDA under --amp */
    int threads;
    void *impl;
};

/* The CPU backend with `threads` threads (0: OMP_NUM_THREADS, else all cores).
 * Returns 0, or a negative code with a message in err. */
int trn_backend_cpu_init(struct trn_backend *be, int threads, char *err, size_t errlen);
void trn_backend_cpu_free(struct trn_backend *be);

/*
 * The CUDA backend (ops/cuda/; built when config.h has CDDP_HAVE_CUDA 1).
 * Activations NHWC; every pointer an op takes is device memory from
 * be->ops->alloc. Options as the trainer's flags will set them.
 */
struct trn_cuda_options {
    int device;             /* CUDA device ordinal (a rank's LOCAL_RANK) */
    size_t workspace_bytes; /* cuDNN workspace bound (0: 256 MiB) */
    bool deterministic;     /* deterministic convolution algorithms only */
    bool tf32_conv;         /* TF32 in convolutions (PyTorch's default: on) */
    bool tf32_matmul;       /* TF32 in fc (PyTorch's default: off) */
    /* Activations (and their gradients) between ops: TRN_F32 (0, the
     * default), or TRN_BF16 / TRN_F16 for --amp: stored in that dtype,
     * convolutions on tensor cores with fp32 accumulation, the rest of the
     * arithmetic in fp32; weights, gradients, BN statistics, the pooled
     * features, fc, the logits and the loss stay fp32 (docs/trainer.md). */
    enum trn_dtype act_dtype;
};

/* Visible CUDA devices: 0 when there is no device or no driver at all; -1
 * when the driver or the runtime failed (too old, a mismatch, a stub
 * library), logged once (T2008) with cudaGetDeviceCount's error: a driver
 * problem is not "no GPU". */
int trn_cuda_device_count(void);
/* Returns 0, or a negative code with a message in err (no device, bad ordinal). */
int trn_backend_cuda_init(struct trn_backend *be, const struct trn_cuda_options *opt, char *err,
                          size_t errlen);
void trn_backend_cuda_free(struct trn_backend *be);
/* The most device memory allocated through be->ops->alloc at once, in bytes. */
size_t trn_backend_cuda_peak_bytes(struct trn_backend *be);
/* The compute stream every op is queued on (a cudaStream_t), for the
 * communicator to order its collectives with (comm.h: cuda_stream). */
void *trn_backend_cuda_stream(struct trn_backend *be);

#endif
