/*
 * step.c: the training step's engine; see step.h.
 *
 * --cuda-graphs: the step captured once per shape and replayed.
 *
 * A step is its micro-batches' forward and backward (one MICRO graph per
 * batch shape, accumulating or not, and input buffer) and the optimizer
 * step (one OPT graph: fp16's unscale and check, SGD); graph_plan.h
 * decides per launch whether it warms up (runs as the host drives it),
 * is captured, or replays. What a graph reads that changes per step lives
 * in device memory the host writes first: the input batch (already
 * uploaded by input.c), the labels (trn_resnet_upload_labels), and the
 * scalars below (trn_step_begin). What it writes that the host wants is
 * read back once, after the step (read_back): each micro-batch's loss and
 * found_inf, which then drives the loss scaler as the host's unscale does.
 *
 * Host state a replay does not touch, advanced here by hand
 * (trn_graph_host_advance): every batch norm's num_batches_tracked (one
 * per replayed forward: trn_resnet_count_forward; a capture runs the host
 * code, which counts), the model's optimizer_steps (after the read-back,
 * when the step was taken: no inf/NaN), and DDP's per-backward
 * bookkeeping, which trn_ddp_begin_backward still does on the host (with
 * one rank it reduces nothing: train.c refuses more with --cuda-graphs).
 * The epoch's last short batch runs uncaptured (not eligible), as does the
 * optimizer step until SGD's first step has filled the momentum (the graph
 * bakes first_step false).
 */
#include "trainer/step.h"

#include <stdlib.h>
#include <string.h>

#include "common/log.h"    /* log_info, log_warn */
#include "trainer/fatal.h" /* TRN_CHECK, trn_calloc */

/* The device scalars (s->dev, and their host copy s->host): what the
 * graphs read (the learning rate, the loss scale over the micro-batches,
 * its inverse), found_inf (an int32), the last micro-batch's loss, then
 * from GS_LOSSES each micro-batch's. */
enum { GS_LR, GS_LOSS_SCALE, GS_INV_SCALE, GS_FOUND_INF, GS_LOSS, GS_LOSSES = 8 };

void trn_step_init(struct trn_step *s, const struct trn_step_opts *o, struct trn_backend *be,
                   struct trn_resnet *m, struct trn_ddp *ddp)
{
    *s = (struct trn_step){.o = *o, .be = be, .model = m, .ddp = ddp};
    trn_scaler_init(&s->scaler, o->fp16);
    size_t k = (size_t)o->accum_steps;
    s->losses = trn_calloc(k, sizeof(float));
    if (!o->cuda_graphs)
        return;
    const struct trn_ops *ops = be->ops;
    TRN_CHECK(ops->graph_setup && ops->graph_begin && ops->graph_end && ops->graph_launch &&
                  ops->graph_destroy && ops->graph_gen && ops->xent_forward_dev &&
                  ops->xent_backward_dev && ops->unscale_dev && ops->sgd_step_dev && ops->copy,
              "--cuda-graphs: the %s backend has no graph ops", ops->name);
    trn_graph_plan_init(&s->plan, TRN_GRAPH_WARMUP);
    ops->graph_setup(be);
    s->host = trn_calloc(GS_LOSSES + k, sizeof(float));
    s->dev = ops->alloc(be, (GS_LOSSES + k) * sizeof(float)); /* zeroed: found_inf 0 */
    TRN_CHECK(s->dev, "out of device memory for the CUDA graphs' scalars");
    s->pending = trn_calloc(k, sizeof(bool));
    log_info("T2502",
             "--cuda-graphs: each step shape captured after %d clean warm-up runs, then replayed "
             "(the last short batch of an epoch runs uncaptured)",
             TRN_GRAPH_WARMUP);
}

void trn_step_free(struct trn_step *s)
{
    if (s->o.cuda_graphs && s->be && s->be->ops) {
        for (int i = 0; i < TRN_GRAPH_MAX; i++)
            if (s->exec[i])
                s->be->ops->graph_destroy(s->be, s->exec[i]);
        s->be->ops->free(s->be, s->dev);
    }
    free(s->host);
    free(s->pending);
    free(s->losses);
}

/* ---- The graphs' bookkeeping (graph_plan.h) ---- */

/* What the graphs point into (graph_plan.h): the backend's scratch, the
 * model's activation arena. Without --cuda-graphs: nothing (zero). */
static struct trn_graph_env graph_env(struct trn_step *s)
{
    if (!s->o.cuda_graphs)
        return (struct trn_graph_env){0};
    struct trn_graph_env e = {s->be->ops->graph_gen(s->be), (uint64_t)(uintptr_t)s->model->arena,
                              (uint64_t)s->model->arena_bytes};
    return e;
}

/* How to run key now: as the host drives it without --cuda-graphs, else
 * graph_plan's decision, after dropping the graphs the memory outgrew. */
static enum trn_graph_action graph_decide(struct trn_step *s, const struct trn_graph_key *key,
                                          bool eligible, int *slot)
{
    if (!s->o.cuda_graphs)
        return TRN_GRAPH_RUN;
    struct trn_graph_env env = graph_env(s);
    unsigned stale = trn_graph_check_env(&s->plan, &env);
    for (int i = 0; i < TRN_GRAPH_MAX; i++)
        if (stale & (1u << i)) {
            s->be->ops->graph_destroy(s->be, s->exec[i]);
            s->exec[i] = NULL;
        }
    if (stale)
        log_info("T2501",
                 "step %ld: CUDA graphs dropped (device memory moved); capturing again "
                 "after warm-up",
                 s->step);
    return trn_graph_decide(&s->plan, key, eligible, slot);
}

/* After key ran as the host drives it: whether the memory stayed where it
 * was (before: graph_env's), a clean warm-up run. Without --cuda-graphs:
 * nothing. */
static void graph_ran(struct trn_step *s, const struct trn_graph_key *key,
                      const struct trn_graph_env *before)
{
    if (!s->o.cuda_graphs)
        return;
    struct trn_graph_env after = graph_env(s);
    trn_graph_ran(&s->plan, key, trn_graph_env_same(before, &after));
}

/* End of a capture into slot: instantiate, note it, launch follows. */
static void graph_captured(struct trn_step *s, int slot, const char *what)
{
    s->exec[slot] = s->be->ops->graph_end(s->be);
    struct trn_graph_env env = graph_env(s);
    trn_graph_captured(&s->plan, slot, &env);
    log_info("T2500", "step %ld: captured the %s into a CUDA graph", s->step, what);
}

void trn_step_begin(struct trn_step *s, long step, double lr, long micro_batches)
{
    s->step = step;
    s->lr = lr;
    s->micro_batches = micro_batches;
    s->found_inf = false;
    s->opt = TRN_GRAPH_RUN;
    if (!s->o.cuda_graphs)
        return;
    /* the step's scalars to the device before anything of it is queued */
    float k = (float)micro_batches;
    s->host[GS_LR] = (float)lr;
    s->host[GS_LOSS_SCALE] = trn_scaler_loss_scale(&s->scaler) / k; /* as micro_host's */
    s->host[GS_INV_SCALE] = trn_scaler_inv_scale(&s->scaler);
    s->be->ops->to_device(s->be, s->dev, s->host, (GS_INV_SCALE + 1) * sizeof(float));
    memset(s->pending, 0, (size_t)s->o.accum_steps * sizeof(bool));
}

/* ---- Micro-batches ---- */

/* Forward and backward as the host drives them, the loss to losses[i]
 * (times the loss scale under --amp fp16: unscaled before the step). */
static void micro_host(struct trn_step *s, const float *x, const int32_t *labels, int n, long i,
                       bool sync)
{
    struct trn_resnet *m = s->model;
    float k = (float)s->micro_batches;
    float loss = trn_resnet_forward(m, x, labels, n, s->o.height, s->o.width, true);
    trn_ddp_begin_backward(s->ddp, sync);
    trn_resnet_backward(m, trn_scaler_loss_scale(&s->scaler) / k, i > 0);
    s->losses[i] = loss;
}

/* Forward and backward captured into slot's graph (CAPTURE) or by the
 * graph captured before (REPLAY); the loss stays on the device. */
static void micro_graph(struct trn_step *s, enum trn_graph_action a, int slot, const float *x,
                        const int32_t *labels, int n, long i, bool sync)
{
    struct trn_resnet *m = s->model;
    const struct trn_ops *ops = s->be->ops;
    trn_resnet_upload_labels(m, labels, n, s->o.height, s->o.width);
    if (a == TRN_GRAPH_CAPTURE) {
        ops->graph_begin(s->be);
        trn_resnet_forward_dev(m, x, n, s->o.height, s->o.width, s->dev + GS_LOSS);
        trn_ddp_begin_backward(s->ddp, sync);
        trn_resnet_backward_dev(m, s->dev + GS_LOSS_SCALE, i > 0);
        graph_captured(s, slot,
                       i > 0 ? "accumulating forward and backward" : "forward and backward");
    } else {
        trn_ddp_begin_backward(s->ddp, sync);
        trn_graph_replayed(&s->plan, slot);
    }
    ops->graph_launch(s->be, s->exec[slot]);
    struct trn_graph_host_step adv = trn_graph_host_advance(TRN_GRAPH_MICRO, a, true);
    for (int j = 0; j < adv.bn_forwards; j++)
        trn_resnet_count_forward(m);
    /* the loss out of the graph's one scalar, in stream order */
    ops->copy(s->be, s->dev + GS_LOSSES + i, s->dev + GS_LOSS, sizeof(float));
    s->pending[i] = true;
}

void trn_step_micro(struct trn_step *s, const float *x, const int32_t *labels, int n, long i,
                    bool sync)
{
    trn_ddp_sync_buffers(s->ddp);
    struct trn_graph_key key = {TRN_GRAPH_MICRO, n,     s->o.height,
                                s->o.width,      i > 0, (uint64_t)(uintptr_t)x};
    int slot;
    enum trn_graph_action a = graph_decide(s, &key, n == s->o.batch, &slot);
    if (a != TRN_GRAPH_RUN) {
        micro_graph(s, a, slot, x, labels, n, i, sync);
        return;
    }
    struct trn_graph_env before = graph_env(s);
    micro_host(s, x, labels, n, i, sync);
    graph_ran(s, &key, &before);
}

/* ---- The optimizer step ---- */

/* --amp fp16's unscale and inf/NaN check (found_inf; GradScaler's unscale_),
 * then SGD unless it found one, as the host drives them. */
static void opt_host(struct trn_step *s)
{
    struct trn_resnet *m = s->model;
    if (s->scaler.enabled)
        s->found_inf =
            s->be->ops->unscale(s->be, m->grads, m->num_params, trn_scaler_inv_scale(&s->scaler));
    if (!s->found_inf)
        trn_resnet_sgd_step(m, (float)s->lr, s->o.momentum, s->o.weight_decay);
}

/* The same captured into slot's graph (CAPTURE) or by the graph captured
 * before (REPLAY): found_inf stays on the device until read_back. */
static void opt_graph(struct trn_step *s, int slot)
{
    struct trn_resnet *m = s->model;
    const struct trn_ops *ops = s->be->ops;
    int32_t *found_inf = (int32_t *)(s->dev + GS_FOUND_INF);
    if (s->opt == TRN_GRAPH_CAPTURE) {
        ops->graph_begin(s->be);
        if (s->scaler.enabled)
            ops->unscale_dev(s->be, m->grads, m->num_params, s->dev + GS_INV_SCALE, found_inf);
        trn_resnet_sgd_step_dev(m, s->dev + GS_LR, found_inf, s->o.momentum, s->o.weight_decay);
        graph_captured(s, slot, s->scaler.enabled ? "unscale and SGD step" : "SGD step");
    } else {
        trn_graph_replayed(&s->plan, slot);
    }
    ops->graph_launch(s->be, s->exec[slot]);
}

/* The step's one read-back when a graph ran in it: the losses the graphs
 * left, and found_inf when the optimizer step was a graph. */
static void read_back(struct trn_step *s)
{
    if (!s->o.cuda_graphs)
        return;
    long mb = s->micro_batches;
    bool any = s->opt != TRN_GRAPH_RUN;
    for (long i = 0; i < mb; i++)
        any |= s->pending[i];
    if (!any)
        return;
    s->be->ops->to_host(s->be, s->host + GS_FOUND_INF, s->dev + GS_FOUND_INF,
                        (size_t)(GS_LOSSES - GS_FOUND_INF + mb) * sizeof(float));
    for (long i = 0; i < mb; i++)
        if (s->pending[i])
            s->losses[i] = s->host[GS_LOSSES + i];
    if (s->opt == TRN_GRAPH_RUN)
        return;
    int32_t found_inf;
    memcpy(&found_inf, &s->host[GS_FOUND_INF], sizeof(found_inf));
    s->found_inf = found_inf != 0;
}

void trn_step_end(struct trn_step *s)
{
    struct trn_graph_key key = {TRN_GRAPH_OPT, 0, 0, 0, false, 0};
    int slot;
    trn_ddp_finish_backward(s->ddp);
    s->opt = graph_decide(s, &key, s->model->optimizer_steps > 0, &slot);
    if (s->opt == TRN_GRAPH_RUN) {
        struct trn_graph_env before = graph_env(s);
        opt_host(s);
        graph_ran(s, &key, &before);
    } else {
        opt_graph(s, slot);
    }
    read_back(s);
    /* GradScaler's update, the one place: found_inf is known on the host
     * now, however the optimizer step ran (disabled: the identity) */
    bool taken = trn_scaler_update(&s->scaler, s->found_inf);
    if (!taken)
        log_warn("T2004",
                 "step %ld: inf/NaN gradients under --amp fp16: step skipped, loss scale now %g",
                 s->step, (double)s->scaler.scale);
    if (s->opt != TRN_GRAPH_RUN)
        s->model->optimizer_steps +=
            trn_graph_host_advance(TRN_GRAPH_OPT, s->opt, taken).optimizer_steps;
}

void trn_step_log(const struct trn_step *s)
{
    if (s->o.cuda_graphs)
        log_info("T2503",
                 "CUDA graphs: %ld captured, %ld replays, %ld launches run uncaptured, %ld "
                 "invalidations",
                 s->plan.captures, s->plan.replays, s->plan.uncaptured, s->plan.invalidations);
}
