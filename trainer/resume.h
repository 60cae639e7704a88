/*
 * resume.h: a run's checkpoint (--checkpoint, --ckpt-every, --no-resume):
 * where it resumes from, and writing it as training goes.
 *
 * It binds checkpoint.h's file format to the run: the model's state_dict
 * table and the momentum buffer of each parameter (views into the model's
 * memory, named as the parameter), the sampler position, the optimizer's
 * settings and the learning-rate schedule. Rules for what may change
 * across a resume: docs/trainer-data.md, "Resuming".
 *
 * DDP: every rank calls trn_resume_load and reads the same file, so every
 * rank resumes the same step at the same sampler position (the trainer
 * checks that they agree once connected); rank 0 alone writes, and the
 * trainer holds every rank at a barrier after each write, so no rank runs
 * on (or exits) before the checkpoint it would restart from exists.
 *
 * The previous checkpoint is kept beside it as PATH.prev (a hard link to
 * the file the write replaces, so it costs no copy and PATH always exists):
 * when PATH is damaged (truncated, a flipped bit, not a checkpoint any
 * more), every rank resumes from PATH.prev instead, with a warning (T0506).
 * Only a checkpoint this run wrote or resumed from becomes PATH.prev; a
 * PATH.prev left by another run (--no-resume, PATH removed) is deleted at
 * the first write. Disk use: two checkpoints, as during any write before.
 *
 * Errors are returned as one line, "--checkpoint: ...", for the caller to
 * print; nothing here exits.
 */
#ifndef CDDP_TRAINER_RESUME_H
#define CDDP_TRAINER_RESUME_H

#include <stdbool.h>
#include <stddef.h>

#include "trainer/checkpoint.h"   /* struct trn_ckpt_tensor */
#include "trainer/data/sampler.h" /* struct trn_sampler */
#include "trainer/flags.h"        /* struct trn_config */
#include "trainer/resnet.h"       /* struct trn_resnet */
#include "trainer/scaler.h"       /* struct trn_scaler */
#include "trainer/schedule.h"     /* struct trn_lr_schedule */

/* The model's state_dict as checkpoint.h's table, over host memory: the
 * model's own on the CPU, its host copies on a device backend (the caller
 * pulls before writing and pushes after reading; resnet.h). The caller frees it. */
struct trn_ckpt_tensor *trn_state_table(const struct trn_resnet *m);

/* What the next write does with PATH.prev. */
enum trn_prev_kept {
    TRN_PREV_DROP,   /* delete it: no checkpoint of this run on disk yet */
    TRN_PREV_ROTATE, /* PATH is this run's and sound: it becomes PATH.prev */
    TRN_PREV_HOLD,   /* PATH is damaged, PATH.prev is what the run resumed from: leave it */
};

struct trn_resume {
    const char *path; /* --checkpoint; NULL: no checkpoints */
    char *prev;       /* PATH.prev (owned; NULL without --checkpoint) */
    enum trn_prev_kept prev_kept;
    const struct trn_config *cfg;
    struct trn_resnet *model;
    const struct trn_sampler *sampler;
    const struct trn_lr_schedule *schedule;
    struct trn_ckpt_tensor *table; /* the state_dict (borrowed) */
    struct trn_ckpt_tensor *momentum;
    size_t n_mom;
    long last_step; /* step of the checkpoint last written or resumed; -1: none */
    /* --amp fp16's loss scaler (set after init; NULL or disabled: none):
     * saved with the checkpoint, restored from one that has it. */
    struct trn_scaler *scaler;
};

/* Where a run starts. */
struct trn_resume_point {
    bool resumed;     /* from the checkpoint (else from scratch: all zero) */
    int epoch;        /* the epoch to start */
    long step;        /* optimizer steps already taken */
    long first_batch; /* of this rank's batches of `epoch` */
};

/* Borrows every pointer (the batch size is c->batch_size). */
void trn_resume_init(struct trn_resume *k, const struct trn_config *c, struct trn_resnet *m,
                     struct trn_ckpt_tensor *table, const struct trn_sampler *s,
                     const struct trn_lr_schedule *sched);
void trn_resume_free(struct trn_resume *k);

/*
 * Continues from the checkpoint when it exists (unless --no-resume): the
 * model's tensors, the momentum buffers and the optimizer's step count go
 * into the model, the position into *at. A damaged PATH (CDDP_ECORRUPT,
 * CDDP_EIO_SHORT) falls back on PATH.prev (T0506); a PATH of another model
 * or run does not. Returns 1 resumed, 0 nothing to resume (no
 * --checkpoint, no file, --no-resume; *at zeroed), or -1: a checkpoint
 * that cannot be read or does not fit this run, nor its previous one (err;
 * the files untouched, the model's memory possibly partly overwritten: the
 * caller exits). Logs the differences it tolerates (T0502, T0503, T0504,
 * T0505); rank 0 prints the "=> resumed from checkpoint" line, naming the
 * file it read.
 */
int trn_resume_load(struct trn_resume *k, int rank, struct trn_resume_point *at, char *err,
                    size_t errlen);

/*
 * Rank 0 writes the checkpoint, atomically (the one it replaces kept as
 * PATH.prev, see above): the model, the momentum buffers, and where
 * training stands: `step` steps in all, in `epoch` with
 * rank_offset of this rank's samples of it done (at an epoch's end: the
 * next epoch, 0). Other ranks only record the step. Returns 1 when this
 * step is to be checkpointed (the caller then holds the ranks at a
 * barrier), 0 when there is nothing to do (no --checkpoint, or this step's
 * checkpoint is the one on disk), -1 when the write failed (err; the
 * previous checkpoint stays in place).
 */
int trn_resume_save(struct trn_resume *k, int rank, int epoch, long step, size_t rank_offset,
                    char *err, size_t errlen);

#endif
