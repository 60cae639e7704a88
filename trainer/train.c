/*
 * train.c: cddp-train, the worker cddprun supervises: ResNet training in C,
 * a reimplementation of the seed article's ddp_train.py (section 3).
 *
 *     cddp-train --arch resnet152 --data synthetic --batch-size 64 --epochs 100
 *
 * prints what the script prints (rank 0):
 *
 *     Epoch 0 [0/782] Loss: 6.9431
 *     Epoch 0 [50/782] Loss: 6.9077
 *     ...
 *     Epoch 0 finished, avg loss: 6.9120, time: 812.35s, throughput: 61.6 img/s
 *
 * main() reads as the program: setup (flags, who we are, the backend, the
 * data, the model, the batches: everything a rank can check alone), resume
 * (--checkpoint), connect (the other ranks, DDP, and that they agree), the
 * epochs, evaluate (--eval), save (--save). Each step is a function of one
 * run context, struct run (run.h). The pieces live beside it: flags.c (the flags
 * table), schedule.c (the learning rate), resume.c (the run's checkpoint),
 * resnet.c (the graph), ops/cpu/ and ops/cuda/ (the kernels, chosen by
 * --device: device.c decides, backend.c sets up), input.c (the batches,
 * --prefetch's loader: prefetch.c), step.c (a step's forward, backward and
 * SGD, --amp fp16's scaler: scaler.c, --cuda-graphs: graph_plan.c),
 * stop.c (SIGTERM's grace period), progress_fd.c (the progress line),
 * inplace.c (--restart_scope=worker: re-forming in place),
 * data/ (datasets and the sampler), ddp.c and comm/ (distributed).
 *
 * A flag's runtime state lives in its own file, not here: struct run holds
 * each feature's struct (input.h, step.h, ...) and main() calls them.
 */
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/clock.h"           /* cddp_mono_ns */
#include "common/errors.h"          /* error codes */
#include "common/exitcodes.h"       /* CDDP_EXIT_* */
#include "common/log.h"             /* log_info, log_debug */
#include "config.h"                 /* CDDP_VERSION */
#include "proto/progress.h"         /* struct progress_line */
#include "trainer/backend.h"        /* --device: the device and its backend */
#include "trainer/checkpoint.h"     /* trn_weights_load, trn_weights_save */
#include "trainer/comm/bootstrap.h" /* trn_dist_init: torchrun's env -> communicator */
#include "trainer/comm/comm.h"      /* trn_comm_wait_ns: the step's wait */
#include "trainer/comm/failure.h"   /* trn_comm_fail: error file, exit 75 */
#include "trainer/data/dataset.h"   /* trn_dataset: synthetic, idx, folder */
#include "trainer/data/sampler.h"   /* trn_sampler: DistributedSampler semantics */
#include "trainer/ddp.h"            /* trn_ddp: DDP buckets, SyncBatchNorm */
#include "trainer/fatal.h"          /* trn_refuse, trn_fatal, trn_malloc */
#include "trainer/fault.h"          /* --fault */
#include "trainer/inplace.h"        /* --restart_scope=worker: recovering in place */
#include "trainer/spare.h"          /* --spare_workers: a warm spare */
#include "trainer/flags.h"          /* struct trn_config, trn_flags_parse */
#include "trainer/input.h"          /* the batches; --prefetch: the loader */
#include "trainer/ops/ops.h"        /* trn_backend */
#include "trainer/progress_fd.h"    /* CDDP_PROGRESS_FD: a line per step to cddprun */
#include "trainer/resnet.h"         /* trn_resnet */
#include "trainer/resume.h"         /* trn_resume: --checkpoint */
#include "trainer/schedule.h"       /* trn_lr_at */
#include "trainer/step.h"           /* the step: micro-batches, SGD, GradScaler, --cuda-graphs */
#include "trainer/run.h"            /* struct run */
#include "trainer/stop.h"           /* SIGTERM/SIGINT: stop at the step's end */

/* ------------------------------------------------------------------------ */
/* Collectives                                                               */

/* A collective timed out or a peer failed: torchrun's error file, exit 75;
 * a peer gone in the training loop under --restart_scope=worker: back to
 * main()'s recovery point instead (trn_inplace_recover). The calls that fail come
 * from the training thread's own serial code (a wait, a synchronous
 * collective), never from inside a parallel region, so the jump leaves
 * no lock held; the broken communicator's queued work is drained when it
 * is destroyed. */
void run_collective_failed(void *arg, const struct trn_comm_error *e)
{
    struct run *r = arg;
    trn_inplace_failed(r, e); /* (no return when it goes back to the recovery point) */
    trn_comm_fail(e, r->in_step, r->rank, r->env.error_file);
}

/* The NCCL watchdog gave up (a collective past --collective-timeout, or a
 * peer's asynchronous error), on its own thread while the main one may be
 * stuck in the CUDA runtime: the same error file, naming the step the loop
 * last published, and exit 75 (comm.h, trn_comm_set_watchdog_exit). */
_Noreturn void run_watchdog_exit(void *arg, const struct trn_comm_error *e)
{
    const struct run *r = arg;
    trn_comm_fail(e, atomic_load_explicit(&r->in_step, memory_order_relaxed), r->rank,
                  r->env.error_file);
}

/* A collective's return code: on failure, the path above (no return). */
void run_check_collective(struct run *r, int rc)
{
    if (rc < 0)
        run_collective_failed(r, trn_comm_last_error(r->dist.comm));
}

/* ------------------------------------------------------------------------ */
/* Setup: everything a rank can check alone, before it connects              */

/* Opens --data for split; refuses (exit 2) with the dataset's one-line
 * message when it cannot (a missing directory or file, a bad spec, a
 * malformed file). */
static struct trn_dataset *open_data(const struct trn_config *c, enum trn_split split)
{
    struct trn_dataset_opts o = {
        .split = split,
        .seed = (uint64_t)c->seed,
        .num_samples = (size_t)c->num_samples,
        .image_size = (int)c->image_size,
        .num_classes = (int)c->num_classes,
        .limit = (size_t)(split == TRN_SPLIT_TRAIN ? c->limit : c->eval_limit),
    };
    struct trn_dataset *d;
    char err[512];
    if (trn_dataset_open(c->data, &o, &d, err, sizeof(err)) != 0)
        trn_refuse(CDDP_EXIT_USAGE, "%s", err);
    return d;
}

/* The flags. */
static void setup_flags(struct run *r, int argc, char **argv)
{
    char err[4096];
    switch (trn_flags_parse(argc, argv, &r->cfg, err, sizeof(err))) {
    case TRN_FLAGS_HELP:
        trn_flags_usage(stdout);
        exit(CDDP_EXIT_OK);
    case TRN_FLAGS_VERSION:
        printf("cddp-train %s\n", CDDP_VERSION);
        exit(CDDP_EXIT_OK);
    case TRN_FLAGS_RUN:
        break;
    default:
        trn_refuse(CDDP_EXIT_USAGE, "%s", err);
    }
    if (r->cfg.checkpoint &&
        trn_flags_check_output("--checkpoint", r->cfg.checkpoint, err, sizeof(err)) != 0)
        trn_refuse(CDDP_EXIT_USAGE, "%s", err);
}

/* Who we are (docs/distributed.md): rank and world from torchrun's
 * environment, none of it set: one process. (A spare reads it once it is
 * assigned a rank: spare.h.) */
static void setup_identity(struct run *r)
{
    char err[4096];
    const char *rank_env = getenv("RANK");
    if (rank_env && *rank_env) {
        char tag[32];
        snprintf(tag, sizeof(tag), "rank%.16s", rank_env);
        cddp_log_set_tag(tag);
    }
    if (trn_dist_env_read(&r->env, getenv, err, sizeof(err)) != 0)
        trn_refuse(CDDP_EXIT_USAGE, "%s", err);
    r->rank = r->env.rank;
    r->world = r->env.world;
    /* Rank 0 writes these at the end: their directories must exist now. */
    if (r->rank == 0 &&
        ((r->cfg.save && trn_flags_check_output("--save", r->cfg.save, err, sizeof(err))) ||
         (r->cfg.eval_logits &&
          trn_flags_check_output("--eval-logits", r->cfg.eval_logits, err, sizeof(err)))))
        trn_refuse(CDDP_EXIT_USAGE, "%s", err);
    r->in_step = -1;
    trn_progress_fd_open(&r->progress);
}

/* The device and the backend on it (backend.h: --device, what the flags
 * ask of it; exit 2 where it cannot be), and --prefetch's default there. */
static void setup_device(struct run *r)
{
    trn_backend_setup(&r->be, &r->dev, &r->cfg, r->world, r->env.local_rank);
    /* --prefetch's default, measured (docs/trainer.md, "Input pipeline"): a
     * GPU step leaves the CPU cores idle for the loader; a CPU step uses
     * them all, and a loader beside it only slows it (oversubscribed
     * OpenMP barriers). */
    if (r->cfg.prefetch == TRN_PREFETCH_AUTO)
        r->cfg.prefetch = r->dev.device == TRN_DEVICE_CUDA ? 2 : 0;
}

/* The backend, the training split and, for --eval, the test split, and
 * the model: torchvision's initialisation (seeded), or its weights
 * (--init), in host memory until resume() has had its say (then pushed to
 * the device). */
static void setup_model(struct run *r)
{
    const struct trn_config *c = &r->cfg;
    char err[4096];
    setup_device(r);
    r->train = open_data(c, TRN_SPLIT_TRAIN);
    r->test = c->eval ? open_data(c, TRN_SPLIT_TEST) : NULL;
    const struct trn_dataset *d = r->train;
    r->num_classes = c->num_classes > 0 ? (int)c->num_classes : d->num_classes;
    r->height = d->height;
    r->width = d->width;
    if (r->num_classes < d->num_classes)
        trn_refuse(CDDP_EXIT_USAGE, "--num-classes: %d is fewer than the dataset's %d classes",
                   r->num_classes, d->num_classes);
    if (d->channels != 3)
        trn_refuse(CDDP_EXIT_FAILURE, "--data %s: %d channels per image; the model takes 3",
                   c->data, d->channels);
    if (r->test &&
        (r->test->height != d->height || r->test->width != d->width || r->test->channels != 3))
        trn_refuse(CDDP_EXIT_FAILURE, "--eval: test images are %dx%dx%d, training images 3x%dx%d",
                   r->test->channels, r->test->height, r->test->width, d->height, d->width);

    if (trn_resnet_create(&r->model, &r->be, trn_arch_find(c->arch), r->num_classes, err,
                          sizeof(err)))
        trn_fatal("%s", err);
    /* A replacement re-forming in place takes every weight from a peer
     * (inplace.c), and a checkpoint to resume replaces every one (a load
     * that fails ends the run: resume()): no initialisation then, and no
     * --init to read. (ResNet-18's initialisation draws 11.7M normals,
     * about 0.25 s of CPU per rank: docs/benchmarks.md, "Resuming without
     * the initialisation".) */
    bool replacement = trn_inplace_replacement(r);
    r->resuming = c->checkpoint && !c->no_resume && access(c->checkpoint, F_OK) == 0;
    if (!replacement && !r->resuming)
        trn_resnet_init(&r->model, (uint64_t)c->seed, c->zero_init_residual);
    trn_resnet_pull(&r->model); /* the host copies start equal (a device backend) */
    r->state = trn_state_table(&r->model);
    if (c->init && !r->resuming && !replacement &&
        trn_weights_load(c->init, r->state, r->model.n_state, err, sizeof(err)) != 0)
        trn_refuse(CDDP_EXIT_FAILURE, "--init: %s", err);
    log_info("T0001", "%s: %zu parameters, %d classes, %s backend, %d threads", c->arch,
             r->model.num_params, r->num_classes, r->be.ops->name, r->be.threads);
}

/* The order of samples (DistributedSampler semantics, reshuffled by seed +
 * epoch), the batches it makes, the learning rate of each step, and the
 * memory of one batch. */
static void setup_batches(struct run *r)
{
    const struct trn_config *c = &r->cfg;
    const struct trn_dataset *d = r->train;
    if (trn_sampler_init(&r->sampler, d->len, r->world, r->rank, c->shuffle, c->drop_last,
                         (uint64_t)c->seed))
        trn_refuse(CDDP_EXIT_USAGE,
                   "--drop-last: %zu training samples cannot be dropped to a multiple of %d ranks",
                   d->len, r->world);
    r->batch = (int)c->batch_size;
    r->batches = (long)((r->sampler.num_samples + (size_t)r->batch - 1) / (size_t)r->batch);
    r->last_batch = (int)(r->sampler.num_samples - (size_t)(r->batches - 1) * (size_t)r->batch);
    /* PyTorch refuses to train batch norm on one value per channel. */
    if (trn_resnet_min_bn_count(&r->model, r->batch, r->height, r->width) < 2 ||
        trn_resnet_min_bn_count(&r->model, r->last_batch, r->height, r->width) < 2)
        trn_refuse(CDDP_EXIT_USAGE,
                   "--batch-size: a batch of %d images of %dx%d leaves batch norm one value per "
                   "channel; use a larger batch, or a dataset size that is not 1 more than a "
                   "multiple of it",
                   r->last_batch < r->batch ? r->last_batch : r->batch, r->height, r->width);
    long steps_per_epoch = (r->batches + c->accum_steps - 1) / c->accum_steps;
    r->schedule = trn_lr_schedule_make(c->lr_schedule, c->lr, steps_per_epoch, c->epochs, c->steps);
    trn_input_init(&r->input, &r->be, d, r->batch, c->prefetch, c->threads);
}

/* The step engine (step.h): the loss scaler, and with --cuda-graphs the
 * graphs' device memory (backend.c refused the runs they cannot serve). */
static void setup_step(struct run *r)
{
    const struct trn_config *c = &r->cfg;
    struct trn_step_opts o = {
        .batch = r->batch,
        .height = r->height,
        .width = r->width,
        .accum_steps = c->accum_steps,
        .momentum = (float)c->momentum,
        .weight_decay = (float)c->weight_decay,
        .fp16 = c->amp == TRN_AMP_FP16,
        .cuda_graphs = c->cuda_graphs,
    };
    trn_step_init(&r->engine, &o, &r->be, &r->model, &r->ddp);
}

/* Where to start: from scratch, or where --checkpoint left off. Every rank
 * reads the same file (on several nodes it must be on a shared filesystem;
 * connect() checks that the ranks agree). */
static void resume(struct run *r)
{
    char err[4096];
    trn_resume_init(&r->ckpt, &r->cfg, &r->model, r->state, &r->sampler, &r->schedule);
    r->ckpt.scaler = &r->engine.scaler;
    int rc = trn_resume_load(&r->ckpt, r->rank, &r->start, err, sizeof(err));
    if (rc < 0)
        trn_refuse(CDDP_EXIT_FAILURE, "%s", err);
    if (rc == 0 && r->resuming)
        trn_refuse(CDDP_EXIT_FAILURE, "--checkpoint: %s: removed while cddp-train was starting",
                   r->cfg.checkpoint);
    r->step = r->start.step;
    trn_resnet_push(&r->model); /* --init's or the checkpoint's tensors (a device backend) */
}

/* ------------------------------------------------------------------------ */
/* Connecting: the one place a rank waits for the others before training     */

static void release(struct run *r);

/* What the ranks found they disagree on, once connected: exit, everything
 * released. */
static _Noreturn void leave(struct run *r, int code, const char *msg)
{
    fprintf(stderr, "cddp-train: %s\n", msg);
    release(r);
    exit(code);
}

/* Everything every rank must agree on (trn_ddp_check_config): the flags
 * flags.c marks, and what the others make: the model's classes, the
 * training split's size and shape. Paths, threads and timeouts may differ. */
static void agreed_settings(const struct run *r, char *buf, size_t len)
{
    int n = trn_flags_digest(&r->cfg, buf, len);
    if (n >= 0 && (size_t)n < len)
        snprintf(buf + n, len - (size_t)n, " (%d classes; %zu training samples of %dx%dx%d)",
                 r->num_classes, r->train->len, r->train->channels, r->height, r->width);
}

/* Rank 0 serves the bootstrap store on MASTER_ADDR:MASTER_PORT, every rank
 * reaches it, gloo connects them all (docs/distributed.md). Then DDP
 * (ddp.h): the ranks check that they were started alike and resume from
 * the same place, and every rank starts from rank 0's model. */
static void connect_ranks(struct run *r)
{
    const struct trn_config *c = &r->cfg;
    char err[8192];
    trn_inplace_check_backend(r); /* --restart_scope=worker: gloo and nccl */
    /* nccl orders its collectives with the compute stream (comm.h);
     * restart_count and rdzv_round come from the environment bootstrap.c
     * reads (TORCHELASTIC_RESTART_COUNT, CDDP_RDZV_ROUND). */
    struct trn_dist_options dopts = {.init_timeout_s = c->init_timeout,
                                     .collective_timeout_s = c->collective_timeout,
                                     .backend = r->dev.comm,
                                     .cuda_device = r->dev.ordinal,
                                     .generation = r->generation,
                                     .name_missing = r->in_place,
                                     .recoverable = r->in_place};
#if CDDP_HAVE_CUDA
    if (r->be.device == TRN_DEVICE_CUDA)
        dopts.cuda_stream = trn_backend_cuda_stream(&r->be);
#endif
    r->dopts = dopts;
    int rc = trn_dist_init(&r->dist, &dopts, getenv, err, sizeof(err));
    if (rc != 0)
        trn_refuse(rc == CDDP_ECONFIG || rc == CDDP_EPARSE || rc == CDDP_ERANGE_ARG
                       ? CDDP_EXIT_USAGE
                       : CDDP_EXIT_FAILURE,
                   "%s", err);
    if (r->generation > 0 && r->world > 1) {
        trn_inplace_rejoin(r);
        return;
    }
    trn_comm_set_watchdog_exit(r->dist.comm, run_watchdog_exit, r);

    struct trn_ddp_options ddo = {
        .bucket_cap_mb = c->bucket_cap_mb,
        .overlap = c->overlap,
        .sync_bn = c->sync_bn,
        .bf16_grads = c->grad_reduce == TRN_GRAD_REDUCE_BF16,
    };
    if (trn_ddp_init(&r->ddp, &r->model, r->dist.comm, &ddo, run_collective_failed, r, err,
                     sizeof(err)))
        trn_fatal("%s", err);
    char settings[4096];
    agreed_settings(r, settings, sizeof(settings));
    if (trn_ddp_check_config(&r->ddp, settings, err, sizeof(err)) != 0)
        leave(r, CDDP_EXIT_USAGE, err);
    int64_t at[4] = {r->start.resumed, r->start.step, r->start.epoch, r->start.first_batch};
    if (trn_ddp_check_same(&r->ddp, at, 4) != 0) {
        snprintf(err, sizeof(err),
                 "--checkpoint %s: the ranks would resume from different places (this rank: %s, "
                 "step %ld); on several nodes the checkpoint must be on a shared filesystem",
                 c->checkpoint ? c->checkpoint : "(none)",
                 r->start.resumed ? "resumed" : "fresh start", r->start.step);
        leave(r, CDDP_EXIT_FAILURE, err);
    }
    trn_ddp_broadcast_state(&r->ddp);
    if (r->world > 1) {
        trn_ddp_bucket_summary(&r->ddp, err, sizeof(err));
        log_info("T6201",
                 "DDP over %d ranks (%s): %s, overlap %s, sync-bn %s, accum-steps %ld, "
                 "gradients reduced in %s (--backend %s, %s memory)",
                 r->world, trn_comm_backend(r->dist.comm), err, c->overlap ? "on" : "off",
                 c->sync_bn ? "on" : "off", c->accum_steps, trn_grad_reduce_names[c->grad_reduce],
                 trn_comm_req_names[c->backend],
                 r->dev.device == TRN_DEVICE_CUDA ? "device" : "host");
    }
}

/* ------------------------------------------------------------------------ */
/* Training                                                                  */

/* Where training stands after this rank's batches [0, b) of epoch, as a
 * checkpoint records it: *rank_offset samples done of the epoch returned
 * (an epoch's end is the next one's start). */
static int position(const struct run *r, int epoch, long b, size_t *rank_offset)
{
    bool whole = b >= r->batches;
    *rank_offset = whole ? 0 : (size_t)b * (size_t)r->batch;
    return whole ? epoch + 1 : epoch;
}

/* Writes the checkpoint (rank 0) at `step` after this rank's batches
 * [0, b) of epoch; then nobody runs on before the checkpoint it would
 * restart from exists. */
static void checkpoint(struct run *r, int epoch, long b)
{
    char err[4096];
    size_t rank_offset;
    int at = position(r, epoch, b, &rank_offset);
    if (r->cfg.checkpoint && r->rank == 0)
        trn_resnet_pull(&r->model);
    int rc = trn_resume_save(&r->ckpt, r->rank, at, r->step, rank_offset, err, sizeof(err));
    if (rc < 0)
        trn_refuse(CDDP_EXIT_FAILURE, "%s", err);
    if (rc > 0 && r->world > 1)
        run_check_collective(r, trn_comm_barrier(r->dist.comm));
}

/* What an epoch adds up, for its closing line. */
struct epoch_tally {
    double loss_sum;
    long images, batches;
};

/* One optimizer step over batches [b0, b1) of the epoch: each loss divided
 * by their number, gradients averaged across ranks only after the last one
 * (DDP's no_sync before it), then SGD at the schedule's rate (step.h).
 * Returns the step's seconds (what the progress line reports). */
static double train_step(struct run *r, int epoch, long b0, long b1, struct epoch_tally *t)
{
    const struct trn_config *c = &r->cfg;
    struct trn_input *in = &r->input;
    r->in_step = r->step;
    trn_comm_set_step(r->dist.comm, r->step); /* the watchdog's report names it */
    /* (a slowdown the fault injects is this rank's own time: it counts as
     * compute, as a slow rank's would, and the others wait for it) */
    trn_inplace_before_step(r, epoch, b0); /* --restart_scope=worker: where to redo from */
    uint64_t ts = cddp_mono_ns(), wait0 = trn_comm_wait_ns(r->dist.comm);
    if (trn_fault_due(&c->fault, r->step, r->rank, r->env.restart_count))
        trn_fault_fire(&c->fault, r->step, r->rank);
    float k = (float)(b1 - b0), step_loss = 0;
    long step_images = 0;
    trn_step_begin(&r->engine, r->step, trn_lr_at(&r->schedule, r->step), b1 - b0);
    for (long b = b0; b < b1; b++) {
        int n = b == r->batches - 1 ? r->last_batch : r->batch;
        const uint32_t *idx = r->sampler.indices + (size_t)b * (size_t)r->batch;
        const float *x = trn_input_next(in, r->train, idx, n);
        for (int i = 0; i < n; i++)
            if (in->labels[i] < 0 || in->labels[i] >= r->num_classes)
                trn_fatal("label %d of sample %u is outside [0, %d)", in->labels[i], idx[i],
                          r->num_classes);
        trn_step_micro(&r->engine, x, in->labels, n, b - b0, b == b1 - 1);
        /* (no batch ahead after the last step --steps allows) */
        trn_input_done(in, r->train, b < b1 - 1 || !c->steps || r->step + 1 < c->steps);
        t->batches++;
        t->images += n;
        step_images += n;
    }
    trn_step_end(&r->engine); /* (the losses are known from here) */
    for (long b = b0; b < b1; b++) {
        float loss = r->engine.losses[b - b0];
        t->loss_sum += loss;
        step_loss += loss / k;
        if (!isfinite(loss))
            log_warn("T0003", "step %ld: loss is %f", r->step, (double)loss);
        if (r->rank == 0 && b % c->log_every == 0)
            printf("Epoch %d [%ld/%ld] Loss: %.4f\n", epoch, b, r->batches, (double)loss);
    }
    r->step++;
    trn_inplace_after_step(r, epoch, b1);
    trn_input_count_step(in);
    double secs = (double)(cddp_mono_ns() - ts) * 1e-9;
    double wait = (double)(trn_comm_wait_ns(r->dist.comm) - wait0) * 1e-9;
    log_debug("T0002", "step %ld loss %.9g time %.6f s", r->step, (double)step_loss, secs);
    struct progress_line line = {
        .step = r->step,
        .epoch = epoch,
        .loss = step_loss,
        .samples_per_s = (double)step_images / secs,
        .step_time_s = secs,
        .compute_s = secs > wait ? secs - wait : 0,
        .wait_s = wait,
    };
    trn_progress_fd_report(&r->progress, &line);
    return secs;
}

/* A stop signal came during the step that just ended (stop.h): rank 0
 * saves it, and the rank dies by the signal. */
static void stop_if_signalled(struct run *r, int epoch, long b1)
{
    size_t rank_offset;
    int at = position(r, epoch, b1, &rank_offset);
    trn_stop_if_signalled(&r->ckpt, r->rank, at, r->step, rank_offset);
}

/* One epoch, from where the run starts in it: steps of --accum-steps
 * batches (the last may have fewer), checkpoints every --ckpt-every steps
 * and at the end (or where --steps stops it). False when training is over. */
static bool train_epoch(struct run *r, int epoch)
{
    const struct trn_config *c = &r->cfg;
    trn_sampler_set_epoch(&r->sampler, epoch);
    uint64_t t0 = cddp_mono_ns();
    struct epoch_tally t = {0};
    long first = epoch == r->start.epoch ? r->start.first_batch : 0; /* a resumed epoch */
    for (long b0 = first; b0 < r->batches; b0 += c->accum_steps) {
        if (c->steps && r->step >= c->steps)
            break;
        long b1 = b0 + c->accum_steps < r->batches ? b0 + c->accum_steps : r->batches;
        double step_s = train_step(r, epoch, b0, b1, &t);
        stop_if_signalled(r, epoch, b1);
        uint64_t tc = cddp_mono_ns();
        /* (an epoch's last step is saved as the epoch's end, below) */
        if (c->ckpt_every && r->step % c->ckpt_every == 0 && b1 < r->batches)
            checkpoint(r, epoch, b1);
        trn_stop_note_step(step_s, (double)(cddp_mono_ns() - tc) * 1e-9);
    }
    if (t.batches == 0)
        return false;
    double secs = (double)(cddp_mono_ns() - t0) * 1e-9;
    if (r->rank == 0)
        printf("Epoch %d finished, avg loss: %.4f, time: %.2fs, throughput: %.1f img/s\n", epoch,
               t.loss_sum / (double)t.batches, secs, (double)t.images * r->world / secs);
    checkpoint(r, epoch, first + t.batches);
    return !(c->steps && r->step >= c->steps);
}

/* Every rank holds the same model from here: the parameters were always
 * equal; the running statistics become rank 0's (as DDP broadcasts them). */
static void finish_training(struct run *r)
{
    r->in_step = -1;
    trn_input_stop(&r->input);
    trn_input_log(&r->input);
    trn_ddp_sync_buffers(&r->ddp);
    trn_resnet_pull(&r->model); /* the checksum and --save read the host copies */
    if (cddp_log_enabled(CDDP_LOG_INFO))
        log_info("T6202", "after %ld steps: state checksum %016" PRIx64, r->step,
                 trn_ddp_state_checksum(&r->model));
    trn_step_log(&r->engine);
    const struct trn_ddp_stats *s = &r->ddp.stats;
    if (r->world > 1)
        log_info("T6203",
                 "DDP: %ld steps, %ld bucket allreduces (%.1f MiB), %.3f s (%.2f ms/step) "
                 "waiting for gradients after backward, %ld SyncBN exchanges",
                 s->backwards, s->allreduces, s->bytes / 1048576.0, s->wait_s,
                 s->backwards ? s->wait_s * 1e3 / (double)s->backwards : 0.0, s->bn_exchanges);
}

/* ------------------------------------------------------------------------ */
/* Evaluation and saving                                                     */

/* Top-1 accuracy of the model in eval mode over the test split, shared
 * among the ranks (rank r takes samples r, r + world, ...; the counts are
 * summed); with all_logits (len, K), zeroed, not NULL, every sample's
 * logits too, on every rank. */
static double accuracy(struct run *r, float *all_logits)
{
    const struct trn_dataset *ds = r->test;
    struct trn_backend *be = &r->be;
    size_t K = (size_t)r->num_classes;
    int64_t counts[2] = {0, 0}; /* correct, seen */
    float *logits = trn_malloc((size_t)r->batch * K * sizeof(float));
    uint32_t *idx = trn_malloc((size_t)r->batch * sizeof(uint32_t));
    size_t stride = (size_t)r->world;
    /* --prefetch: the loader reads this rank's samples in the same order */
    uint32_t *mine = trn_malloc((ds->len / stride + 1) * sizeof(uint32_t));
    struct trn_list_batches list = {.idx = mine, .batch = r->batch};
    for (size_t j = (size_t)r->rank; j < ds->len; j += stride)
        mine[list.len++] = (uint32_t)j;
    trn_input_start(&r->input, ds, trn_list_batches_next, &list);
    for (size_t start = (size_t)r->rank; start < ds->len; start += (size_t)r->batch * stride) {
        int n = 0;
        for (size_t j = start; j < ds->len && n < r->batch; j += stride)
            idx[n++] = (uint32_t)j;
        const float *x = trn_input_next(&r->input, ds, idx, n);
        trn_resnet_forward(&r->model, x, NULL, n, ds->height, ds->width, false);
        be->ops->to_host(be, logits, r->model.logits, (size_t)n * K * sizeof(float));
        trn_input_done(&r->input, ds, true);
        for (int i = 0; i < n; i++) {
            const float *l = logits + (size_t)i * K;
            if (all_logits)
                memcpy(all_logits + idx[i] * K, l, K * sizeof(float));
            size_t best = 0;
            for (size_t k = 1; k < K; k++)
                if (l[k] > l[best])
                    best = k;
            counts[0] += (int64_t)best == r->input.labels[i];
            counts[1]++;
        }
    }
    trn_input_stop(&r->input);
    free(mine);
    free(idx);
    free(logits);
    struct trn_comm *comm = r->dist.comm;
    run_check_collective(r, trn_comm_allreduce(comm, counts, 2, TRN_COMM_I64, TRN_COMM_SUM));
    if (all_logits)
        run_check_collective(
            r, trn_comm_allreduce(comm, all_logits, ds->len * K, TRN_COMM_F32, TRN_COMM_SUM));
    return counts[1] ? (double)counts[0] / (double)counts[1] : 0.0;
}

/* --eval: the accuracy on the test split, BN in eval mode, and with
 * --eval-logits the logits, written by rank 0. A write that fails sets the
 * exit status; the rank stays for the barrier in save(). */
static void evaluate(struct run *r)
{
    if (!r->test)
        return;
    const struct trn_config *c = &r->cfg;
    float *all =
        c->eval_logits ? trn_calloc(r->test->len * (size_t)r->num_classes, sizeof(float)) : NULL;
    double acc = accuracy(r, all);
    if (r->rank == 0)
        printf("test accuracy: %.4f\n", acc);
    if (all && r->rank == 0) {
        struct trn_st_tensor t = {.name = "logits",
                                  .dtype = TRN_ST_F32,
                                  .ndim = 2,
                                  .shape = {r->test->len, (uint64_t)r->num_classes},
                                  .data = all};
        char err[4096];
        if (trn_st_save(c->eval_logits, &t, 1, NULL, 0, err, sizeof(err)) != 0) {
            fprintf(stderr, "cddp-train: --eval-logits: %s\n", err);
            r->rc = CDDP_EXIT_FAILURE;
        }
    }
    free(all);
}

/* --save: the final weights as a torchvision state_dict, from rank 0; then
 * nobody leaves while another rank may still be reading from it. */
static void save(struct run *r)
{
    const struct trn_config *c = &r->cfg;
    char err[4096];
    if (c->save && r->rank == 0 &&
        trn_weights_save(c->save, c->arch, r->num_classes, r->state, r->model.n_state, err,
                         sizeof(err)) != 0) {
        fprintf(stderr, "cddp-train: --save: %s\n", err);
        r->rc = CDDP_EXIT_FAILURE;
    }
    if (r->world > 1)
        run_check_collective(r, trn_comm_barrier(r->dist.comm));
}

/* Everything setup() and connect_ranks() made. */
static void release(struct run *r)
{
    trn_inplace_free(r);
    trn_step_free(&r->engine);
    trn_input_free(&r->input);
    trn_ddp_free(&r->ddp);
    trn_dist_close(&r->dist);
    trn_resume_free(&r->ckpt);
    free(r->state);
    trn_sampler_free(&r->sampler);
    trn_resnet_free(&r->model);
    trn_dataset_close(r->train);
    trn_dataset_close(r->test);
    trn_backend_release(&r->be);
}

int main(int argc, char **argv)
{
    cddp_log_init("cddp-train");
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines reach a pipe as they are printed */
    /* (static: main's state must survive the recovery point's longjmp) */
    static struct run r;

    setup_flags(&r, argc, argv);
    /* A warm spare (cddprun --spare_workers) makes what does not depend on
     * its rank, then waits to be given one (spare.h). */
    bool spare = trn_spare_begin(&r);
    if (spare) {
        setup_model(&r);
        trn_spare_warm_up(&r);
        trn_spare_wait(&r);
    }
    setup_identity(&r);
    trn_inplace_setup(&r);
    if (spare)
        trn_spare_check(&r);
    else
        setup_model(&r);
    setup_batches(&r);
    setup_step(&r);
    resume(&r);
    trn_inplace_start(&r);
    connect_ranks(&r);
    if (r.cfg.checkpoint)
        trn_stop_install(); /* (nothing to save without it: the default actions, at once) */
    if (r.in_place) {
        /* A failed collective in the loop comes back here
         * (run_collective_failed); the setjmp must stay in main's frame, a
         * longjmp target cannot be in a function that has returned. */
        if (setjmp(r.recover) != 0)
            trn_inplace_recover(&r);
        r.recover_armed = true;
    }
    trn_input_start_train(&r.input, r.train, &r.sampler, r.start.epoch, r.start.first_batch,
                          (int)r.cfg.epochs);
    for (int epoch = r.start.epoch; epoch < r.cfg.epochs; epoch++)
        if (!train_epoch(&r, epoch))
            break;
    r.recover_armed = false;
    finish_training(&r);
    evaluate(&r);
    save(&r);

    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        log_debug("T0004", "peak_rss_kb %ld", ru.ru_maxrss);
    release(&r);
    return r.rc;
}
