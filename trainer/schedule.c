/* schedule.c: the learning rate of each step; see schedule.h. */
#include "trainer/schedule.h"

#include <math.h>
#include <stddef.h>

const char *const trn_lr_kind_names[] = {"constant", "cosine", NULL};

struct trn_lr_schedule trn_lr_schedule_make(enum trn_lr_kind kind, double lr, long steps_per_epoch,
                                            long epochs, long max_steps)
{
    long total = steps_per_epoch * epochs;
    if (max_steps && max_steps < total)
        total = max_steps;
    return (struct trn_lr_schedule){
        .kind = kind, .lr = lr, .total_steps = kind == TRN_LR_COSINE ? total : 0};
}

double trn_lr_at(const struct trn_lr_schedule *s, long step)
{
    if (s->kind != TRN_LR_COSINE)
        return s->lr;
    /* Keep this expression and its order of operations: the losses are
     * compared with PyTorch's (tests/compat) and a resumed run's with an
     * uninterrupted one's, bit for bit. */
    return s->lr * 0.5 * (1.0 + cos(M_PI * (double)step / (double)s->total_steps));
}

const char *trn_lr_kind_name(enum trn_lr_kind kind)
{
    return kind == TRN_LR_COSINE ? "cosine" : "constant";
}
