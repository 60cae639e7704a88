/*
 * schedule.h: the learning rate of each optimizer step (--lr, --lr-schedule).
 *
 *   constant  --lr at every step (torch.optim.SGD without a scheduler);
 *   cosine    torch's CosineAnnealingLR(T_max = every optimizer step of the
 *             run, eta_min = 0) with scheduler.step() after each optimizer
 *             step: lr * (1 + cos(pi * step / T_max)) / 2.
 *
 * The rate is a pure function of the global step, so a resumed run
 * continues on the same curve, bit for bit. No state, no I/O.
 */
#ifndef CDDP_TRAINER_SCHEDULE_H
#define CDDP_TRAINER_SCHEDULE_H

enum trn_lr_kind {
    TRN_LR_CONSTANT,
    TRN_LR_COSINE,
};

/* The kinds' names as --lr-schedule spells them, in enum order, NULL-ended. */
extern const char *const trn_lr_kind_names[];

struct trn_lr_schedule {
    enum trn_lr_kind kind;
    double lr;        /* --lr: the rate at step 0 */
    long total_steps; /* cosine's T_max: the run's optimizer steps; 0 for constant */
};

/*
 * The schedule of a run of `epochs` epochs of `steps_per_epoch` optimizer
 * steps, cut at max_steps (--steps; 0: no cut).
 */
struct trn_lr_schedule trn_lr_schedule_make(enum trn_lr_kind kind, double lr, long steps_per_epoch,
                                            long epochs, long max_steps);

/* The rate for optimizer step `step` (0 for the first). */
double trn_lr_at(const struct trn_lr_schedule *s, long step);

/* "constant" or "cosine" (what checkpoints record). */
const char *trn_lr_kind_name(enum trn_lr_kind kind);

#endif
