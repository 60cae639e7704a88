/*
 * ddp.h: torch.nn.parallel.DistributedDataParallel (and SyncBatchNorm) for
 * cddp-train's ResNet, over trainer/comm/.
 *
 * What it does, as PyTorch's DDP does it:
 *   - at start, parameters and buffers (BN running statistics and
 *     num_batches_tracked) are broadcast from rank 0, so every rank starts
 *     from the same model (trn_ddp_broadcast_state);
 *   - before each forward, rank 0's buffers are broadcast again
 *     (broadcast_buffers=True, DDP's default), so running statistics do not
 *     drift apart; not needed, and skipped, under --sync-bn, where every
 *     rank computes the same global statistics bit for bit;
 *   - gradients are averaged across ranks in buckets (buckets.h: reverse
 *     parameter order, 1 MiB first bucket, --bucket-cap-mb after). Backward
 *     tells us as each parameter's gradient becomes final (resnet.h's
 *     grad_ready hook); when a bucket is complete its allreduce is queued on
 *     the communication thread at once, so it runs while backward goes on
 *     with the earlier layers (overlap; --no-overlap queues them all after
 *     backward instead, to measure what the overlap buys). All are waited
 *     for before the optimizer step (trn_ddp_finish_backward);
 *   - no_sync (--accum-steps): a backward begun with sync = false reduces
 *     nothing; the gradients accumulate locally until the last micro-step.
 *   - --sync-bn: SyncBatchNorm's global statistics. In the training forward,
 *     each batch norm's per-rank mean, biased variance and count are
 *     all-gathered (one collective of world x (2C + 1) floats) and merged
 *     with Chan's parallel formula, in rank order (buckets.h's
 *     trn_bn_merge_stats), as PyTorch's batch_norm_gather_stats_with_counts
 *     does; the running variance then
 *     uses the global unbiased variance. (PyTorch gathers invstd and
 *     recovers the variance from it; we gather the variance itself, which
 *     loses nothing to the round trip.) In backward, sum_dy and
 *     sum_dy_xmu are all-reduced (summed) before the input gradient,
 *     which then uses the global count; the weight and bias gradients
 *     stay local and are averaged by the buckets like any other.
 *     Works on the CPU (PyTorch's SyncBatchNorm is GPU-only).
 *
 * On a CUDA device (the CUDA backend with the nccl communicator: comm.h's
 * trn_comm_on_device) the same, in device memory and stream order:
 *   - the flat gradient buffer is device memory, and the buckets are views
 *     of it, as on the CPU. grad_ready comes as backward queues the kernel
 *     that finishes a gradient; the bucket's allreduce_start then makes the
 *     communicator's stream wait for everything queued on the compute
 *     stream so far (an event), so it starts once the gradients are
 *     computed and runs beside the rest of backward. finish_backward's
 *     waits make the compute stream wait for each bucket's completion
 *     event and return at once: the host never blocks there, the optimizer
 *     step is queued behind the reductions (stats.wait_s is then ~0: the
 *     exposed communication shows in the step time instead);
 *   - --grad-reduce-dtype bf16 (DDP's bf16_compress_hook): a bucket is cast
 *     to bf16 into its slice of a scratch buffer (num_params bf16, so all
 *     buckets can be in flight at once), averaged in bf16, and cast back
 *     into the fp32 gradients after its wait, all in stream order;
 *   - broadcasts of parameters and buffers are of device memory; the
 *     num_batches_tracked counters are host memory (the communicator
 *     stages small host exchanges);
 *   - SyncBN: a layer's mean and variance are copied (device to device)
 *     into this rank's block of a device buffer with the count, the blocks
 *     all-gathered on the device, the result read back to the host once and
 *     merged there exactly as on the CPU, the merged mean and variance
 *     copied back. The host merge is chosen because the ops take the global
 *     count as a host number (bn_prepare, bn_backward_input), so the host
 *     must read the gathered counts anyway: one synchronisation per batch
 *     norm in forward, whoever merges; and it keeps one merge, bit for bit
 *     the CPU's. In backward, sum_dy and sum_dy_xmu are all-reduced in place
 *     on the device (no host round trip).
 *
 * Every rank must make the same calls in the same order (the collectives
 * pair up by order); trn_ddp_check_config verifies that the ranks were
 * started with the same settings. A failed collective ends the worker
 * through the `fail` callback (the trainer's: error file, exit 75).
 */
#ifndef CDDP_TRAINER_DDP_H
#define CDDP_TRAINER_DDP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "trainer/buckets.h"
#include "trainer/comm/comm.h"
#include "trainer/resnet.h"

struct trn_ddp_options {
    double bucket_cap_mb; /* <= 0: TRN_DEFAULT_BUCKET_CAP_MB */
    bool overlap;         /* allreduce each bucket during backward (else after it) */
    bool sync_bn;
    bool bf16_grads; /* --grad-reduce-dtype bf16: a device communicator only */
};

struct trn_ddp_stats {
    long backwards;    /* synchronised backwards (optimizer steps) */
    long allreduces;   /* bucket allreduces */
    double bytes;      /* bucket bytes reduced */
    double wait_s;     /* time finish_backward spent waiting for buckets (exposed communication) */
    long bn_exchanges; /* SyncBN collectives (forward and backward) */
};

struct trn_ddp {
    struct trn_resnet *m;
    struct trn_comm *comm;
    int rank, world;
    struct trn_ddp_options opt;
    struct trn_bucket_plan plan;
    struct trn_bucket_ready ready;
    struct trn_comm_work *work; /* (plan.n_buckets) */
    const char **tensor_names;  /* (plan.n_tensors) for messages */
    bool sync;                  /* this backward reduces the gradients */
    int launched;               /* buckets started this backward */
    float *bn_buf;              /* SyncBN scratch (host) */
    bool on_device;             /* CUDA backend and a device communicator */
    float *bn_dev;              /* SyncBN scratch on the device (on_device) */
    uint16_t *bf16;             /* (num_params) bf16 bucket scratch, device */
    /* Called on a failed collective with the communicator's error; does
     * not return (the trainer's calls trn_comm_fail: error file, exit 75). */
    void (*fail)(void *arg, const struct trn_comm_error *e);
    void *fail_arg;
    struct trn_ddp_stats stats;
};

/*
 * Plans the buckets for m's parameters and, with more than one rank,
 * installs the hooks on m (grad_ready; bn_stats and bn_grads with sync_bn).
 * Borrows m and comm. 0, or a negative code with a one-line err.
 */
int trn_ddp_init(struct trn_ddp *d, struct trn_resnet *m, struct trn_comm *comm,
                 const struct trn_ddp_options *o,
                 void (*fail)(void *arg, const struct trn_comm_error *e), void *fail_arg, char *err,
                 size_t errlen);
void trn_ddp_free(struct trn_ddp *d);

/*
 * Checks that every rank was started with the same settings: `desc`
 * describes everything that must agree (a line of flags). 0 if they agree;
 * otherwise CDDP_EMISMATCH with err naming the ranks that differ from rank 0.
 */
int trn_ddp_check_config(struct trn_ddp *d, const char *desc, char *err, size_t errlen);

/* 0 when v[0..n) is the same on every rank, else CDDP_EMISMATCH (on
 * every rank). */
int trn_ddp_check_same(struct trn_ddp *d, const int64_t *v, size_t n);

/* Parameters, buffers and num_batches_tracked from rank 0 to every rank. */
void trn_ddp_broadcast_state(struct trn_ddp *d);

/* Before a training forward: rank 0's buffers to every rank (DDP's
 * broadcast_buffers), unless --sync-bn keeps them equal anyway. */
void trn_ddp_sync_buffers(struct trn_ddp *d);

/* Before a backward: sync = false for a no_sync micro-step (gradient
 * accumulation), true for the one whose gradients are reduced. */
void trn_ddp_begin_backward(struct trn_ddp *d, bool sync);

/* After backward: starts what is not started yet (--no-overlap) and waits
 * until every bucket is averaged. The gradients are then the same on every
 * rank. Nothing to do after a no_sync backward or with one rank. */
void trn_ddp_finish_backward(struct trn_ddp *d);

/* A checksum of the model's state (parameters, buffers, counters; host
 * memory, the CPU backend's), to show ranks hold the same model. */
uint64_t trn_ddp_state_checksum(const struct trn_resnet *m);

/* One line about the buckets ("5 buckets: 1.0, 25.1, ... MiB"). */
void trn_ddp_bucket_summary(const struct trn_ddp *d, char *buf, size_t len);

#endif
