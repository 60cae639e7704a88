/*
 * comm.c: the backend-neutral half of the communicator (see comm.h).
 *
 * Argument checks, world size 1 ("local": no peers, so a collective is a copy
 * or nothing), the first error and the broken state live here, so every
 * backend behaves the same to the training loop.
 */
#include "trainer/comm/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h" /* CDDP_HAVE_NCCL */

#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/strutil.h"
#include "trainer/comm/backend.h"

struct trn_comm {
    int rank;
    int world;
    double timeout_s;
    const struct trn_comm_backend_ops *be; /* NULL: local (world 1) */
    void *impl;
    bool broken;
    bool on_device;            /* nccl (world 1 included: the trainer passes device memory) */
    void *cuda_stream;         /* world 1 on the device: the allgather's copy is ordered on it */
    long step;                 /* trn_comm_set_step */
    uint64_t wait_ns;          /* trn_comm_wait_ns */
    struct trn_comm_error err; /* the first failure */
};

static const char *const coll_names[] = {
    [TRN_COLL_BROADCAST] = "broadcast", [TRN_COLL_ALLREDUCE] = "allreduce",
    [TRN_COLL_ALLGATHER] = "allgather", [TRN_COLL_BARRIER] = "barrier",
    [TRN_COLL_SEND] = "send",           [TRN_COLL_RECV] = "recv",
};

const char *trn_comm_coll_name(enum trn_comm_coll coll)
{
    if ((unsigned)coll < sizeof(coll_names) / sizeof(coll_names[0]))
        return coll_names[coll];
    return "collective";
}

size_t trn_comm_dtype_size(enum trn_comm_dtype dt)
{
    switch (dt) {
    case TRN_COMM_F32:
    case TRN_COMM_I32:
        return 4;
    case TRN_COMM_F64:
    case TRN_COMM_I64:
        return 8;
    case TRN_COMM_U8:
        return 1;
    case TRN_COMM_BF16:
        return 2;
    }
    return 0;
}

int trn_comm_rank(const struct trn_comm *c)
{
    return c->rank;
}

int trn_comm_world(const struct trn_comm *c)
{
    return c->world;
}

const char *trn_comm_backend(const struct trn_comm *c)
{
    return c->be ? c->be->name : "local";
}

double trn_comm_timeout(const struct trn_comm *c)
{
    return c->timeout_s;
}

bool trn_comm_has_p2p(const struct trn_comm *c)
{
    return c->be != NULL && c->be->p2p;
}

bool trn_comm_on_device(const struct trn_comm *c)
{
    return c->be ? c->be->on_device : c->on_device; /* gloo moves host memory */
}

void trn_comm_set_watchdog_exit(struct trn_comm *c, trn_comm_exit_fn fn, void *arg)
{
    if (c->be != NULL && c->be->set_exit != NULL)
        c->be->set_exit(c->impl, fn, arg);
}

int trn_comm_missing(struct trn_comm *c, double budget_s, int *out, int max)
{
    if (c == NULL || c->be == NULL || c->be->missing == NULL || c->err.code != CDDP_ETIMEOUT ||
        c->err.seq == 0)
        return -1;
    return c->be->missing(c->impl, c->err.seq, budget_s, out, max);
}

const struct trn_comm_error *trn_comm_last_error(const struct trn_comm *c)
{
    return &c->err;
}

int trn_comm_create(const struct trn_comm_options *o, struct trn_kv *kv, struct trn_comm **out,
                    struct trn_comm_error *err)
{
    memset(err, 0, sizeof(*err));
    cddp_strlcpy(err->op, "connect", sizeof(err->op));
    *out = NULL;
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world) {
        err->code = CDDP_ERANGE_ARG;
        snprintf(err->detail, sizeof(err->detail), "rank %d is not in 0..%d", o->rank,
                 o->world - 1);
        return err->code;
    }
    struct trn_comm *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        err->code = CDDP_ERR_FROM_ERRNO(ENOMEM);
        cddp_strlcpy(err->detail, "out of memory", sizeof(err->detail));
        return err->code;
    }
    c->rank = o->rank;
    c->world = o->world;
    c->timeout_s = o->timeout_s > 0 ? o->timeout_s : TRN_COMM_DEFAULT_TIMEOUT_S;
    c->step = -1;
    bool nccl = o->backend != NULL && strcmp(o->backend, "nccl") == 0;
#if CDDP_HAVE_NCCL
    /* World size 1 stays "local" (no peers, no communicator), but its
     * buffers are the device memory the trainer would give NCCL. */
    c->on_device = nccl;
    c->cuda_stream = o->cuda_stream;
#endif
    if (o->world > 1) {
        const char *name = o->backend ? o->backend : "gloo";
        int rc;
        uint64_t t0 = cddp_mono_ns();
        if (strcmp(name, "gloo") == 0) {
            rc = trn_gloo_backend_create(o, kv, c->timeout_s, &c->be, &c->impl, err->detail,
                                         sizeof(err->detail));
        } else if (nccl) {
#if CDDP_HAVE_NCCL
            rc = trn_nccl_backend_create(o, kv, c->timeout_s, &c->be, &c->impl, err->detail,
                                         sizeof(err->detail));
#else
            rc = CDDP_ECONFIG;
            snprintf(err->detail, sizeof(err->detail),
                     "comm backend 'nccl': this build has no NCCL (CUDA and NCCL were not found "
                     "when it was configured)");
#endif
        } else {
            rc = CDDP_ECONFIG;
            snprintf(err->detail, sizeof(err->detail), "unknown comm backend '%s' (have: gloo%s)",
                     name, CDDP_HAVE_NCCL ? ", nccl" : "");
        }
        if (rc < 0) {
            err->code = rc;
            err->waited_s = (double)(cddp_mono_ns() - t0) * 1e-9;
            err->timeout_s = o->init_timeout_s;
            free(c);
            return rc;
        }
        log_info("T6001", "rank %d/%d connected (%s) in %.3f s", o->rank, o->world, name,
                 (double)(cddp_mono_ns() - t0) * 1e-9);
    }
    *out = c;
    return 0;
}

void trn_comm_destroy(struct trn_comm *c)
{
    if (c == NULL)
        return;
    if (c->be)
        c->be->destroy(c->impl);
    free(c);
}

void trn_comm_abort(struct trn_comm *c)
{
    if (c == NULL)
        return;
    if (c->be && c->be->abort)
        c->be->abort(c->impl);
    else if (c->be)
        c->be->destroy(c->impl);
    free(c);
}

static bool redop_ok(enum trn_comm_dtype dt, enum trn_comm_redop op)
{
    switch (op) {
    case TRN_COMM_SUM:
    case TRN_COMM_MAX:
    case TRN_COMM_MIN:
        return true;
    case TRN_COMM_AVG:
        return dt == TRN_COMM_F32 || dt == TRN_COMM_F64 || dt == TRN_COMM_BF16;
    }
    return false;
}

static void record(struct trn_comm *c, const struct trn_comm_work *w, int rc)
{
    c->broken = true;
    if (c->err.code != 0)
        return;
    c->err.code = rc;
    c->err.coll = w->coll;
    cddp_strlcpy(c->err.op, trn_comm_coll_name(w->coll), sizeof(c->err.op));
    c->err.bytes = w->count * trn_comm_dtype_size(w->dtype);
    c->err.waited_s = w->end_ns > w->start_ns ? (double)(w->end_ns - w->start_ns) * 1e-9 : 0.0;
    c->err.timeout_s = c->timeout_s;
    cddp_strlcpy(c->err.detail, w->detail, sizeof(c->err.detail));
    c->err.seq = w->seq;
}

/* World size 1: the result is already in place (allgather: one copy, on
 * the compute stream when the buffers are device memory). */
static void run_local(struct trn_comm *c, struct trn_comm_work *w)
{
    w->rc = 0;
    if (w->coll == TRN_COLL_ALLGATHER && w->send != w->buf) {
        size_t bytes = w->count * trn_comm_dtype_size(w->dtype);
#if CDDP_HAVE_NCCL
        if (c->on_device)
            w->rc = trn_nccl_copy(w->buf, w->send, bytes, c->cuda_stream);
        else
#endif
            memmove(w->buf, w->send, bytes);
    }
    (void)c;
    w->state = TRN_WORK_DONE;
}

void trn_comm_set_step(struct trn_comm *c, long step)
{
    c->step = step;
}

static int start(struct trn_comm *c, struct trn_comm_work *w, int bucket)
{
    if (c->broken) {
        snprintf(w->detail, sizeof(w->detail), "communicator unusable after an earlier %s failed",
                 c->err.op);
        return CDDP_ESTATE;
    }
    if (trn_comm_dtype_size(w->dtype) == 0 ||
        (w->coll == TRN_COLL_ALLREDUCE && !redop_ok(w->dtype, w->redop)))
        return CDDP_ERANGE_ARG;
    bool p2p = w->coll == TRN_COLL_SEND || w->coll == TRN_COLL_RECV;
    if (p2p && !trn_comm_has_p2p(c))
        return CDDP_ERR_FROM_ERRNO(ENOTSUP);
    if ((w->coll == TRN_COLL_BROADCAST || p2p) && (w->root < 0 || w->root >= c->world))
        return CDDP_ERANGE_ARG;
    if (p2p && w->root == c->rank)
        return CDDP_ERANGE_ARG;
    if (w->count > 0 && (w->coll == TRN_COLL_SEND ? w->send == NULL : w->buf == NULL))
        return CDDP_ERANGE_ARG;
    w->next = NULL;
    w->rc = 0;
    w->start_ns = w->end_ns = 0;
    w->detail[0] = '\0';
    w->bucket = bucket;
    w->step = c->step;
    w->seq = 0;
    /* Nothing to move: every rank (both ends of a send) skips it alike, so
     * the order is kept. */
    if (c->be == NULL || (w->count == 0 && w->coll != TRN_COLL_BARRIER)) {
        run_local(c, w);
        return w->rc;
    }
    w->state = TRN_WORK_QUEUED;
    int rc = c->be->start(c->impl, w);
    if (rc < 0)
        w->state = TRN_WORK_IDLE;
    return rc;
}

int trn_comm_wait(struct trn_comm *c, struct trn_comm_work *w)
{
    int rc = w->rc;
    if (w->state != TRN_WORK_DONE) {
        uint64_t t0 = cddp_mono_ns();
        rc = c->be->wait(c->impl, w);
        c->wait_ns += cddp_mono_ns() - t0;
    }
    w->state = TRN_WORK_IDLE;
    if (rc < 0)
        record(c, w, rc);
    return rc;
}

int trn_comm_sync(struct trn_comm *c)
{
    if (c->broken)
        return c->err.code < 0 ? c->err.code : CDDP_ESTATE;
    if (c->be == NULL || c->be->sync == NULL)
        return 0;
    struct trn_comm_work w = {.coll = TRN_COLL_BARRIER, .dtype = TRN_COMM_U8};
    w.start_ns = cddp_mono_ns();
    int rc = c->be->sync(c->impl, &w);
    w.end_ns = cddp_mono_ns();
    if (rc < 0)
        record(c, &w, rc);
    return rc;
}

uint64_t trn_comm_wait_ns(const struct trn_comm *c)
{
    return c->wait_ns;
}

static int run_sync(struct trn_comm *c, struct trn_comm_work *w)
{
    int rc = start(c, w, -1);
    return rc < 0 ? rc : trn_comm_wait(c, w);
}

int trn_comm_allreduce_start_bucket(struct trn_comm *c, struct trn_comm_work *w, void *buf,
                                    size_t count, enum trn_comm_dtype dt, enum trn_comm_redop op,
                                    int bucket)
{
    memset(w, 0, sizeof(*w));
    w->coll = TRN_COLL_ALLREDUCE;
    w->buf = buf;
    w->count = count;
    w->dtype = dt;
    w->redop = op;
    return start(c, w, bucket < 0 ? -1 : bucket);
}

int trn_comm_allreduce_start(struct trn_comm *c, struct trn_comm_work *w, void *buf, size_t count,
                             enum trn_comm_dtype dt, enum trn_comm_redop op)
{
    return trn_comm_allreduce_start_bucket(c, w, buf, count, dt, op, -1);
}

int trn_comm_allreduce(struct trn_comm *c, void *buf, size_t count, enum trn_comm_dtype dt,
                       enum trn_comm_redop op)
{
    struct trn_comm_work w = {
        .coll = TRN_COLL_ALLREDUCE, .buf = buf, .count = count, .dtype = dt, .redop = op};
    return run_sync(c, &w);
}

int trn_comm_broadcast(struct trn_comm *c, void *buf, size_t count, enum trn_comm_dtype dt,
                       int root)
{
    struct trn_comm_work w = {
        .coll = TRN_COLL_BROADCAST, .buf = buf, .count = count, .dtype = dt, .root = root};
    return run_sync(c, &w);
}

int trn_comm_allgather(struct trn_comm *c, const void *send, void *recv, size_t count,
                       enum trn_comm_dtype dt)
{
    if (count > 0 && send == NULL)
        return CDDP_ERANGE_ARG;
    struct trn_comm_work w = {
        .coll = TRN_COLL_ALLGATHER, .buf = recv, .send = send, .count = count, .dtype = dt};
    return run_sync(c, &w);
}

int trn_comm_barrier(struct trn_comm *c)
{
    struct trn_comm_work w = {.coll = TRN_COLL_BARRIER, .dtype = TRN_COMM_U8};
    return run_sync(c, &w);
}

int trn_comm_send(struct trn_comm *c, const void *buf, size_t count, enum trn_comm_dtype dt,
                  int peer)
{
    struct trn_comm_work w = {
        .coll = TRN_COLL_SEND, .send = buf, .count = count, .dtype = dt, .root = peer};
    return run_sync(c, &w);
}

int trn_comm_recv(struct trn_comm *c, void *buf, size_t count, enum trn_comm_dtype dt, int peer)
{
    struct trn_comm_work w = {
        .coll = TRN_COLL_RECV, .buf = buf, .count = count, .dtype = dt, .root = peer};
    return run_sync(c, &w);
}
