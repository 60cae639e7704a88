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

#include "common/strutil.h"

static volatile sig_atomic_t terminated;

static long env_long(const char *name, long def)
{
    const char *s = getenv(name);
    long v;
    return s && cddp_parse_long(s, -1, 100000000, &v) == 0 ? v : def;
}

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void record(const char *dir, const char *what, long attempt, long rank)
{
    char path[4096], line[128];
    snprintf(path, sizeof(path), "%s/events", dir);
    int n = snprintf(line, sizeof(line), "%s %ld %ld %lld\n", what, attempt, rank, now_ns());
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        if (write(fd, line, (size_t)n) < 0)
            perror("watchdog_worker: write");
        close(fd);
    }
}

static void on_term(int sig)
{
    (void)sig;
    terminated = 1;
}

int main(void)
{
    long attempt = env_long("TORCHELASTIC_RESTART_COUNT", 0);
    long rank = env_long("LOCAL_RANK", 0);
    long period_ms = env_long("BENCH_PERIOD_MS", 10);
    long steps = env_long("BENCH_STEPS", 20);
    long seconds = env_long("BENCH_SECONDS", 10);
    int fd = (int)env_long("CDDP_PROGRESS_FD", -1);
    const char *dir = getenv("BENCH_DIR");
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL); /* no SA_RESTART: sleeps return at once */
    struct timespec period = {period_ms / 1000, (period_ms % 1000) * 1000000L};
    long long end = now_ns() + (long long)seconds * 1000000000LL;
    for (long step = 0;; step++) {
        if (terminated) {
            if (dir)
                record(dir, "term", attempt, rank);
            return 143;
        }
        char line[64];
        int n = snprintf(line, sizeof(line), "{\"step\":%ld}\n", step);
        if (fd >= 0 && write(fd, line, (size_t)n) < 0 && errno != EINTR)
            fd = -1;
        if (dir && attempt > 0 && step == 0)
            record(dir, "first", attempt, rank);
        if (dir && attempt == 0 && rank == 0 && step + 1 == steps) {
            record(dir, "hang", attempt, rank);
            while (!terminated)
                pause();
            continue;
        }
        if ((dir && attempt > 0 && step + 1 >= steps) || (!dir && now_ns() >= end))
            return 0;
        nanosleep(&period, NULL);
    }
}
