/*
 * straggler_worker.c: the worker of tests/bench/bench_stragglers.py. It
 * writes a progress line with its step time every $BENCH_PERIOD_MS (default
 * 10 ms: 100 steps a second), as a training loop reporting every step would,
 * until $BENCH_DIR/stop exists or SIGTERM. Local rank $BENCH_SLOW_RANK (-1:
 * none) steps every $BENCH_SLOW_MS from step $BENCH_SLOW_FROM on, and
 * records when its first slow step began:
 *
 *     slow <restart_count> <local_rank> <CLOCK_REALTIME ns>
 *
 * appended to $BENCH_DIR/events.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_worker.h"

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(void)
{
    long attempt = bench_env_long("TORCHELASTIC_RESTART_COUNT", 0);
    long rank = bench_env_long("LOCAL_RANK", 0);
    long period_ms = bench_env_long("BENCH_PERIOD_MS", 10);
    long slow_rank = bench_env_long("BENCH_SLOW_RANK", -1);
    long slow_ms = bench_env_long("BENCH_SLOW_MS", 30);
    long slow_from = bench_env_long("BENCH_SLOW_FROM", 200);
    long fd = bench_env_long("CDDP_PROGRESS_FD", -1);
    const char *dir = getenv("BENCH_DIR");
    if (dir == NULL) {
        fprintf(stderr, "straggler_worker: BENCH_DIR is not set\n");
        return 2;
    }
    bench_catch_term();
    char stop[4096];
    snprintf(stop, sizeof(stop), "%s/stop", dir);
    long long last = bench_now_ns();
    for (long step = 1; !bench_terminated; step++) {
        bool slow = rank == slow_rank && step >= slow_from;
        if (slow && step == slow_from)
            bench_record(dir, "slow", attempt, rank, bench_now_ns());
        sleep_ms(slow ? slow_ms : period_ms);
        long long now = bench_now_ns();
        char line[128];
        int n = snprintf(line, sizeof(line), "{\"step\":%ld,\"step_time_s\":%.6f}\n", step,
                         (double)(now - last) * 1e-9);
        last = now;
        if (fd >= 0 && write((int)fd, line, (size_t)n) < 0)
            fd = -1;
        if (step % 10 == 0 && access(stop, F_OK) == 0)
            break;
    }
    return 0;
}
