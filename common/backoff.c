/* backoff.c: see backoff.h. */
#include "common/backoff.h"

void cddp_backoff_init(struct cddp_backoff *b, uint64_t first_ms, uint64_t max_ms)
{
    b->first_ms = first_ms ? first_ms : 1;
    b->max_ms = max_ms > b->first_ms ? max_ms : b->first_ms;
    b->step_ms = b->first_ms;
}

void cddp_backoff_reset(struct cddp_backoff *b)
{
    b->step_ms = b->first_ms;
}

uint64_t cddp_backoff_next(struct cddp_backoff *b, uint32_t random, uint64_t limit_ms)
{
    uint64_t half = b->step_ms / 2;
    uint64_t ms = half + (uint64_t)random % (half + 1);
    b->step_ms = b->step_ms > b->max_ms / 2 ? b->max_ms : b->step_ms * 2;
    return ms < limit_ms ? ms : limit_ms;
}
