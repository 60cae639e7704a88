/*
 * hang_worker.c: a worker for tests/integration/test_watchdog.py. It writes
 * a progress line ({"step":N}) every $HANG_PERIOD_MS (default 200) on
 * CDDP_PROGRESS_FD, $HANG_STEPS times (default 5); then, on the attempts
 * listed in $HANG_ATTEMPTS (TORCHELASTIC_RESTART_COUNT values, comma
 * separated; default "0"), it blocks for good in hang_here() without
 * writing anything more; on the others it exits 0. With $HANG_SLOW_MS it
 * also sleeps that long before its last step (a slow but steady step).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/strutil.h"

static long env_long(const char *name, long def)
{
    const char *s = getenv(name);
    long v;
    return s && cddp_parse_long(s, 0, 100000000, &v) == 0 ? v : def;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* The stacks file names this function (noinline: it is in the backtrace). */
__attribute__((noinline)) static void hang_here(void)
{
    for (;;)
        pause();
}

static int hangs_on(const char *list, const char *attempt)
{
    char buf[256];
    cddp_strlcpy(buf, list, sizeof(buf));
    for (char *p = buf; p && *p;) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        if (strcmp(p, attempt) == 0)
            return 1;
        p = comma ? comma + 1 : NULL;
    }
    return 0;
}

int main(void)
{
    long fd = env_long("CDDP_PROGRESS_FD", -1);
    long steps = env_long("HANG_STEPS", 5);
    long period = env_long("HANG_PERIOD_MS", 200);
    long slow = env_long("HANG_SLOW_MS", 0);
    const char *attempt = getenv("TORCHELASTIC_RESTART_COUNT");
    const char *list = getenv("HANG_ATTEMPTS");
    for (long i = 0; i < steps; i++) {
        sleep_ms(slow && i == steps - 1 ? slow : period);
        char line[64];
        int n = snprintf(line, sizeof(line), "{\"step\":%ld}\n", i);
        if (fd >= 0 && write((int)fd, line, (size_t)n) != n)
            return 3;
    }
    if (hangs_on(list ? list : "0", attempt ? attempt : "0"))
        hang_here();
    return 0;
}
