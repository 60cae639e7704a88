/*
 * backoff.h: exponential backoff with jitter, as a pure calculation.
 *
 * Every retry loop that waits for a server to come up (the rendezvous
 * client on its loop, the blocking store client) asks this for how long to
 * wait next:
 *
 *     struct cddp_backoff b;
 *     cddp_backoff_init(&b, 10, 1000);       // 10 ms doubling to 1 s
 *     ... attempt failed ...
 *     uint64_t ms = cddp_backoff_next(&b, (uint32_t)rand_r(&seed), deadline - now);
 *
 * Each wait is drawn uniformly from [step/2, 2 * (step/2)] ("equal
 * jitter"; step/2 rounds down), so thousands of clients started together
 * spread out, then the step doubles up to max_ms. The caller supplies the random number and the
 * time left: this module reads no clock and keeps no random state, so it is tested exactly and is
 * safe from any thread (one struct per retry loop).
 */
#ifndef CDDP_COMMON_BACKOFF_H
#define CDDP_COMMON_BACKOFF_H

#include <stdint.h>

struct cddp_backoff {
    uint64_t first_ms; /* the first step */
    uint64_t max_ms;   /* steps stop doubling here */
    uint64_t step_ms;  /* the next wait is about step_ms/2 to step_ms */
};

/* first_ms >= 1 and max_ms >= first_ms (clamped so). */
void cddp_backoff_init(struct cddp_backoff *b, uint64_t first_ms, uint64_t max_ms);

/* Back to the first step (after a success). */
void cddp_backoff_reset(struct cddp_backoff *b);

/* The next wait in ms, at most limit_ms (the time left before a deadline),
 * from random (any uniform 32-bit value, e.g. rand_r's); then doubles the
 * step. */
uint64_t cddp_backoff_next(struct cddp_backoff *b, uint32_t random, uint64_t limit_ms);

#endif
