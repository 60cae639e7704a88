/*
 * inplace.c: recovering in place (cddprun --restart_scope=worker); see
 * inplace.h and docs/distributed.md, "Recovering in place".
 */
#include "trainer/inplace.h"

#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"         /* cddp_mono_ns */
#include "common/errors.h"        /* CDDP_EMISMATCH */
#include "common/exitcodes.h"     /* CDDP_EXIT_USAGE */
#include "common/log.h"           /* log_info, log_warn */
#include "trainer/blame.h"        /* trn_blame_missing: a hung peer */
#include "trainer/cma.h"          /* trn_cma_read: a peer's memory on this host */
#include "trainer/comm/failure.h" /* trn_comm_fail: error file, exit 75 */
#include "trainer/fault.h"        /* --fault crash@reform */
#include "trainer/fatal.h"        /* trn_refuse, trn_fatal, trn_malloc */
#include "trainer/run.h"          /* struct run, run_check_collective */

/* CDDP_RESTART_SCOPE=worker from cddprun: failed collectives in the
 * training loop re-form instead of exiting; CDDP_GENERATION > 0: this
 * process replaces a failed rank. */
void trn_inplace_setup(struct run *r)
{
    const char *scope = getenv("CDDP_RESTART_SCOPE");
    const char *gen = getenv("CDDP_GENERATION");
    r->in_place = scope && strcmp(scope, "worker") == 0 && r->world > 1;
    if (gen && *gen) {
        char *end;
        r->generation = strtol(gen, &end, 10);
        if (*end != '\0' || r->generation < 0)
            trn_refuse(CDDP_EXIT_USAGE, "CDDP_GENERATION='%s' is not an integer >= 0", gen);
    }
    if (!r->in_place)
        r->generation = 0;
}

/* A replacement re-forming in place takes every weight from a peer
 * (take_state): no initialisation, no --init to read. */
/* The backends written to the contract (nccl: never run on a GPU yet;
 * docs/distributed.md, "Recovering in place"). */
static bool backend_reforms(const char *comm)
{
    return comm != NULL && (strcmp(comm, "gloo") == 0 || strcmp(comm, "nccl") == 0);
}

/* nccl: the step's params and momentum are kept on the device (run.h). */
static bool device_redo(const struct run *r)
{
    return r->dev.comm != NULL && strcmp(r->dev.comm, "nccl") == 0 && r->be.ops->copy != NULL;
}

bool trn_inplace_replacement(const struct run *r)
{
    return r->in_place && r->generation > 0 && backend_reforms(r->dev.comm);
}

void trn_inplace_check_backend(struct run *r)
{
    if (r->in_place && r->dev.comm && !backend_reforms(r->dev.comm)) {
        /* (fail as under group, and the agent restarts the group) */
        log_warn("T6213",
                 "--restart_scope=worker: re-forming in place is not done on %s yet; a "
                 "failed collective exits 75 and the group restarts",
                 r->dev.comm);
        r->in_place = false;
        r->generation = 0;
    }
}

void trn_inplace_start(struct run *r)
{
    if (!r->in_place)
        return;
    r->redo.buffers = trn_malloc(r->model.num_buffers * sizeof(float) + 1);
    r->redo.nbt = trn_malloc((size_t)r->model.num_bn * sizeof(int64_t) + 1);
    if (device_redo(r)) {
        size_t bytes = r->model.num_params * sizeof(float);
        r->redo.params = r->be.ops->alloc(&r->be, bytes);
        r->redo.momentum = r->be.ops->alloc(&r->be, bytes);
        if (r->redo.params == NULL || r->redo.momentum == NULL)
            trn_fatal("--restart_scope=worker: out of device memory for the step's snapshot "
                      "(2 x %zu bytes)",
                      bytes);
    }
    r->redo.epoch = r->start.epoch;
    r->redo.b0 = r->start.first_batch;
    r->redo.step = r->start.step;
}

void trn_inplace_before_step(struct run *r, int epoch, long b0)
{
    if (!r->in_place)
        return;
    /* where to come back to if a collective of this step fails */
    r->redo.in_step = true;
    r->redo.epoch = epoch;
    r->redo.b0 = b0;
    r->redo.step = r->step;
    r->be.ops->to_host(&r->be, r->redo.buffers, r->model.buffers,
                       r->model.num_buffers * sizeof(float));
    memcpy(r->redo.nbt, r->model.num_batches_tracked, (size_t)r->model.num_bn * sizeof(int64_t));
    if (r->redo.params != NULL) {
        /* (stream-ordered device copies, before the step's optimizer) */
        size_t bytes = r->model.num_params * sizeof(float);
        r->be.ops->copy(&r->be, r->redo.params, r->model.params, bytes);
        r->be.ops->copy(&r->be, r->redo.momentum, r->model.momentum, bytes);
        r->redo.optimizer_steps = r->model.optimizer_steps;
        r->redo.growth_tracker = r->engine.scaler.growth_tracker;
        r->redo.scale = r->engine.scaler.scale;
    }
}

void trn_inplace_after_step(struct run *r, int epoch, long b1)
{
    if (!r->in_place)
        return;
    /* nccl: the step's collectives done on the device, or the failure
     * found while the step can still be undone (its waits returned at
     * once; gloo's were synchronous: a no-op) */
    if (r->redo.params != NULL)
        run_check_collective(r, trn_comm_sync(r->dist.comm));
    /* done: a later failure (a checkpoint's barrier) goes on after it */
    r->redo.in_step = false;
    r->redo.step = r->step;
    r->redo.epoch = b1 >= r->batches ? epoch + 1 : epoch;
    r->redo.b0 = b1 >= r->batches ? 0 : b1;
}

void trn_inplace_free(struct run *r)
{
    free(r->redo.buffers);
    free(r->redo.nbt);
    if (r->redo.params != NULL)
        r->be.ops->free(&r->be, r->redo.params);
    if (r->redo.momentum != NULL)
        r->be.ops->free(&r->be, r->redo.momentum);
    r->redo.params = r->redo.momentum = NULL;
}

void trn_inplace_failed(struct run *r, const struct trn_comm_error *e)
{
    /* (a peer that is gone, or a timeout whose missing ranks the agent was
     * told (blame.h); a timeout that names none: exit 75, and the agent
     * restarts the group) */
    if (!r->in_place || !r->recover_armed)
        return;
    r->failed_ns = cddp_mono_ns() - (uint64_t)(e->waited_s * 1e9);
    if (e->code == CDDP_EPEER) {
        char msg[1024];
        trn_comm_failure_message(e, r->in_step, r->rank, msg, sizeof(msg));
        log_warn("T6210", "%s; re-forming in place (--restart_scope=worker, generation %ld)", msg,
                 r->generation);
        r->recover_armed = false;
        longjmp(r->recover, 1);
    }
    if (trn_blame_missing(r, e)) {
        r->recover_armed = false;
        longjmp(r->recover, 1);
    }
}

/* Re-forming failed: exit 75 as a failed collective would (the agent then
 * restarts the whole group). */
static _Noreturn void reform_failed(const struct run *r, int code, const char *why)
{
    struct trn_comm_error e = {.code = code, .coll = TRN_COLL_BARRIER, .op = "re-form"};
    snprintf(e.detail, sizeof(e.detail), "%s", why);
    trn_comm_fail(&e, r->in_step, r->rank, r->env.error_file);
}

/* An FNV-1a over the momentum (64-bit words, as the model's checksum: a
 * byte at a time took 0.15-0.2 s of the recovery), the counters and the
 * scaler, added to the model's checksum: what the ranks compare after a
 * transfer. */
static uint64_t full_checksum(const struct run *r)
{
    const struct trn_resnet *m = &r->model;
    uint64_t h = trn_ddp_state_checksum(m);
    const float *mom = m->host_momentum ? m->host_momentum : m->momentum;
    const unsigned char *b = (const unsigned char *)mom;
    size_t nb = m->num_params * sizeof(float), i = 0;
    for (; i + 8 <= nb; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0x100000001b3ull;
    }
    for (; i < nb; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    int64_t more[3] = {m->optimizer_steps, r->engine.scaler.growth_tracker, r->step};
    b = (const unsigned char *)more;
    for (size_t k = 0; k < sizeof(more); k++)
        h = (h ^ b[k]) * 0x100000001b3ull;
    uint32_t sc;
    memcpy(&sc, &r->engine.scaler.scale, sizeof(sc));
    return (h ^ sc) * 0x100000001b3ull;
}

/* What each rank says of itself before the two big buffers (parameters,
 * momentum) move, with point to point (gloo): whether it needs them (a
 * replacement, or a survivor at another step than root's), and where its
 * own are, for a rank of its host to read them (cma.h): its host key (0:
 * not to be read), pid and the two addresses. */
struct holder {
    int64_t need, host, pid, params, momentum;
};
#define HOLDER_WORDS ((int)(sizeof(struct holder) / sizeof(int64_t)))

/* Every rank's struct holder (an allgather), or NULL without point to
 * point (nccl): a broadcast to every rank, as before. The ranks not in
 * need already hold root's parameters and momentum (the same steps'
 * reduced gradients made them); the checksum after the transfer proves it
 * (a survivor that does not: exit 75, and the group restarts). */
static struct holder *who_needs(struct run *r, bool needs, int root)
{
    struct trn_comm *comm = r->dist.comm;
    if (!trn_comm_has_p2p(comm))
        return NULL;
    const struct trn_resnet *m = &r->model;
    /* (host memory only: a device backend's are not the process' to read) */
    bool readable = m->host_params == NULL && m->host_momentum == NULL;
    struct holder mine = {
        .need = needs,
        .host = readable ? (int64_t)trn_cma_host_key() : 0,
        .pid = getpid(),
        .params = (int64_t)(uintptr_t)m->params,
        .momentum = (int64_t)(uintptr_t)m->momentum,
    };
    struct holder *all = trn_malloc((size_t)r->world * sizeof(*all));
    run_check_collective(r, trn_comm_allgather(comm, &mine, all, HOLDER_WORDS, TRN_COMM_I64));
    if (all[root].need) {
        /* (a replacement not yet re-formed when the next generation came:
         * nobody holds a state to give) */
        char why[128];
        snprintf(why, sizeof(why), "rank %d, the state's source, is itself a replacement", root);
        reform_failed(r, CDDP_ESTATE, why);
    }
    return all;
}

/* The rank rank i takes the big buffers from: the lowest rank not in need
 * on i's host, whose memory i reads; else root, over the network. */
static int source_of(const struct holder *h, int world, int i, int root)
{
    for (int j = 0; h[i].host != 0 && j < world; j++)
        if (!h[j].need && h[j].host == h[i].host)
            return j;
    return root;
}

static bool same_host(const struct holder *h, int a, int b)
{
    return h[a].host != 0 && h[a].host == h[b].host;
}

/* The source's side for rank i: on one host, let i read and wait for its
 * word (1: it has them); else, or when it could not, send both. True when
 * they went over the network. */
static bool serve(struct run *r, const struct holder *h, int i)
{
    struct trn_comm *comm = r->dist.comm;
    size_t n = r->model.num_params;
    if (same_host(h, r->rank, i)) {
        uint8_t go = 1, got = 0;
        trn_cma_allow((int)h[i].pid);
        run_check_collective(r, trn_comm_send(comm, &go, 1, TRN_COMM_U8, i));
        run_check_collective(r, trn_comm_recv(comm, &got, 1, TRN_COMM_U8, i));
        trn_cma_allow(0);
        if (got)
            return false;
    }
    run_check_collective(r, trn_comm_send(comm, r->model.params, n, TRN_COMM_F32, i));
    run_check_collective(r, trn_comm_send(comm, r->model.momentum, n, TRN_COMM_F32, i));
    return true;
}

/* The receiver's side, from rank s: read s's memory on one host (one
 * copy), saying whether it worked; else, or when it did not, receive both
 * over the network. True when they came over the network. */
static bool fetch(struct run *r, const struct holder *h, int s)
{
    struct trn_comm *comm = r->dist.comm;
    size_t n = r->model.num_params;
    if (same_host(h, r->rank, s)) {
        uint8_t go = 0, got;
        run_check_collective(r, trn_comm_recv(comm, &go, 1, TRN_COMM_U8, s));
        int rc = trn_fault_nocma(&r->cfg.fault, r->rank) ? -EPERM : 0;
        if (rc == 0)
            rc = trn_cma_read((int)h[s].pid, r->model.params, (uint64_t)h[s].params,
                              n * sizeof(float));
        if (rc == 0)
            rc = trn_cma_read((int)h[s].pid, r->model.momentum, (uint64_t)h[s].momentum,
                              n * sizeof(float));
        got = rc == 0;
        if (!got)
            log_warn("T6224",
                     "generation %ld: reading rank %d's parameters from its memory on this "
                     "host failed (%s): they come over the network instead",
                     r->generation, s, strerror(-rc));
        run_check_collective(r, trn_comm_send(comm, &got, 1, TRN_COMM_U8, s));
        if (got)
            return false;
    }
    run_check_collective(r, trn_comm_recv(comm, r->model.params, n, TRN_COMM_F32, s));
    run_check_collective(r, trn_comm_recv(comm, r->model.momentum, n, TRN_COMM_F32, s));
    return true;
}

/* The parameters and momentum to the ranks in need: each from the lowest
 * rank not in need on its host (a read of that rank's memory), else from
 * root over the network (a source serves its ranks in rank order); or a
 * broadcast of each (h NULL). *local and *net: how many ranks took them
 * each way (as planned, but for a read that failed on this rank's side:
 * it fell back to the network). */
static void give(struct run *r, const struct holder *h, int root, int *local, int *net)
{
    struct trn_comm *comm = r->dist.comm;
    struct trn_resnet *m = &r->model;
    *local = *net = 0;
    if (h == NULL) {
        run_check_collective(
            r, trn_comm_broadcast(comm, m->params, m->num_params, TRN_COMM_F32, root));
        run_check_collective(
            r, trn_comm_broadcast(comm, m->momentum, m->num_params, TRN_COMM_F32, root));
        *net = r->world - 1;
        return;
    }
    for (int i = 0; i < r->world; i++) {
        if (!h[i].need)
            continue;
        int s = source_of(h, r->world, i, root);
        bool planned = same_host(h, s, i), over_net = !planned;
        if (r->rank == s)
            over_net = serve(r, h, i);
        else if (r->rank == i)
            over_net = fetch(r, h, s);
        if (over_net)
            ++*net;
        else
            ++*local;
    }
}

/* Every rank takes root's state: broadcasts of the position (step, epoch,
 * first batch of the step to run; the sampler's order follows from the
 * epoch and the seed), the buffers and BN counters, the optimizer's step
 * count and the loss scaler; the parameters and momentum from root to the
 * replacements only (fresh: this rank is one; who_needs); then every rank
 * checks it holds the same (one checksum). A rank whose step was cut short
 * first puts back the buffers from before it. The step in progress is then
 * run again by every rank (its partial gradients are dropped: the next
 * backward starts them afresh). */
static void take_state(struct run *r, int root, bool fresh)
{
    struct trn_resnet *m = &r->model;
    struct trn_backend *be = &r->be;
    struct trn_comm *comm = r->dist.comm;
    if (r->redo.in_step) {
        be->ops->to_device(be, m->buffers, r->redo.buffers, m->num_buffers * sizeof(float));
        memcpy(m->num_batches_tracked, r->redo.nbt, (size_t)m->num_bn * sizeof(int64_t));
        if (r->redo.params != NULL) {
            /* (nccl: the optimizer may have run over partly reduced gradients) */
            be->ops->copy(be, m->params, r->redo.params, m->num_params * sizeof(float));
            be->ops->copy(be, m->momentum, r->redo.momentum, m->num_params * sizeof(float));
            m->optimizer_steps = r->redo.optimizer_steps;
            r->engine.scaler.growth_tracker = r->redo.growth_tracker;
            r->engine.scaler.scale = r->redo.scale;
        }
        r->redo.in_step = false;
    }
    int64_t pos[5] = {r->redo.step, r->redo.epoch, r->redo.b0, m->optimizer_steps,
                      r->engine.scaler.growth_tracker};
    float scale = r->engine.scaler.scale;
    int64_t own_step = pos[0], own_opt_steps = pos[3];
    run_check_collective(r, trn_comm_broadcast(comm, pos, 5, TRN_COMM_I64, root));
    trn_fault_reform(&r->cfg.fault, r->rank, r->generation); /* (--fault crash@reform) */
    /* A survivor at another step than root's (it finished the failed
     * step's reductions and its optimizer step, root did not, or the
     * reverse) needs the weights too. */
    bool elsewhere = pos[0] != own_step || pos[3] != own_opt_steps;
    struct holder *h = who_needs(r, fresh || elsewhere, root);
    /* (broadcasts, small: each rank's BN statistics are its own forward's
     * until the next step's forward takes rank 0's, as torch's DDP does) */
    run_check_collective(r,
                         trn_comm_broadcast(comm, m->buffers, m->num_buffers, TRN_COMM_F32, root));
    run_check_collective(
        r, trn_comm_broadcast(comm, m->num_batches_tracked, (size_t)m->num_bn, TRN_COMM_I64, root));
    run_check_collective(r, trn_comm_broadcast(comm, &scale, 1, TRN_COMM_F32, root));
    int local, net;
    give(r, h, root, &local, &net);
    bool p2p = h != NULL;
    free(h);
    r->step = (long)pos[0];
    r->start.step = r->step;
    r->start.epoch = (int)pos[1];
    r->start.first_batch = (long)pos[2];
    m->optimizer_steps = (long)pos[3];
    r->engine.scaler.growth_tracker = (long)pos[4];
    r->engine.scaler.scale = scale;
    r->redo.step = r->step;
    r->redo.epoch = r->start.epoch;
    r->redo.b0 = r->start.first_batch;
    trn_resnet_pull(m); /* the host copies the checksum reads (a device backend) */
    uint64_t sum = full_checksum(r);
    int64_t v = (int64_t)sum;
    if (trn_ddp_check_same(&r->ddp, &v, 1) != 0)
        reform_failed(r, CDDP_EMISMATCH, "the ranks hold different states after the transfer");
    log_info("T6212",
             "generation %ld: state from rank %d, checksum %016" PRIx64
             "; running step %ld (epoch %d, batch %ld); weights %s: %d rank%s read them from a "
             "peer's memory on their host, %d took them over the network",
             r->generation, root, sum, r->step, r->start.epoch, r->start.first_batch,
             p2p ? "point to point" : "broadcast", local, local == 1 ? "" : "s", net);
}

/* The new communicator in place of the old one, wherever it is held. */
static void reformed(struct run *r)
{
    r->ddp.comm = r->dist.comm;
    trn_comm_set_watchdog_exit(r->dist.comm, run_watchdog_exit, r);
}

/* The first generation after `after` (bounded by --init-timeout), and
 * the group re-formed in it; root: the rank the state comes from. A
 * failure exits 75 (reform_failed). */
static long meet(struct run *r, long after, int *root)
{
    char err[4096];
    long gen;
    uint64_t t0 = cddp_mono_ns();
    int rc = trn_dist_wait_generation(&r->dist, after, r->cfg.init_timeout, &gen, root, err,
                                      sizeof(err));
    uint64_t t1 = cddp_mono_ns();
    if (rc == 0)
        rc = trn_dist_reform(&r->dist, &r->dopts, gen, err, sizeof(err));
    if (rc)
        reform_failed(r, rc, err);
    /* (the recovery's timeline: docs/benchmarks.md) */
    log_debug("T6223", "generation %ld: announced after %.3f s, group connected %.3f s later", gen,
              (double)(t1 - t0) * 1e-9, (double)(cddp_mono_ns() - t1) * 1e-9);
    r->generation = gen;
    return gen;
}

/* A replacement (CDDP_GENERATION > 0): connected to the agent's store
 * only; it meets the survivors under the generation's keys and takes the
 * state, without the start-up checks the survivors made long ago. */
void trn_inplace_rejoin(struct run *r)
{
    char err[4096];
    uint64_t t0 = cddp_mono_ns();
    int root;
    long gen = meet(r, r->generation - 1, &root);
    struct trn_ddp_options ddo = {
        .bucket_cap_mb = r->cfg.bucket_cap_mb,
        .overlap = r->cfg.overlap,
        .sync_bn = r->cfg.sync_bn,
        .bf16_grads = r->cfg.grad_reduce == TRN_GRAD_REDUCE_BF16,
    };
    if (trn_ddp_init(&r->ddp, &r->model, r->dist.comm, &ddo, run_collective_failed, r, err,
                     sizeof(err)))
        trn_fatal("%s", err);
    reformed(r);
    take_state(r, root, true);
    log_info("T6211", "rank %d replaced in generation %ld: joined the group in %.3f s", r->rank,
             gen, (double)(cddp_mono_ns() - t0) * 1e-9);
}

/* A survivor, back from a failed collective in the training loop: the old
 * communicator goes, the agent's next generation comes (bounded by
 * --init-timeout), the group re-forms and every rank takes the state;
 * training goes on from the step that failed. Anything failing here exits
 * 75, and the agent restarts the whole group. */
void trn_inplace_recover(struct run *r)
{
    uint64_t t0 = cddp_mono_ns();
    trn_input_stop(&r->input);
    if (trn_comm_on_device(r->dist.comm)) {
        /* nccl: abort now (the stuck kernels return; no finalize waiting
         * on the dead peer), not after the wait for the generation */
        trn_comm_abort(r->dist.comm);
        r->dist.comm = NULL;
        r->ddp.comm = NULL;
    }
    int root;
    long gen = meet(r, r->generation, &root);
    reformed(r);
    take_state(r, root, false);
    uint64_t now = cddp_mono_ns();
    log_info("T6211",
             "rank %d re-formed generation %ld in %.3f s (%.3f s after the failed "
             "collective began)",
             r->rank, gen, (double)(now - t0) * 1e-9, (double)(now - r->failed_ns) * 1e-9);
}
