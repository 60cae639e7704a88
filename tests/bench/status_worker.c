/*
 * status_worker.c: the worker of tests/bench/status_agent.py. It reports
 * progress every $BENCH_PERIOD_MS (default 10) on CDDP_PROGRESS_FD, as a
 * training loop reporting every step would, and on rank 0 it exits 1 once
 * the file $BENCH_DIR/go.<restart_count> exists, recording just before:
 *
 *     exit <restart_count> <local_rank> <CLOCK_REALTIME ns>
 *
 * appended to $BENCH_DIR/events. The other ranks record when the agent's
 * SIGTERM reaches them (`term ...`) and exit 143. On attempt
 * $BENCH_ATTEMPTS-1 rank 0 exits 0 instead, and so do the others after it.
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
    return s && cddp_parse_long(s, -1, 1000000, &v) == 0 ? v : def;
}

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void record(const char *dir, const char *what, long attempt, long rank, long long ns)
{
    char path[4096], line[128];
    snprintf(path, sizeof(path), "%s/events", dir);
    int n = snprintf(line, sizeof(line), "%s %ld %ld %lld\n", what, attempt, rank, ns);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        if (write(fd, line, (size_t)n) < 0)
            perror("status_worker: write");
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
    long attempts = env_long("BENCH_ATTEMPTS", 2);
    long period_ms = env_long("BENCH_PERIOD_MS", 10);
    long progress_fd = env_long("CDDP_PROGRESS_FD", -1);
    const char *dir = getenv("BENCH_DIR");
    if (dir == NULL) {
        fprintf(stderr, "status_worker: BENCH_DIR is not set\n");
        return 2;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL); /* no SA_RESTART: nanosleep returns at once */

    char go[4096];
    snprintf(go, sizeof(go), "%s/go.%ld", dir, attempt);
    struct timespec period = {period_ms / 1000, (period_ms % 1000) * 1000000L};
    for (long step = 0;; step++) {
        if (terminated) {
            record(dir, "term", attempt, rank, now_ns());
            return 143;
        }
        if (progress_fd >= 0) {
            char line[128];
            int n = snprintf(line, sizeof(line),
                             "{\"step\":%ld,\"epoch\":%ld,\"loss\":%.4f,\"samples_per_s\":%.1f}\n",
                             step, attempt, 2.0 / (double)(step + 1), 512.0);
            if (write((int)progress_fd, line, (size_t)n) < 0 && errno != EINTR)
                progress_fd = -1;
        }
        if (rank == 0 && access(go, F_OK) == 0) {
            if (attempt >= attempts - 1)
                return 0;
            record(dir, "exit", attempt, rank, now_ns());
            return 1;
        }
        if (rank != 0 && attempt >= attempts - 1 && access(go, F_OK) == 0)
            return 0;
        nanosleep(&period, NULL);
    }
}
