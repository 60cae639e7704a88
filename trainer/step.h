/*
 * step.h: the training step's engine: each micro-batch's forward and
 * backward, the optimizer step, and --amp fp16's GradScaler, with DDP's
 * part of each (ddp.h: the buffers' broadcast before a forward, no_sync
 * before all but the step's last backward, the bucket wait before the
 * optimizer step).
 *
 * A step is trn_step_begin, trn_step_micro for each of its micro-batches,
 * trn_step_end. Each piece either runs as the host drives it or, with
 * --cuda-graphs, as a CUDA graph captured once per shape and replayed;
 * graph_plan.h (pure) decides which per launch, step.c carries it out
 * with the backend's graph ops (ops.h, ops/cuda/graph.cu). Either way the
 * step ends in one place: the losses and found_inf are known there (read
 * back from the device once when a graph ran), the scaler is updated
 * there, and the model's optimizer step count is advanced there for a
 * graph (uncaptured, the SGD call counts itself).
 *
 * One thread (the step loop's) calls these. The backend, the model and
 * DDP are borrowed (DDP set up before the first step); the scaler and the
 * graphs are the engine's. Running out of memory, or --cuda-graphs on a
 * backend without graph ops, is fatal (trainer/fatal.h).
 */
#ifndef CDDP_TRAINER_STEP_H
#define CDDP_TRAINER_STEP_H

#include <stdbool.h>
#include <stdint.h>

#include "trainer/ddp.h"        /* struct trn_ddp */
#include "trainer/graph_plan.h" /* struct trn_graph_plan */
#include "trainer/ops/ops.h"    /* struct trn_backend */
#include "trainer/resnet.h"     /* struct trn_resnet */
#include "trainer/scaler.h"     /* struct trn_scaler */

struct trn_step_opts {
    int batch, height, width; /* a full batch's shape (only those are captured) */
    long accum_steps;         /* micro-batches a step has at most */
    float momentum, weight_decay;
    bool fp16;        /* --amp fp16: GradScaler's loss scaling */
    bool cuda_graphs; /* --cuda-graphs */
};

struct trn_step {
    struct trn_step_opts o;
    struct trn_backend *be;   /* borrowed */
    struct trn_resnet *model; /* borrowed */
    struct trn_ddp *ddp;      /* borrowed */
    struct trn_scaler scaler; /* --amp fp16's loss scaling (disabled otherwise) */
    float *losses;            /* (accum_steps): each micro-batch's, after trn_step_end */

    /* The step in progress: its number, learning rate and micro-batches;
     * whether its gradients held an inf or NaN (fp16), and how its
     * optimizer step ran. */
    long step;
    double lr;
    long micro_batches;
    bool found_inf;
    enum trn_graph_action opt;

    /* --cuda-graphs: the plan, the executable graphs by its slots, the
     * device scalars the graphs read and write (step.c's GS_*, then a loss
     * per micro-batch) and their host copy, and which micro-batches of
     * this step left their loss there. */
    struct trn_graph_plan plan;
    void *exec[TRN_GRAPH_MAX];
    float *dev, *host;
    bool *pending;
};

/* The engine over be, m and ddp (borrowed until trn_step_free; ddp is used
 * from the first step on): the scaler, the losses and, with --cuda-graphs,
 * the graphs' device scalars and the backend's graph set-up (T2502). */
void trn_step_init(struct trn_step *s, const struct trn_step_opts *o, struct trn_backend *be,
                   struct trn_resnet *m, struct trn_ddp *ddp);

/* Step `step` (the count of steps taken before it) at learning rate lr,
 * over micro_batches (1 ..= accum_steps) micro-batches. */
void trn_step_begin(struct trn_step *s, long step, double lr, long micro_batches);

/* Micro-batch i of the step: x (n samples, in device memory, the input's)
 * and labels (n, host) forward and backward, the loss scaled by the
 * scaler over the micro-batches' number, the gradients accumulated after
 * the first; sync: the step's last, whose gradients DDP reduces. */
void trn_step_micro(struct trn_step *s, const float *x, const int32_t *labels, int n, long i,
                    bool sync);

/* The step's end: DDP's reduced gradients awaited, the optimizer step
 * (fp16: unscaled, skipped on inf/NaN), the scaler updated (T2004 when it
 * backs off); s->losses[0 .. micro_batches) hold the step's losses. */
void trn_step_end(struct trn_step *s);

/* --cuda-graphs' closing line (T2503); nothing without it. */
void trn_step_log(const struct trn_step *s);

/* Frees what init made. A zeroed struct: nothing. */
void trn_step_free(struct trn_step *s);

#endif
