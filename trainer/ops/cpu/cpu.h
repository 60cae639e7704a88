/*
 * cpu.h: the CPU backend's private state and the functions each ops/cpu/
 * file implements; backend.c puts them into the trn_ops table.
 *
 * Threads: oneDNN here is built on OpenMP, and our kernels use OpenMP too,
 * so one pool of be->threads threads serves both.
 */
#ifndef CDDP_TRAINER_OPS_CPU_H
#define CDDP_TRAINER_OPS_CPU_H

#include <dnnl.h>

#include "trainer/fatal.h"
#include "trainer/ops/ops.h"

struct cpu_backend {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    /* Scratch shared by every primitive (one runs at a time): oneDNN's own
     * scratchpad, and room for a conv's weights (or weight gradient) in the
     * layout a primitive wants. Grown while plans are built, never during
     * execution. */
    void *scratchpad;
    size_t scratchpad_size;
    void *wbuf;
    size_t wbuf_size;
    /* room for plain copies of a conv's activations (conv.c's fallback) */
    void *abuf;
    size_t abuf_size;
};

/* Hot loops are compiled twice, for x86-64-v3 (AVX2, FMA) and the baseline,
 * and the one the CPU supports is picked at load time. The FMA matters for
 * more than speed: PyTorch's batch norm is one fused multiply-add, and so
 * is ours (the baseline version calls fmaf, same result, slower). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TRN_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TRN_CPU_CLONES
#endif

#define dnnlCheck(call) cpu_dnnl_check((call), #call, __FILE__, __LINE__)
void cpu_dnnl_check(dnnl_status_t st, const char *what, const char *file, int line);

static inline struct cpu_backend *cpu_of(struct trn_backend *be)
{
    return (struct cpu_backend *)be->impl;
}

/* Grows a shared scratch buffer to at least size bytes. */
void cpu_scratch_reserve(void **buf, size_t *have, size_t size);
/* oneDNN's format tag for a layout. */
dnnl_format_tag_t cpu_layout_tag(enum trn_layout l);

/* backend.c */
void cpu_reorder(struct trn_backend *be, const struct trn_tensor *src, struct trn_tensor *dst);

/* conv.c */
void cpu_conv_forward(struct trn_backend *be, struct trn_conv *conv, const struct trn_tensor *x,
                      const float *w, struct trn_tensor *y);
void cpu_conv_backward_weights(struct trn_backend *be, struct trn_conv *conv,
                               const struct trn_tensor *x, const struct trn_tensor *dy, float *dw,
                               bool accumulate);
void cpu_conv_backward_data(struct trn_backend *be, struct trn_conv *conv, const float *w,
                            const struct trn_tensor *dy, struct trn_tensor *dx);
void cpu_conv_release(struct trn_backend *be, struct trn_conv *conv);

/* bn.c (batch norm, and the ReLU and residual add fused with it) */
void cpu_bn_stats(struct trn_backend *be, const struct trn_tensor *x, float *mean, float *var);
void cpu_bn_prepare(struct trn_backend *be, int c, const float *mean, const float *var,
                    double count, double eps, double momentum, const float *weight,
                    const float *bias, float *running_mean, float *running_var, float *invstd,
                    float *scale, float *shift);
void cpu_bn_apply(struct trn_backend *be, const struct trn_tensor *x, const float *scale,
                  const float *shift, const struct trn_tensor *res, const float *res_scale,
                  const float *res_shift, bool relu, struct trn_tensor *y);
void cpu_bn_backward_reduce(struct trn_backend *be, const struct trn_tensor *x,
                            const struct trn_tensor *dy, const struct trn_tensor *relu_y,
                            const float *mean, float *sum_dy, float *sum_dy_xmu);
void cpu_bn_param_grads(struct trn_backend *be, int c, const float *invstd, const float *sum_dy,
                        const float *sum_dy_xmu, float *dweight, float *dbias, bool accumulate);
void cpu_bn_backward_input(struct trn_backend *be, const struct trn_tensor *x,
                           const struct trn_tensor *dy, const struct trn_tensor *relu_y,
                           const float *mean, const float *invstd, const float *weight,
                           const float *sum_dy, const float *sum_dy_xmu, double count,
                           struct trn_tensor *dx);
void cpu_relu_backward(struct trn_backend *be, const struct trn_tensor *dy,
                       const struct trn_tensor *dy2, const struct trn_tensor *y,
                       struct trn_tensor *dx);

/* pool.c */
void cpu_maxpool_forward(struct trn_backend *be, const struct trn_tensor *x, struct trn_tensor *y,
                         uint8_t *argmax);
void cpu_maxpool_backward(struct trn_backend *be, const struct trn_tensor *dy,
                          const uint8_t *argmax, struct trn_tensor *dx);
void cpu_avgpool_forward(struct trn_backend *be, const struct trn_tensor *x, float *y);
void cpu_avgpool_backward(struct trn_backend *be, const float *dy, struct trn_tensor *dx);

/* fc.c */
void cpu_fc_forward(struct trn_backend *be, int n, int in, int out, const float *x, const float *w,
                    const float *b, float *y);
void cpu_fc_backward(struct trn_backend *be, int n, int in, int out, const float *x, const float *w,
                     const float *dy, float *dx, float *dw, float *db, bool accumulate);

/* loss.c */
float cpu_xent_forward(struct trn_backend *be, int n, int k, const float *logits,
                       const int32_t *labels, float *probs);
void cpu_xent_backward(struct trn_backend *be, int n, int k, const float *probs,
                       const int32_t *labels, float scale, float *dlogits);

/* sgd.c */
bool cpu_unscale(struct trn_backend *be, float *grad, size_t n, float inv_scale);
void cpu_sgd_step(struct trn_backend *be, float *param, const float *grad, float *momentum_buf,
                  size_t n, float lr, float momentum, float weight_decay, bool first_step);

#endif
