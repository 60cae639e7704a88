/*
 * ddp.c: DDP and SyncBatchNorm over the communicator (see ddp.h). The
 * decisions (which bucket, when) are buckets.c's; this file carries them
 * out: hooks from resnet.c in, collectives out.
 */
#include "trainer/ddp.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/errors.h"
#include "common/log.h"
#include "trainer/fatal.h"

/* A collective failed: the trainer's failure path (error file, exit 75). */
static _Noreturn void comm_failed(struct trn_ddp *d)
{
    const struct trn_comm_error *e = trn_comm_last_error(d->comm);
    if (d->fail)
        d->fail(d->fail_arg, e);
    trn_fatal("ddp: %s failed: %s", e->op, e->detail);
}

static void must(struct trn_ddp *d, int rc)
{
    if (rc < 0)
        comm_failed(d);
}

/* ---- gradient buckets ---- */

/* Starts bucket b's allreduce (AVG). --grad-reduce-dtype bf16: the
 * bucket cast into its slice of the bf16 scratch first (queued on the
 * compute stream, so the communicator's stream waits for it too). */
static void launch(struct trn_ddp *d, int b)
{
    const struct trn_bucket *k = &d->plan.buckets[b];
    float *g = d->m->grads + k->off;
    if (d->bf16) {
        struct trn_backend *be = d->m->be;
        uint16_t *h = d->bf16 + k->off;
        be->ops->cast_f32_to_bf16(be, g, h, k->numel);
        must(d, trn_comm_allreduce_start_bucket(d->comm, &d->work[b], h, k->numel, TRN_COMM_BF16,
                                                TRN_COMM_AVG, b));
    } else {
        must(d, trn_comm_allreduce_start_bucket(d->comm, &d->work[b], g, k->numel, TRN_COMM_F32,
                                                TRN_COMM_AVG, b));
    }
    d->launched = b + 1;
    d->stats.allreduces++;
    d->stats.bytes += (double)k->numel * (d->bf16 ? sizeof(uint16_t) : sizeof(float));
}

/* Waits for bucket b (on the device: the compute stream waits), and with
 * bf16 casts the averaged bucket back into the fp32 gradients. */
static void await_bucket(struct trn_ddp *d, int b)
{
    must(d, trn_comm_wait(d->comm, &d->work[b]));
    if (d->bf16) {
        const struct trn_bucket *k = &d->plan.buckets[b];
        struct trn_backend *be = d->m->be;
        be->ops->cast_bf16_to_f32(be, d->bf16 + k->off, d->m->grads + k->off, k->numel);
    }
}

static void on_grad_ready(void *arg, size_t off, size_t numel)
{
    struct trn_ddp *d = arg;
    if (!d->sync)
        return;
    int first, n;
    int rc = trn_bucket_ready_mark(&d->ready, off, numel, &first, &n);
    TRN_CHECK(rc == 0, "ddp: gradient [%zu, %zu) marked ready: %s", off, off + numel,
              rc == CDDP_EEXISTS ? "twice in one backward" : "not whole parameters");
    if (!d->opt.overlap)
        return;
    for (int b = first; b < first + n; b++)
        launch(d, b);
}

void trn_ddp_begin_backward(struct trn_ddp *d, bool sync)
{
    d->sync = sync && d->world > 1;
    d->launched = 0;
    trn_bucket_ready_reset(&d->ready);
}

void trn_ddp_finish_backward(struct trn_ddp *d)
{
    if (!d->sync)
        return;
    size_t missing = 0;
    if (trn_bucket_ready_finish(&d->ready, &missing) != 0)
        trn_fatal("ddp: backward ended without a gradient for %s", d->tensor_names[missing]);
    uint64_t t0 = cddp_mono_ns();
    for (int b = d->launched; b < d->plan.n_buckets; b++)
        launch(d, b);
    for (int b = 0; b < d->plan.n_buckets; b++)
        await_bucket(d, b);
    d->stats.wait_s += (double)(cddp_mono_ns() - t0) * 1e-9;
    d->stats.backwards++;
    d->sync = false;
}

/* ---- SyncBatchNorm ---- */

/*
 * All ranks' statistics for one batch norm: each rank contributes
 * [mean (C), var (C), count], all-gathered, then merged per channel in rank
 * order with Chan et al.'s formula (trn_bn_merge_stats, as
 * batch_norm_gather_stats_with_counts), in double. On the device the blocks
 * are packed and gathered there and read back once (ddp.h). mean, var (biased) and count are
 * replaced by the global ones.
 */
static void on_bn_stats(void *arg, const struct trn_bn_layer *bn, float *mean, float *var,
                        double *count)
{
    struct trn_ddp *d = arg;
    int c = bn->c, w = d->world;
    size_t per = 2 * (size_t)c + 1;
    float *all = d->bn_buf, *mine = all + (size_t)d->rank * per;
    struct trn_backend *be = d->m->be;
    if (d->on_device) {
        /* pack on the device, gather there, read the blocks back once */
        float *dmine = d->bn_dev + (size_t)d->rank * per, n = (float)*count;
        be->ops->copy(be, dmine, mean, (size_t)c * sizeof(float));
        be->ops->copy(be, dmine + c, var, (size_t)c * sizeof(float));
        be->ops->to_device(be, dmine + 2 * c, &n, sizeof(float));
        must(d, trn_comm_allgather(d->comm, dmine, d->bn_dev, per, TRN_COMM_F32));
        be->ops->to_host(be, all, d->bn_dev, (size_t)w * per * sizeof(float));
    } else {
        be->ops->to_host(be, mine, mean, (size_t)c * sizeof(float));
        be->ops->to_host(be, mine + c, var, (size_t)c * sizeof(float));
        mine[2 * c] = (float)*count;
        must(d, trn_comm_allgather(d->comm, mine, all, per, TRN_COMM_F32));
    }
    d->stats.bn_exchanges++;
    /* The merged values go after the gathered blocks. */
    float *gm = d->bn_buf + (size_t)w * per, *gv = gm + c;
    double total = trn_bn_merge_stats(all, w, c, gm, gv);
    be->ops->to_device(be, mean, gm, (size_t)c * sizeof(float));
    be->ops->to_device(be, var, gv, (size_t)c * sizeof(float));
    *count = total;
}

/* Backward: sum_dy and sum_dy_xmu summed over every rank (one allreduce of 2C). */
static void on_bn_grads(void *arg, const struct trn_bn_layer *bn, float *sum_dy, float *sum_dy_xmu)
{
    struct trn_ddp *d = arg;
    int c = bn->c;
    struct trn_backend *be = d->m->be;
    if (sum_dy_xmu == sum_dy + c && (be->device == TRN_DEVICE_CPU || d->on_device)) {
        /* in place, host memory on the CPU, device memory in stream order on CUDA */
        must(d, trn_comm_allreduce(d->comm, sum_dy, 2 * (size_t)c, TRN_COMM_F32, TRN_COMM_SUM));
    } else if (d->on_device) {
        size_t bytes = (size_t)c * sizeof(float);
        be->ops->copy(be, d->bn_dev, sum_dy, bytes);
        be->ops->copy(be, d->bn_dev + c, sum_dy_xmu, bytes);
        must(d, trn_comm_allreduce(d->comm, d->bn_dev, 2 * (size_t)c, TRN_COMM_F32, TRN_COMM_SUM));
        be->ops->copy(be, sum_dy, d->bn_dev, bytes);
        be->ops->copy(be, sum_dy_xmu, d->bn_dev + c, bytes);
    } else {
        float *buf = d->bn_buf;
        be->ops->to_host(be, buf, sum_dy, (size_t)c * sizeof(float));
        be->ops->to_host(be, buf + c, sum_dy_xmu, (size_t)c * sizeof(float));
        must(d, trn_comm_allreduce(d->comm, buf, 2 * (size_t)c, TRN_COMM_F32, TRN_COMM_SUM));
        be->ops->to_device(be, sum_dy, buf, (size_t)c * sizeof(float));
        be->ops->to_device(be, sum_dy_xmu, buf + c, (size_t)c * sizeof(float));
    }
    d->stats.bn_exchanges++;
}

/* ---- set-up ---- */

/* On a CUDA device with several ranks: a device communicator is required,
 * and the device scratch (SyncBN, the bf16 buckets) is allocated. */
static int device_buffers(struct trn_ddp *d, size_t bn_floats, char *err, size_t errlen)
{
    struct trn_backend *be = d->m->be;
    if (d->world == 1)
        return 0;
    d->on_device = be->device == TRN_DEVICE_CUDA && trn_comm_on_device(d->comm);
    if (be->device == TRN_DEVICE_CUDA && !d->on_device) {
        snprintf(err, errlen,
                 "ddp: the gradients are in CUDA device memory, and the %s communicator moves "
                 "host memory (use --backend nccl)",
                 trn_comm_backend(d->comm));
        return CDDP_ECONFIG;
    }
    if (d->opt.bf16_grads && !d->on_device) {
        snprintf(err, errlen,
                 "ddp: --grad-reduce-dtype bf16 needs CUDA and the nccl communicator, not %s",
                 trn_comm_backend(d->comm));
        return CDDP_ECONFIG;
    }
    if (!d->on_device)
        return 0;
    TRN_CHECK(be->ops->copy && be->ops->cast_f32_to_bf16 && be->ops->cast_bf16_to_f32,
              "ddp: the %s backend lacks the device copy and casts", be->ops->name);
    d->bn_dev = be->ops->alloc(be, bn_floats * sizeof(float));
    if (d->opt.bf16_grads)
        d->bf16 = be->ops->alloc(be, d->m->num_params * sizeof(uint16_t));
    if (!d->bn_dev || (d->opt.bf16_grads && !d->bf16)) {
        snprintf(err, errlen, "ddp: out of device memory for the reduction scratch (%zu bytes)",
                 bn_floats * sizeof(float) +
                     (d->opt.bf16_grads ? d->m->num_params * sizeof(uint16_t) : 0));
        return CDDP_ERR_FROM_ERRNO(ENOMEM);
    }
    return 0;
}

int trn_ddp_init(struct trn_ddp *d, struct trn_resnet *m, struct trn_comm *comm,
                 const struct trn_ddp_options *o,
                 void (*fail)(void *arg, const struct trn_comm_error *e), void *fail_arg, char *err,
                 size_t errlen)
{
    memset(d, 0, sizeof(*d));
    d->m = m;
    d->comm = comm;
    d->rank = trn_comm_rank(comm);
    d->world = trn_comm_world(comm);
    d->opt = *o;
    if (d->opt.bucket_cap_mb <= 0)
        d->opt.bucket_cap_mb = TRN_DEFAULT_BUCKET_CAP_MB;
    d->fail = fail;
    d->fail_arg = fail_arg;

    size_t n = 0;
    for (size_t i = 0; i < m->n_state; i++)
        n += m->state[i].kind == TRN_STATE_PARAM;
    size_t *off = trn_calloc(n ? n : 1, sizeof(size_t));
    size_t *numel = trn_calloc(n ? n : 1, sizeof(size_t));
    d->tensor_names = trn_calloc(n ? n : 1, sizeof(char *));
    for (size_t i = 0, k = 0; i < m->n_state; i++)
        if (m->state[i].kind == TRN_STATE_PARAM) {
            off[k] = m->state[i].off;
            numel[k] = m->state[i].numel;
            d->tensor_names[k++] = m->state[i].name;
        }
    size_t cap = (size_t)(d->opt.bucket_cap_mb * 1024.0 * 1024.0);
    if (cap < sizeof(float))
        cap = sizeof(float);
    size_t first = cap < TRN_FIRST_BUCKET_BYTES ? cap : TRN_FIRST_BUCKET_BYTES;
    int rc = trn_bucket_plan_build(&d->plan, off, numel, n, sizeof(float), first, cap);
    free(off);
    free(numel);
    if (rc == 0)
        rc = trn_bucket_ready_init(&d->ready, &d->plan);
    if (rc) {
        snprintf(err, errlen, "ddp: cannot plan the gradient buckets: %s", cddp_strerror(rc));
        trn_ddp_free(d);
        return rc;
    }
    d->work = trn_calloc((size_t)(d->plan.n_buckets ? d->plan.n_buckets : 1), sizeof(*d->work));
    int max_c = 0;
    for (int i = 0; i < m->num_bn; i++)
        if (m->bns[i]->c > max_c)
            max_c = m->bns[i]->c;
    /* world blocks of (2C + 1) for the gather, and 2C for the merged result */
    size_t bn_floats = ((size_t)d->world + 1) * (2 * (size_t)max_c + 1);
    d->bn_buf = trn_calloc(bn_floats, sizeof(float));
    rc = device_buffers(d, bn_floats, err, errlen);
    if (rc) {
        trn_ddp_free(d);
        return rc;
    }
    for (int b = 0; b < d->plan.n_buckets; b++) {
        const struct trn_bucket *k = &d->plan.buckets[b];
        log_debug("T6204", "bucket %d: %zu bytes, %s .. %s", b, k->numel * sizeof(float),
                  d->tensor_names[k->first + k->count - 1], d->tensor_names[k->first]);
    }
    if (d->world > 1) {
        m->hooks.arg = d;
        m->hooks.grad_ready = on_grad_ready;
        if (d->opt.sync_bn) {
            m->hooks.bn_stats = on_bn_stats;
            m->hooks.bn_grads = on_bn_grads;
        }
    }
    return 0;
}

void trn_ddp_free(struct trn_ddp *d)
{
    if (d->m && d->m->hooks.arg == d)
        memset(&d->m->hooks, 0, sizeof(d->m->hooks));
    trn_bucket_ready_free(&d->ready);
    trn_bucket_plan_free(&d->plan);
    free(d->work);
    free(d->tensor_names);
    free(d->bn_buf);
    if (d->m && d->m->be) {
        d->m->be->ops->free(d->m->be, d->bn_dev);
        d->m->be->ops->free(d->m->be, d->bf16);
    }
    memset(d, 0, sizeof(*d));
}

/* FNV-1a, 64 bits. */
static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

int trn_ddp_check_config(struct trn_ddp *d, const char *desc, char *err, size_t errlen)
{
    if (d->world == 1)
        return 0;
    int64_t *all = trn_calloc((size_t)d->world, sizeof(int64_t));
    int64_t mine = (int64_t)fnv1a(desc);
    must(d, trn_comm_allgather(d->comm, &mine, all, 1, TRN_COMM_I64));
    int n = 0;
    size_t used = 0;
    char ranks[256] = "";
    for (int r = 1; r < d->world; r++)
        if (all[r] != all[0]) {
            n++;
            if (used < sizeof(ranks) - 16)
                used += (size_t)snprintf(ranks + used, sizeof(ranks) - used, "%s%d",
                                         n > 1 ? ", " : "", r);
        }
    free(all);
    if (n == 0)
        return 0;
    snprintf(err, errlen,
             "rank(s) %s started with settings that differ from rank 0's (every rank needs the "
             "same flags); this rank has: %s",
             ranks, desc);
    return CDDP_EMISMATCH;
}

int trn_ddp_check_same(struct trn_ddp *d, const int64_t *v, size_t n)
{
    if (d->world == 1 || n == 0)
        return 0;
    int64_t *all = trn_calloc((size_t)d->world * n, sizeof(int64_t));
    must(d, trn_comm_allgather(d->comm, v, all, n, TRN_COMM_I64));
    int rc = 0;
    for (int r = 1; r < d->world && rc == 0; r++)
        if (memcmp(all + (size_t)r * n, all, n * sizeof(int64_t)) != 0)
            rc = CDDP_EMISMATCH;
    free(all);
    return rc;
}

void trn_ddp_broadcast_state(struct trn_ddp *d)
{
    if (d->world == 1)
        return;
    struct trn_resnet *m = d->m;
    must(d, trn_comm_broadcast(d->comm, m->params, m->num_params, TRN_COMM_F32, 0));
    must(d, trn_comm_broadcast(d->comm, m->buffers, m->num_buffers, TRN_COMM_F32, 0));
    must(d,
         trn_comm_broadcast(d->comm, m->num_batches_tracked, (size_t)m->num_bn, TRN_COMM_I64, 0));
}

void trn_ddp_sync_buffers(struct trn_ddp *d)
{
    if (d->world == 1 || d->opt.sync_bn)
        return;
    must(d, trn_comm_broadcast(d->comm, d->m->buffers, d->m->num_buffers, TRN_COMM_F32, 0));
}

void trn_ddp_bucket_summary(const struct trn_ddp *d, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "%d bucket(s), MiB:", d->plan.n_buckets);
    for (int b = 0; b < d->plan.n_buckets && used < len; b++)
        used += (size_t)snprintf(buf + used, len - used, " %.2f",
                                 (double)d->plan.buckets[b].numel * sizeof(float) / 1048576.0);
}

uint64_t trn_ddp_state_checksum(const struct trn_resnet *m)
{
    /* FNV-1a over 64-bit words of params, buffers, then the counters. */
    uint64_t h = 0xcbf29ce484222325ull;
    /* (the host copies on a device backend: the caller pulls first) */
    const void *parts[3] = {m->host_params ? m->host_params : m->params,
                            m->host_buffers ? m->host_buffers : m->buffers, m->num_batches_tracked};
    size_t bytes[3] = {m->num_params * sizeof(float), m->num_buffers * sizeof(float),
                       (size_t)m->num_bn * sizeof(int64_t)};
    for (int p = 0; p < 3; p++) {
        const unsigned char *b = parts[p];
        size_t i = 0;
        for (; i + 8 <= bytes[p]; i += 8) {
            uint64_t w;
            memcpy(&w, b + i, 8);
            h = (h ^ w) * 0x100000001b3ull;
        }
        for (; i < bytes[p]; i++)
            h = (h ^ b[i]) * 0x100000001b3ull;
    }
    return h;
}
