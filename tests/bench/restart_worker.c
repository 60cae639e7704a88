/*
 * restart_worker.c: the worker of tests/bench/bench_launcher.py's restart
 * measurement. It records when it starts and, on rank 0 of every attempt but
 * the last, when it fails:
 *
 *     start <restart_count> <local_rank> <CLOCK_REALTIME ns>
 *     exit  <restart_count> <local_rank> <CLOCK_REALTIME ns>
 *
 * appended to $BENCH_OUT. Peers stop promptly: SIGTERM makes them exit at
 * once. On attempt $BENCH_ATTEMPTS-1 everybody exits 0.
 */
#include <fcntl.h>
#include <signal.h>
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
    return s && cddp_parse_long(s, 0, 1000000, &v) == 0 ? v : def;
}

static void record(const char *what, long attempt, long rank)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char line[128];
    int n = snprintf(line, sizeof(line), "%s %ld %ld %lld\n", what, attempt, rank,
                     (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    const char *out = getenv("BENCH_OUT");
    int fd = open(out ? out : "/dev/null", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0 && n > 0) {
        if (write(fd, line, (size_t)n) < 0)
            perror("restart_worker: write");
        close(fd);
    }
}

static void on_term(int sig)
{
    (void)sig;
    _exit(0);
}

int main(void)
{
    long attempt = env_long("TORCHELASTIC_RESTART_COUNT", 0);
    long rank = env_long("LOCAL_RANK", 0);
    long attempts = env_long("BENCH_ATTEMPTS", 2);
    record("start", attempt, rank);
    if (attempt >= attempts - 1)
        return 0;
    if (rank == 0) {
        record("exit", attempt, rank);
        return 1;
    }
    signal(SIGTERM, on_term);
    for (;;)
        pause();
}
