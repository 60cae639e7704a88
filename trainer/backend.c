/* backend.c: the device and the ops backend a rank computes on; see backend.h. */
#include "trainer/backend.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/errors.h"    /* CDDP_ECONFIG */
#include "common/exitcodes.h" /* CDDP_EXIT_USAGE */
#include "common/log.h"       /* log_info, log_warn */
#include "config.h"           /* CDDP_HAVE_CUDA */
#include "trainer/fatal.h"    /* trn_refuse, trn_fatal */

/* This build has the NCCL communicator (trainer/comm/nccl.c; meson sets it
 * in config.h when CUDA and NCCL are found). */
#ifndef CDDP_HAVE_NCCL
#define CDDP_HAVE_NCCL 0
#endif

/* --cuda-graphs against the device and the run: one line, exit 2, where it
 * cannot be (docs/gpu.md, "CUDA graphs"). */
static void check_cuda_graphs(const struct trn_config *c, const struct trn_device_choice *dev,
                              int world)
{
    if (!c->cuda_graphs)
        return;
    if (dev->device == TRN_DEVICE_CPU)
        trn_refuse(CDDP_EXIT_USAGE,
                   "--cuda-graphs: CUDA graphs need --device cuda, and this rank computes on the "
                   "CPU (%s)",
                   dev->note[0] ? dev->note : "--device cpu");
    if (world > 1 && strcmp(dev->comm, "gloo") == 0)
        trn_refuse(CDDP_EXIT_USAGE,
                   "--cuda-graphs: not with %d ranks over gloo: gloo stages the gradients through "
                   "host memory, which a CUDA graph cannot capture",
                   world);
    if (c->sync_bn)
        trn_refuse(CDDP_EXIT_USAGE,
                   "--cuda-graphs: not with --sync-bn: SyncBatchNorm reads the gathered "
                   "statistics back to the host in the middle of the forward, which a captured "
                   "graph cannot do");
    if (world > 1)
        trn_refuse(CDDP_EXIT_USAGE,
                   "--cuda-graphs: one rank only for now (this run has %d): the NCCL watchdog "
                   "tracks every collective the host enqueues, and a replayed graph's allreduces "
                   "are not (docs/gpu.md, \"CUDA graphs\")",
                   world);
}

/* --device (else CDDP_DEVICE, else auto) resolved against this build, the
 * visible GPUs and torchrun's world (device.h); --amp against the device.
 * A request that cannot be met: one line, exit 2. */
static void choose_device(struct trn_device_choice *dev, const struct trn_config *c, int world,
                          int local_rank)
{
    char err[512];
    int req = c->device;
    const char *env = getenv("CDDP_DEVICE");
    if (req == TRN_DEVICE_REQ_UNSET && env && *env &&
        trn_device_parse("CDDP_DEVICE", env, &req, err, sizeof(err)) != 0)
        trn_refuse(CDDP_EXIT_USAGE, "%s", err);
    if (req == TRN_DEVICE_REQ_UNSET)
        req = TRN_DEVICE_REQ_AUTO;
    bool built = CDDP_HAVE_CUDA;
    int count = 0;
#if CDDP_HAVE_CUDA
    if (req != TRN_DEVICE_REQ_CPU)
        count = trn_cuda_device_count();
#endif
    if (trn_device_choose_dist(req, c->backend, built, CDDP_HAVE_NCCL, count, world, local_rank,
                               dev, err, sizeof(err)) != 0 ||
        trn_grad_reduce_check(c->grad_reduce, dev, err, sizeof(err)) != 0)
        trn_refuse(CDDP_EXIT_USAGE, "%s", err);
    check_cuda_graphs(c, dev, world);
    if (dev->gpu_unused)
        log_warn("T2001", "--device auto: the CPU although a GPU is visible (%s)", dev->note);
    else if (dev->note[0])
        log_info("T2001", "--device auto: the CPU (%s)", dev->note);
    if (c->amp != TRN_AMP_OFF && dev->device == TRN_DEVICE_CPU)
        trn_refuse(CDDP_EXIT_USAGE,
                   "--amp %s: mixed precision needs --device cuda (the CPU backend computes in "
                   "fp32)",
                   trn_amp_names[c->amp]);
}

void trn_backend_setup(struct trn_backend *be, struct trn_device_choice *dev,
                       const struct trn_config *c, int world, int local_rank)
{
    char err[4096];
    choose_device(dev, c, world, local_rank);
    if (dev->device == TRN_DEVICE_CPU) {
        if (trn_backend_cpu_init(be, (int)c->threads, err, sizeof(err)) != 0)
            trn_fatal("%s", err);
        return;
    }
#if CDDP_HAVE_CUDA
    struct trn_cuda_options o = {
        .device = dev->ordinal,
        .workspace_bytes = (size_t)c->cudnn_workspace_mb << 20,
        .deterministic = c->deterministic,
        .tf32_conv = c->tf32 != TRN_TF32_OFF,
        .tf32_matmul = c->tf32 == TRN_TF32_ALL,
        .act_dtype = c->amp == TRN_AMP_BF16   ? TRN_BF16
                     : c->amp == TRN_AMP_FP16 ? TRN_F16
                                              : TRN_F32,
    };
    int rc = trn_backend_cuda_init(be, &o, err, sizeof(err));
    if (rc == CDDP_ECONFIG)
        trn_refuse(CDDP_EXIT_USAGE, "--device cuda: %s", err);
    if (rc != 0)
        trn_fatal("%s", err);
    log_info("T2000", "device: cuda:%d, --amp %s, --tf32 %s, cuDNN workspace %ld MiB%s",
             dev->ordinal, trn_amp_names[c->amp], trn_tf32_names[c->tf32], c->cudnn_workspace_mb,
             c->deterministic ? ", deterministic" : "");
    if (c->amp != TRN_AMP_OFF)
        log_info("T2400",
                 "--amp %s: activations and convolution inputs %s (fp32 accumulation); master "
                 "weights, gradients, BN statistics, fc and the loss fp32%s",
                 trn_amp_names[c->amp], trn_amp_names[c->amp],
                 c->amp == TRN_AMP_FP16 ? "; GradScaler's loss scaling" : "");
#endif
}

void trn_backend_release(struct trn_backend *be)
{
    if (!be->ops)
        return;
#if CDDP_HAVE_CUDA
    if (be->device == TRN_DEVICE_CUDA) {
        log_info("T2002", "peak device memory %.1f MiB",
                 (double)trn_backend_cuda_peak_bytes(be) / 1048576.0);
        trn_backend_cuda_free(be);
        return;
    }
#endif
    trn_backend_cpu_free(be);
}
