/*
 * bench_worker.h: what the benchmark workers (status_worker.c,
 * watchdog_worker.c) share: an environment number, the wall clock in ns,
 * one event line appended to $BENCH_DIR/events, and a SIGTERM flag.
 * Header-only: each worker is one file plus this.
 */
#ifndef CDDP_TESTS_BENCH_WORKER_H
#define CDDP_TESTS_BENCH_WORKER_H

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "common/strutil.h"

static volatile sig_atomic_t bench_terminated;

static inline long bench_env_long(const char *name, long def)
{
    const char *s = getenv(name);
    long v;
    return s && cddp_parse_long(s, -1, 100000000, &v) == 0 ? v : def;
}

static inline long long bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* "<what> <attempt> <rank> <ns>\n" appended to dir/events in one write. */
static inline void bench_record(const char *dir, const char *what, long attempt, long rank,
                                long long ns)
{
    char path[4096], line[128];
    snprintf(path, sizeof(path), "%s/events", dir);
    int n = snprintf(line, sizeof(line), "%s %ld %ld %lld\n", what, attempt, rank, ns);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        if (write(fd, line, (size_t)n) < 0)
            perror("bench worker: write");
        close(fd);
    }
}

static void bench_on_term(int sig)
{
    (void)sig;
    bench_terminated = 1;
}

/* SIGTERM sets bench_terminated; no SA_RESTART, so sleeps return at once. */
static inline void bench_catch_term(void)
{
    struct sigaction sa = {0};
    sa.sa_handler = bench_on_term;
    sigaction(SIGTERM, &sa, NULL);
}

#endif
