/* resume.c: a run's checkpoint, resumed and written; see resume.h. */
#include "trainer/resume.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"   /* cddp_mono_ns */
#include "common/errors.h"  /* CDDP_ENOTFOUND, cddp_strerror */
#include "common/log.h"     /* log_info, log_warn */
#include "common/strutil.h" /* cddp_strlcpy */
#include "trainer/fatal.h"  /* trn_calloc, TRN_CHECK */

struct trn_ckpt_tensor *trn_state_table(const struct trn_resnet *m)
{
    struct trn_ckpt_tensor *t = trn_calloc(m->n_state, sizeof(*t));
    for (size_t i = 0; i < m->n_state; i++) {
        const struct trn_state_entry *e = &m->state[i];
        t[i].name = e->name;
        t[i].dtype = e->dtype == TRN_I64 ? TRN_ST_I64 : TRN_ST_F32;
        t[i].ndim = e->ndim;
        memcpy(t[i].shape, e->shape, sizeof(t[i].shape));
        t[i].data = e->host; /* the host copy on a device backend (trn_resnet_pull) */
    }
    return t;
}

void trn_resume_init(struct trn_resume *k, const struct trn_config *c, struct trn_resnet *m,
                     struct trn_ckpt_tensor *table, const struct trn_sampler *s,
                     const struct trn_lr_schedule *sched)
{
    *k = (struct trn_resume){.path = c->checkpoint,
                             .cfg = c,
                             .model = m,
                             .sampler = s,
                             .schedule = sched,
                             .table = table,
                             .last_step = -1};
    if (c->checkpoint) {
        size_t n = strlen(c->checkpoint) + sizeof(".prev");
        k->prev = trn_calloc(n, 1);
        snprintf(k->prev, n, "%s.prev", c->checkpoint);
    }
    k->momentum = trn_calloc(m->n_state, sizeof(*k->momentum));
    for (size_t i = 0; i < m->n_state; i++) {
        if (m->state[i].kind != TRN_STATE_PARAM)
            continue;
        k->momentum[k->n_mom] = table[i];
        k->momentum[k->n_mom++].data = trn_resnet_host_momentum(m) + m->state[i].off;
    }
}

void trn_resume_free(struct trn_resume *k)
{
    free(k->momentum);
    k->momentum = NULL;
    free(k->prev);
    k->prev = NULL;
}

/* Damage, as opposed to a checkpoint of another model or run: only damage
 * sends the resume to the previous checkpoint. */
static bool damaged(int rc)
{
    return rc == CDDP_ECORRUPT || rc == CDDP_EIO_SHORT;
}

/* Loads PATH, or PATH.prev when PATH is damaged; *from is the file read.
 * 0, CDDP_ENOTFOUND (no PATH), or another code with err set. */
static int load_either(struct trn_resume *k, struct trn_ckpt_meta *meta, const char **from,
                       char *err, size_t errlen)
{
    const struct trn_config *c = k->cfg;
    char why[2048];
    int rc = trn_ckpt_load(k->path, c->arch, k->table, k->model->n_state, k->momentum, k->n_mom,
                           meta, why, sizeof(why));
    *from = k->path;
    if (rc == 0) {
        k->prev_kept = TRN_PREV_ROTATE;
        return 0;
    }
    if (rc == CDDP_ENOTFOUND)
        return rc;
    if (!damaged(rc)) {
        snprintf(err, errlen, "--checkpoint: %s", why);
        return rc;
    }
    char why_prev[2048];
    int prc = trn_ckpt_load(k->prev, c->arch, k->table, k->model->n_state, k->momentum, k->n_mom,
                            meta, why_prev, sizeof(why_prev));
    if (prc == CDDP_ENOTFOUND) {
        snprintf(err, errlen, "--checkpoint: %s (and there is no previous checkpoint %s)", why,
                 k->prev);
        return rc;
    }
    if (prc != 0) {
        snprintf(err, errlen, "--checkpoint: %s; the previous checkpoint is unusable too: %s", why,
                 why_prev);
        return prc;
    }
    log_warn("T0506", "%s; resuming from the previous checkpoint, %s", why, k->prev);
    k->prev_kept = TRN_PREV_HOLD;
    *from = k->prev;
    return 0;
}

int trn_resume_load(struct trn_resume *k, int rank, struct trn_resume_point *at, char *err,
                    size_t errlen)
{
    const struct trn_config *c = k->cfg;
    const struct trn_sampler *s = k->sampler;
    int batch = (int)c->batch_size;
    *at = (struct trn_resume_point){0};
    if (!k->path || c->no_resume)
        return 0;
    struct trn_ckpt_meta meta;
    const char *from;
    char why[2048];
    int rc = load_either(k, &meta, &from, err, errlen);
    if (rc == CDDP_ENOTFOUND)
        return 0;
    if (rc != 0)
        return -1;
    struct trn_ckpt_run run = {
        .seed = (uint64_t)c->seed,
        .world_size = s->world,
        .batch_size = batch,
        .dataset_len = s->dataset_len,
        .shuffle = s->shuffle,
        .drop_last = s->drop_last,
        .rank_samples = s->num_samples,
    };
    struct trn_ckpt_start start;
    if (trn_ckpt_resume_point(&meta, &run, &start, why, sizeof(why)) != 0) {
        snprintf(err, errlen, "--checkpoint: %s: %s", from, why);
        return -1;
    }
    if (meta.epoch > INT32_MAX) {
        snprintf(err, errlen, "--checkpoint: %s: epoch %ld is out of range", from, meta.epoch);
        return -1;
    }
    k->model->optimizer_steps = meta.optimizer_steps;
    if (k->scaler && k->scaler->enabled && meta.amp_scaler &&
        trn_scaler_restore(k->scaler, meta.amp_scale, meta.amp_growth_tracker) != 0) {
        snprintf(err, errlen,
                 "--checkpoint: %s: amp.scale %g / amp.growth_tracker %ld are not a "
                 "loss scaler's state",
                 from, meta.amp_scale, meta.amp_growth_tracker);
        return -1;
    }
    *at = (struct trn_resume_point){.resumed = true,
                                    .epoch = (int)start.epoch,
                                    .step = meta.step,
                                    .first_batch = (long)(start.rank_offset / (uint64_t)batch)};
    k->last_step = meta.step;
    if (start.resized)
        log_warn("T0502",
                 "%s: written at the end of an epoch with world size %d, batch size %d, %" PRIu64
                 " samples%s; epoch %d is laid out for this run: world size %d, batch size %d, "
                 "%zu samples%s",
                 from, meta.world_size, meta.batch_size, meta.dataset_len,
                 meta.shuffle ? "" : ", --no-shuffle", at->epoch, s->world, batch, s->dataset_len,
                 s->shuffle ? "" : ", --no-shuffle");
    if (meta.lr != c->lr || meta.momentum != c->momentum || meta.weight_decay != c->weight_decay)
        log_warn("T0503",
                 "%s: written with --lr %g --momentum %g --weight-decay %g; continuing with "
                 "--lr %g --momentum %g --weight-decay %g",
                 from, meta.lr, meta.momentum, meta.weight_decay, c->lr, c->momentum,
                 c->weight_decay);
    const char *sched = trn_lr_kind_name(k->schedule->kind);
    if (strcmp(meta.lr_schedule, sched) != 0 || meta.lr_total_steps != k->schedule->total_steps)
        log_warn("T0505",
                 "%s: written with --lr-schedule %s (over %ld steps); continuing with "
                 "--lr-schedule %s (over %ld steps): the learning rate jumps to the new curve",
                 from, meta.lr_schedule, meta.lr_total_steps, sched, k->schedule->total_steps);
    if (c->init)
        log_info("T0504", "resuming from %s; --init %s is not read", from, c->init);
    if (rank == 0)
        printf("=> resumed from checkpoint '%s' (epoch %d, batch %ld, step %ld)\n", from, at->epoch,
               at->first_batch, at->step);
    return 1;
}

/* Before a write: the checkpoint about to be replaced becomes PATH.prev,
 * when it is this run's and sound. A hard link, not a copy or a rename:
 * PATH exists at every moment (a crash between two renames would leave
 * none, and the restart would start over), and the old PATH.prev is gone
 * before the new file is written, so the disk holds two checkpoints at
 * most, as a write always needed. Failures only cost the fallback: a
 * warning, and the write goes on. */
static void keep_previous(struct trn_resume *k)
{
    if (k->prev_kept == TRN_PREV_HOLD)
        return;
    if (unlink(k->prev) != 0 && errno != ENOENT) {
        log_warn("T0507", "%s: cannot remove the previous checkpoint: %s", k->prev,
                 cddp_strerror(CDDP_ERR_FROM_ERRNO(errno)));
        return;
    }
    if (k->prev_kept == TRN_PREV_ROTATE && link(k->path, k->prev) != 0 && errno != ENOENT)
        log_warn("T0507", "%s: the previous checkpoint is not kept: link: %s", k->prev,
                 cddp_strerror(CDDP_ERR_FROM_ERRNO(errno)));
}

int trn_resume_save(struct trn_resume *k, int rank, int epoch, long step, size_t rank_offset,
                    char *err, size_t errlen)
{
    if (!k->path || k->last_step == step)
        return 0;
    const struct trn_config *c = k->cfg;
    const struct trn_sampler *s = k->sampler;
    if (rank == 0) {
        struct trn_ckpt_meta meta = {
            .num_classes = k->model->num_classes,
            .seed = (uint64_t)c->seed,
            .epoch = epoch,
            .step = step,
            .epoch_offset = (uint64_t)rank_offset * (uint64_t)s->world,
            .world_size = s->world,
            .batch_size = (int)c->batch_size,
            .dataset_len = s->dataset_len,
            .shuffle = s->shuffle,
            .drop_last = s->drop_last,
            .optimizer_steps = k->model->optimizer_steps,
            .lr = c->lr,
            .momentum = c->momentum,
            .weight_decay = c->weight_decay,
            .lr_total_steps = k->schedule->total_steps,
        };
        if (k->scaler && k->scaler->enabled) {
            meta.amp_scaler = true;
            meta.amp_scale = (double)k->scaler->scale;
            meta.amp_growth_tracker = k->scaler->growth_tracker;
        }
        cddp_strlcpy(meta.arch, c->arch, sizeof(meta.arch));
        cddp_strlcpy(meta.lr_schedule, trn_lr_kind_name(k->schedule->kind),
                     sizeof(meta.lr_schedule));
        char why[1024];
        uint64_t t0 = cddp_mono_ns();
        keep_previous(k);
        if (trn_ckpt_save(k->path, k->table, k->model->n_state, k->momentum, k->n_mom, &meta, why,
                          sizeof(why)) != 0) {
            snprintf(err, errlen, "--checkpoint: %s", why);
            return -1;
        }
        log_info("T0501", "checkpoint: step %ld, epoch %d + %zu samples, written to %s in %.3f s",
                 step, epoch, rank_offset, k->path, (double)(cddp_mono_ns() - t0) * 1e-9);
    }
    k->last_step = step;
    k->prev_kept = TRN_PREV_ROTATE;
    return 1;
}
