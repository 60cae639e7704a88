/*
 * run.h: struct run, everything one run of cddp-train holds, shared by
 * train.c (the program, which fills it in main()'s order) and inplace.c
 * (--restart_scope=worker's recovery, which re-forms the group and moves
 * the state in it). Internal to cddp-train: nothing else includes it.
 *
 * The run_ functions are train.c's collective failure path, which
 * inplace.c hands to the communicator and DDP again after re-forming.
 */
#ifndef CDDP_TRAINER_RUN_H
#define CDDP_TRAINER_RUN_H

#include <setjmp.h>
#include <stdbool.h>
#include <stdint.h>

#include "trainer/backend.h"        /* struct trn_device_choice */
#include "trainer/checkpoint.h"     /* struct trn_ckpt_tensor */
#include "trainer/comm/bootstrap.h" /* struct trn_dist_env, trn_dist, trn_dist_options */
#include "trainer/comm/comm.h"      /* struct trn_comm_error */
#include "trainer/data/dataset.h"   /* struct trn_dataset */
#include "trainer/data/sampler.h"   /* struct trn_sampler */
#include "trainer/ddp.h"            /* struct trn_ddp */
#include "trainer/flags.h"          /* struct trn_config */
#include "trainer/input.h"          /* struct trn_input */
#include "trainer/ops/ops.h"        /* struct trn_backend */
#include "trainer/progress_fd.h"    /* struct trn_progress_fd */
#include "trainer/resnet.h"         /* struct trn_resnet */
#include "trainer/resume.h"         /* struct trn_resume, trn_resume_point */
#include "trainer/schedule.h"       /* struct trn_lr_schedule */
#include "trainer/step.h"           /* struct trn_step */

/* Everything one run holds, filled in main()'s order. A feature's runtime
 * state is a struct of its own file: the progress channel (progress_fd.h),
 * the input (input.h), the step engine with the loss scaler and the CUDA
 * graphs (step.h); the grace period on SIGTERM is process-wide (stop.h). */
struct run {
    struct trn_config cfg;
    struct trn_dist_env env; /* torchrun's environment: rank, world, error file, restarts */
    int rank, world;
    struct trn_progress_fd progress; /* CDDP_PROGRESS_FD: a line per step to cddprun */

    struct trn_device_choice dev; /* --device, resolved */
    struct trn_backend be;
    struct trn_dataset *train, *test; /* test: --eval only */
    int num_classes;
    int height, width; /* of every image */
    struct trn_resnet model;
    struct trn_ckpt_tensor *state; /* the model's state_dict (--init, --save, checkpoints) */

    struct trn_sampler sampler;
    int batch, last_batch; /* images per batch; in the epoch's last batch */
    long batches;          /* this rank's batches per epoch */
    struct trn_lr_schedule schedule;
    struct trn_input input; /* the batches, --prefetch's loader */
    struct trn_step engine; /* micro-batches, the optimizer step, the scaler, --cuda-graphs */

    bool resuming; /* a checkpoint was there to resume: no initialisation, no --init */
    struct trn_resume ckpt;
    struct trn_resume_point start; /* where training starts */
    long step;                     /* optimizer steps taken */
    /* The step in progress, for a failed collective; -1: none. Published
     * for the NCCL watchdog's thread too (watchdog_exit), hence atomic. */
    _Atomic long in_step;

    struct trn_dist dist;
    struct trn_dist_options dopts; /* kept for re-forming */
    struct trn_ddp ddp;
    int rc; /* the exit status once training is done */

    /* Recovering in place (cddprun --restart_scope=worker: CDDP_RESTART_SCOPE
     * =worker, CDDP_GENERATION; docs/distributed.md; inplace.c): a failed collective
     * in the training loop goes back to `recover` instead of exiting 75;
     * the rank re-forms with the replaced one and every rank takes the
     * state of the lowest rank that was not replaced. redo: where the step
     * in progress (or the next one) starts, and the buffers before it (a
     * failed step's forward already moved the BN statistics). */
    bool in_place;
    long generation;
    jmp_buf recover;
    bool recover_armed;
    uint64_t failed_ns; /* monotonic: when the collective that failed began */
    struct {
        bool in_step;
        int epoch;
        long b0, step;
        float *buffers; /* (num_buffers), host */
        int64_t *nbt;   /* (num_bn) */
        /* nccl (stream-ordered waits: a failure may be found after the
         * step's optimizer ran over partly reduced gradients): the params
         * and momentum before the step (device memory) and the counters
         * the step moves; NULL on gloo, whose failures return before it. */
        float *params, *momentum;
        long optimizer_steps, growth_tracker;
        float scale;
    } redo;
};

/* A collective timed out or a peer failed (the communicator's and DDP's
 * failure callback, arg: the run): torchrun's error file and exit 75, or
 * under --restart_scope=worker in the training loop, back to main()'s
 * recovery point. */
void run_collective_failed(void *arg, const struct trn_comm_error *e);

/* The NCCL watchdog gave up, on its own thread (comm.h,
 * trn_comm_set_watchdog_exit; arg: the run): exit 75. */
_Noreturn void run_watchdog_exit(void *arg, const struct trn_comm_error *e);

/* A collective's return code: on failure, run_collective_failed (no
 * return). */
void run_check_collective(struct run *r, int rc);

#endif
