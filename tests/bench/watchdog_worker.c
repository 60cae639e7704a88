/*
 * watchdog_worker.c: the worker of tests/bench/bench_watchdog.py. It writes
 * {"step":N} on CDDP_PROGRESS_FD every $BENCH_PERIOD_MS (default 10).
 *
 *   - Latency mode ($BENCH_DIR set): on attempt 0, local rank 0 stops
 *     reporting after $BENCH_STEPS steps (default 20) and hangs, recording
 *     "hang <attempt> <rank> <CLOCK_REALTIME ns>" just after its last line;
 *     every rank records "term ..." when the agent's SIGTERM reaches it and
 *     exits 143; on attempt 1 every rank records "first ..." at its first
 *     step and exits 0 after $BENCH_STEPS steps.
 *   - Load mode (no $BENCH_DIR): reports until $BENCH_SECONDS (default 10)
 *     have passed, then exits 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_worker.h"

int main(void)
{
    long attempt = bench_env_long("TORCHELASTIC_RESTART_COUNT", 0);
    long rank = bench_env_long("LOCAL_RANK", 0);
    long period_ms = bench_env_long("BENCH_PERIOD_MS", 10);
    long steps = bench_env_long("BENCH_STEPS", 20);
    long seconds = bench_env_long("BENCH_SECONDS", 10);
    int fd = (int)bench_env_long("CDDP_PROGRESS_FD", -1);
    const char *dir = getenv("BENCH_DIR");
    bench_catch_term();
    struct timespec period = {period_ms / 1000, (period_ms % 1000) * 1000000L};
    long long end = bench_now_ns() + (long long)seconds * 1000000000LL;
    for (long step = 0;; step++) {
        if (bench_terminated) {
            if (dir)
                bench_record(dir, "term", attempt, rank, bench_now_ns());
            return 143;
        }
        char line[64];
        int n = snprintf(line, sizeof(line), "{\"step\":%ld}\n", step);
        if (fd >= 0 && write(fd, line, (size_t)n) < 0 && errno != EINTR)
            fd = -1;
        if (dir && attempt > 0 && step == 0)
            bench_record(dir, "first", attempt, rank, bench_now_ns());
        if (dir && attempt == 0 && rank == 0 && step + 1 == steps) {
            bench_record(dir, "hang", attempt, rank, bench_now_ns());
            while (!bench_terminated)
                pause();
            continue;
        }
        if ((dir && attempt > 0 && step + 1 >= steps) || (!dir && bench_now_ns() >= end))
            return 0;
        nanosleep(&period, NULL);
    }
}
