/*
 * elastic_worker.c: the worker of tests/bench/bench_elastic.py. It records
 * when it starts, with what cddprun gave it, then waits to be stopped:
 *
 *     start <NODE> <WORLD_SIZE> <RANK> <MASTER_PORT> <CLOCK_REALTIME ns>
 *
 * appended to $BENCH_OUT (one write, O_APPEND: lines never mix). SIGTERM
 * makes it exit at once, so a stop costs the agent nothing measurable.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *env(const char *name)
{
    const char *s = getenv(name);
    return s && *s ? s : "-";
}

static void on_term(int sig)
{
    (void)sig;
    _exit(0);
}

int main(void)
{
    signal(SIGTERM, on_term);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char line[256];
    int n =
        snprintf(line, sizeof(line), "start %s %s %s %s %lld\n", env("NODE"), env("WORLD_SIZE"),
                 env("RANK"), env("MASTER_PORT"), (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    const char *out = getenv("BENCH_OUT");
    int fd = open(out ? out : "/dev/null", O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0 && n > 0) {
        if (write(fd, line, (size_t)n) < 0)
            perror("elastic_worker: write");
        close(fd);
    }
    for (;;)
        pause();
}
