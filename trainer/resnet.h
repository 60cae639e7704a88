/*
 * resnet.h: torchvision's ResNet-18/34/50/101/152 over an ops backend.
 *
 * The model is torchvision.models.resnetXX(num_classes=K): the same layers,
 * parameter and buffer names, shapes and order (state_dict order), and the
 * same initialisation scheme (seeded by our own generator, so not the same
 * numbers as torch.manual_seed). Bottleneck blocks put the stride on the 3x3
 * conv (v1.5), as torchvision does.
 *
 * Memory, llm.c style: every parameter lives in one flat buffer `params`,
 * in torchvision's parameter order (model.parameters()); `grads` and
 * `momentum` have the same layout, so a parameter's gradient and momentum are
 * at the same offset. Batch-norm running means and variances live in one
 * flat `buffers`; num_batches_tracked counters in a host int64 array. The
 * layer structs point into these. `state` lists every state_dict entry in
 * order with its name, shape and place, for checkpoints and --init/--save.
 * On a GPU backend params/grads/momentum/buffers are device memory (copy
 * with be->ops->to_host); num_batches_tracked is always host memory.
 *
 * Gradients are produced in exactly reverse parameter order (fc first,
 * conv1 last; in a block the downsample branch before bn3/conv3), and
 * hooks.grad_ready is called as each parameter tensor's gradient becomes
 * final: the point where DDP marks a bucket ready and starts its allreduce.
 */
#ifndef CDDP_TRAINER_RESNET_H
#define CDDP_TRAINER_RESNET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trainer/ops/ops.h"

#define TRN_BN_EPS 1e-5
#define TRN_BN_MOMENTUM 0.1

struct trn_arch {
    const char *name; /* "resnet50" */
    bool bottleneck;  /* Bottleneck (expansion 4) or BasicBlock */
    int blocks[4];    /* blocks per stage */
};

/* The architecture called name ("resnet18" ... "resnet152"), or NULL. */
const struct trn_arch *trn_arch_find(const char *name);
/* "resnet18, resnet34, resnet50, resnet101, resnet152", for messages. */
const char *trn_arch_names(void);

struct trn_conv_layer {
    struct trn_conv op;
    size_t off; /* of the weight in params/grads (elements) */
    float *w;   /* (cout, cin, k, k) */
    float *dw;  /* (cout, cin, k, k) */
};

struct trn_bn_layer {
    int index; /* 0.. in model order, for the SyncBN hooks */
    int c;
    size_t off;                        /* of weight in params; bias follows at off + c */
    float *weight, *bias;              /* (c) */
    float *dweight, *dbias;            /* (c) */
    float *running_mean, *running_var; /* (c) in buffers */
    int64_t *num_batches_tracked;      /* host */
    /* this step's values, (c) each: batch statistics, the folded transform
     * y = scale * x + shift, and the backward sums */
    float *mean, *var, *invstd, *scale, *shift, *sum_dy, *sum_dy_xmu;
    double count; /* values the statistics cover (all ranks' under SyncBN) */
};

struct trn_block {
    bool bottleneck, downsample;
    struct trn_conv_layer conv1, conv2, conv3, ds_conv; /* conv3 for bottlenecks only */
    struct trn_bn_layer bn1, bn2, bn3, ds_bn;
    /* activations kept for backward (in the arena): c* conv outputs, a* after
     * BN + ReLU, cd the downsample conv's output, out the block's output */
    struct trn_tensor in, c1, a1, c2, a2, c3, cd, out;
};

enum trn_state_kind {
    TRN_STATE_PARAM,  /* in params (and grads, momentum) */
    TRN_STATE_BUFFER, /* in buffers */
    TRN_STATE_COUNTER /* num_batches_tracked: int64 scalar, host */
};

/* One state_dict entry. */
struct trn_state_entry {
    char name[64];
    enum trn_state_kind kind;
    enum trn_dtype dtype; /* TRN_F32, or TRN_I64 for counters */
    int ndim;             /* 0 for counters */
    int64_t shape[4];
    size_t numel;
    size_t off; /* elements into params or buffers; index into the counters */
    void *data; /* where it is (device memory for params and buffers) */
    void *host; /* its host copy (trn_resnet_pull/push); == data on the CPU */
};

/* Called from backward and forward for DDP and SyncBN; any may be NULL. */
struct trn_hooks {
    /* params[off, off + numel) of grads is final for this backward. */
    void (*grad_ready)(void *arg, size_t off, size_t numel);
    /* Training forward, per batch norm: replace this rank's statistics (mean,
     * biased var over *count values) by all ranks' (SyncBatchNorm). */
    void (*bn_stats)(void *arg, const struct trn_bn_layer *bn, float *mean, float *var,
                     double *count);
    /* Backward, per batch norm: sum sum_dy and sum_dy_xmu over all ranks. */
    void (*bn_grads)(void *arg, const struct trn_bn_layer *bn, float *sum_dy, float *sum_dy_xmu);
    void *arg;
};

struct trn_resnet {
    const struct trn_arch *arch;
    int num_classes;
    struct trn_backend *be;
    struct trn_hooks hooks;

    /* flat buffers */
    size_t num_params;
    float *params, *grads, *momentum; /* (num_params) each */
    size_t num_buffers;
    float *buffers; /* (num_buffers) running means and variances */
    int num_bn;
    int64_t *num_batches_tracked; /* (num_bn), host */
    long optimizer_steps;         /* SGD steps taken; 0: the next one fills momentum */

    /* Host copies of params, buffers and momentum on a device backend (NULL
     * on the CPU, whose memory is host memory): what checkpoints, --init and
     * --save read and write, so the files carry nothing device-bound. */
    float *host_params, *host_buffers, *host_momentum;

    struct trn_state_entry *state; /* (n_state) state_dict order */
    size_t n_state;

    /* layers */
    struct trn_conv_layer conv1;
    struct trn_bn_layer bn1;
    struct trn_block *blocks; /* (n_blocks) layer1.0, layer1.1, ..., layer4.N */
    int n_blocks;
    int feat; /* channels into fc: 512 or 2048 */
    float *fc_w, *fc_b, *fc_dw, *fc_db;
    size_t fc_off;
    /* every conv and batch norm in model order */
    struct trn_conv_layer **convs;
    int n_convs;
    struct trn_bn_layer **bns; /* (num_bn) */

    /* activations for the current batch shape, in one arena laid out by
     * lifetime (mem_plan.h): every activation lives from the forward to the
     * end of its block's backward, each backward scratch buffer from its
     * take to its give, so the scratch reuses blocks already backpropagated.
     * arena_bytes is the allocation (the largest plan so far); plan_bytes
     * this shape's plan; kept_bytes the activations alone (the plan's
     * lower bound: all of them are live when the forward ends). */
    int n, h, w;
    void *arena;
    size_t arena_bytes, plan_bytes, kept_bytes;
    /* the backward's scratch takes in order, each's offset and size */
    struct trn_scratch_take {
        size_t offset, bytes;
    } * takes;
    int n_takes;
    bool planning; /* set_shape's dry backward: no op runs */
    /* x: the network input as conv1 reads it: the caller's NCHW batch, or
     * on an NHWC backend (CUDA: cuDNN wants x and y of a convolution in one
     * layout) its channels-last copy in x_nhwc, reordered at each forward
     * (and cast to be->act_dtype: bf16/fp16 under --amp). Every activation
     * and scratch buffer holds be->act_dtype elements; pooled onwards are fp32. */
    struct trn_tensor x, stem_c, stem_a, stem_p;
    float *x_nhwc;
    uint8_t *pool_argmax;
    float *pooled, *logits, *probs, *dlogits, *dpooled; /* (n, feat) / (n, K) */
    int32_t *labels;                                    /* (n) device copy of this batch's labels */
    bool have_labels;
    float *bn_scratch; /* per-BN per-step vectors, 7 x sum of channels */
};

/*
 * Builds arch with num_classes outputs on be: allocates the flat buffers and
 * lays out every layer (weights uninitialised: call trn_resnet_init or load).
 * 0, or a negative code with a one-line message in err.
 */
int trn_resnet_create(struct trn_resnet *m, struct trn_backend *be, const struct trn_arch *arch,
                      int num_classes, char *err, size_t errlen);
void trn_resnet_free(struct trn_resnet *m);

/*
 * torchvision's initialisation, from seed: conv weights kaiming-normal
 * (fan_out, ReLU gain), BN weight 1 and bias 0, Linear's default (weight and
 * bias uniform in +-1/sqrt(fan_in)); running mean 0, var 1, counters 0; with
 * zero_init_residual the last BN of each block gets weight 0. Also resets
 * the optimizer.
 */
void trn_resnet_init(struct trn_resnet *m, uint64_t seed, bool zero_init_residual);

/*
 * On a device backend: pull copies params, buffers and momentum to their
 * host copies (before a checkpoint, --save, the state checksum), push the
 * other way (after --init or a resumed checkpoint wrote the host copies).
 * No-ops on the CPU. trn_resnet_host_momentum is where the momentum's host
 * view is (m->momentum on the CPU).
 */
void trn_resnet_pull(struct trn_resnet *m);
void trn_resnet_push(struct trn_resnet *m);
float *trn_resnet_host_momentum(const struct trn_resnet *m);

/* The state_dict entry called name, or NULL. */
const struct trn_state_entry *trn_resnet_find(const struct trn_resnet *m, const char *name);

/*
 * Forward for a batch: x is (n, 3, h, w) plain NCHW on the device, labels
 * (n) host, in [0, num_classes), or NULL. training: batch statistics (and
 * running-statistics updates), activations kept for backward; else eval
 * mode (running statistics). Logits are left in m->logits (device, (n, K)).
 * Returns the mean cross-entropy loss, or 0 without labels.
 */
float trn_resnet_forward(struct trn_resnet *m, const float *x, const int32_t *labels, int n, int h,
                         int w, bool training);

/*
 * Backward of the last training forward: grads = (or, with accumulate, +=)
 * d(loss * loss_scale)/dparams. loss_scale is 1/K under accumulation over
 * K micro-batches.
 */
void trn_resnet_backward(struct trn_resnet *m, float loss_scale, bool accumulate);

/* One torch.optim.SGD step over every parameter (see ops/cpu/sgd.c). */
void trn_resnet_sgd_step(struct trn_resnet *m, float lr, float momentum, float weight_decay);

/*
 * CUDA graphs (--cuda-graphs; train.c): a training step whose device work
 * holds no host value, so it can be captured once and replayed.
 * upload_labels sets the batch shape and copies labels (n, host) to the
 * device, before a capture or replay; forward_dev is a training forward
 * on those labels that writes the mean loss to *loss (device memory)
 * instead of returning it; backward_dev is backward with the loss scale
 * read from *loss_scale (device); sgd_step_dev is the SGD step with lr
 * read from *lr and skipped when *skip (device, GradScaler's found_inf;
 * NULL: never) is not 0, for a model past its first step (the momentum
 * filled), and it leaves optimizer_steps to the caller, who knows after
 * the step whether it was taken. count_forward adds one to every batch
 * norm's num_batches_tracked (host), what a replayed training forward does
 * not do by itself.
 */
void trn_resnet_upload_labels(struct trn_resnet *m, const int32_t *labels, int n, int h, int w);
void trn_resnet_forward_dev(struct trn_resnet *m, const float *x, int n, int h, int w, float *loss);
void trn_resnet_backward_dev(struct trn_resnet *m, const float *loss_scale, bool accumulate);
void trn_resnet_sgd_step_dev(struct trn_resnet *m, const float *lr, const int32_t *skip,
                             float momentum, float weight_decay);
void trn_resnet_count_forward(struct trn_resnet *m);

/* The smallest number of values a training batch norm averages over for a
 * batch of n images of h x w (the last stage's n * h' * w'); PyTorch refuses
 * to train when it is 1. */
long trn_resnet_min_bn_count(const struct trn_resnet *m, int n, int h, int w);

#endif
