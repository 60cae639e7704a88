/* clock.h: monotonic and wall clocks in one place (pure modules take time as an argument). */
#ifndef CDDP_COMMON_CLOCK_H
#define CDDP_COMMON_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t cddp_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t cddp_mono_ms(void)
{
    return cddp_mono_ns() / 1000000u;
}

/* Seconds since the epoch, with sub-second precision. */
static inline double cddp_wall_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
