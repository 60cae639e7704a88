/* scaler.c: GradScaler's state machine; see scaler.h. */
#include "trainer/scaler.h"

#include <math.h>

void trn_scaler_init(struct trn_scaler *s, bool enabled)
{
    *s = (struct trn_scaler){.enabled = enabled,
                             .scale = TRN_SCALER_INIT_SCALE,
                             .growth_factor = TRN_SCALER_GROWTH_FACTOR,
                             .backoff_factor = TRN_SCALER_BACKOFF_FACTOR,
                             .growth_interval = TRN_SCALER_GROWTH_INTERVAL};
}

float trn_scaler_loss_scale(const struct trn_scaler *s)
{
    return s->enabled ? s->scale : 1.0f;
}

float trn_scaler_inv_scale(const struct trn_scaler *s)
{
    return s->enabled ? (float)(1.0 / (double)s->scale) : 1.0f;
}

/* torch's _amp_update_scale_ (AmpKernels.cu), one value. */
bool trn_scaler_update(struct trn_scaler *s, bool found_inf)
{
    if (!s->enabled)
        return true;
    if (found_inf) {
        s->scale = s->scale * s->backoff_factor;
        s->growth_tracker = 0;
        s->skipped++;
        return false;
    }
    long successful = s->growth_tracker + 1;
    if (successful == s->growth_interval) {
        float grown = s->scale * s->growth_factor;
        if (isfinite(grown))
            s->scale = grown;
        s->growth_tracker = 0;
    } else {
        s->growth_tracker = successful;
    }
    return true;
}

int trn_scaler_restore(struct trn_scaler *s, double scale, long growth_tracker)
{
    float f = (float)scale;
    if (!isfinite(f) || !(f > 0) || growth_tracker < 0 || growth_tracker >= s->growth_interval)
        return -1;
    s->scale = f;
    s->growth_tracker = growth_tracker;
    return 0;
}
