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

#include "bench_worker.h"

int main(void)
{
    long attempt = bench_env_long("TORCHELASTIC_RESTART_COUNT", 0);
    long rank = bench_env_long("LOCAL_RANK", 0);
    long attempts = bench_env_long("BENCH_ATTEMPTS", 2);
    long period_ms = bench_env_long("BENCH_PERIOD_MS", 10);
    long progress_fd = bench_env_long("CDDP_PROGRESS_FD", -1);
    const char *dir = getenv("BENCH_DIR");
    if (dir == NULL) {
        fprintf(stderr, "status_worker: BENCH_DIR is not set\n");
        return 2;
    }
    bench_catch_term();

    char go[4096];
    snprintf(go, sizeof(go), "%s/go.%ld", dir, attempt);
    struct timespec period = {period_ms / 1000, (period_ms % 1000) * 1000000L};
    for (long step = 0;; step++) {
        if (bench_terminated) {
            bench_record(dir, "term", attempt, rank, bench_now_ns());
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
            bench_record(dir, "exit", attempt, rank, bench_now_ns());
            return 1;
        }
        if (rank != 0 && attempt >= attempts - 1 && access(go, F_OK) == 0)
            return 0;
        nanosleep(&period, NULL);
    }
}
