/*
 * scaler.h: fp16 loss scaling with torch.amp.GradScaler's semantics.
 *
 * Pure state machine (tests/unit/test_scaler.c follows torch's documented
 * behaviour step by step); the per-element work (unscale and the inf/NaN
 * check over the gradients) is ops_math.h's trn_unscale_elem, run by the
 * CUDA backend's kernel. The defaults are GradScaler's:
 *
 *   init_scale 2^16, growth_factor 2, backoff_factor 0.5, growth_interval 2000
 *
 * A step, as torch's scaler.scale(loss).backward(); scaler.unscale_(opt);
 * [clip]; scaler.step(opt); scaler.update():
 *
 *   1. backward from loss * scale (trn_scaler_loss_scale)
 *   2. every gradient *= inv_scale (trn_scaler_inv_scale: the fp32 of
 *      1/scale computed in double, as torch's scale.double().reciprocal()
 *      .float()), noting whether any is inf or NaN; clipping, if any, comes
 *      after this and sees true gradients
 *   3. the optimizer step only when none was (trn_scaler_update's return)
 *   4. update: on inf/NaN scale *= backoff_factor and the growth tracker
 *      restarts; otherwise the tracker counts the good step and, at
 *      growth_interval good steps in a row, scale *= growth_factor (unless
 *      that is not finite) and the tracker restarts.
 *
 * The scale is an fp32 value, as torch keeps it (an fp32 tensor), so a run
 * here and a run with torch hold the same bits. Disabled (--amp off or
 * bf16), it is the identity: scale 1, every step taken, nothing changes.
 */
#ifndef CDDP_TRAINER_SCALER_H
#define CDDP_TRAINER_SCALER_H

#include <stdbool.h>

#define TRN_SCALER_INIT_SCALE 65536.0f
#define TRN_SCALER_GROWTH_FACTOR 2.0f
#define TRN_SCALER_BACKOFF_FACTOR 0.5f
#define TRN_SCALER_GROWTH_INTERVAL 2000L

struct trn_scaler {
    bool enabled;
    float scale;
    float growth_factor, backoff_factor;
    long growth_interval;
    long growth_tracker; /* good steps in a row since the scale last changed */
    long skipped;        /* steps skipped for inf/NaN, in this process */
};

/* GradScaler(enabled=enabled) with the defaults above. */
void trn_scaler_init(struct trn_scaler *s, bool enabled);

/* What the loss is multiplied by before backward: scale, or 1 disabled. */
float trn_scaler_loss_scale(const struct trn_scaler *s);

/* What the gradients are multiplied by in unscale: fp32(1 / (double)scale), or 1. */
float trn_scaler_inv_scale(const struct trn_scaler *s);

/*
 * After unscale: found_inf says whether any gradient was inf or NaN.
 * Returns whether the optimizer step is to be taken (always, disabled),
 * and updates the scale as torch's scaler.update() (nothing, disabled).
 */
bool trn_scaler_update(struct trn_scaler *s, bool found_inf);

/*
 * Restores a saved state (a checkpoint's amp.scale, amp.growth_tracker):
 * 0, or -1 when the values cannot be a scaler's (scale not finite or not
 * positive, tracker negative or not below growth_interval).
 */
int trn_scaler_restore(struct trn_scaler *s, double scale, long growth_tracker);

#endif
