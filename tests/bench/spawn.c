/*
 * spawn.c: bench_spawn, the launcher benchmark's stopwatch and baseline
 * (tests/bench/bench_launcher.py).
 *
 *   bench_spawn [--setsid] N PROGRAM [ARG...]
 *
 * Forks N children, each of which execs PROGRAM (stdin, stdout and stderr
 * on /dev/null; with --setsid, in a session of its own first, as torchrun
 * 2.2+ and cddprun start workers), waits for all of them, and prints one
 * line on stdout:
 *
 *   <wall us> <largest ru_maxrss of a child, KiB> <CPU us of all> <failed children>
 *
 * `bench_spawn 4 /bin/true` is what launching four workers costs at the
 * least: a bare fork+exec of each and a wait, nothing else. `bench_spawn 1
 * cddprun --nproc_per_node=4 /bin/true` is the same work through cddprun;
 * the same stopwatch runs round both, so their ratio is cddprun's overhead.
 * The clock starts before the first fork and stops when the last child is
 * reaped, so this program's own start-up is outside it.
 *
 * The CPU time is user + system of every child and of the descendants
 * each waited for: unlike the wall time, it hardly depends on what else
 * the machine runs. ru_maxrss is the peak RSS of a child and of the
 * descendants it waited for. Linux counts in it the image the child had before exec (a fork of
 * this small program, about 1 MiB), which is why the benchmark measures
 * RSS through here rather than through Python (a fork of the interpreter
 * would be the peak).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/strutil.h"

int main(int argc, char **argv)
{
    long n = 0;
    int new_session = argc > 1 && strcmp(argv[1], "--setsid") == 0;
    argc -= new_session;
    argv += new_session;
    if (argc < 3 || cddp_parse_long(argv[1], 1, 1024, &n) != 0) {
        fprintf(stderr, "usage: bench_spawn [--setsid] N PROGRAM [ARG...]   (N in 1..1024)\n");
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long started = 0, failed = 0;
    for (long i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("bench_spawn: fork");
            failed++;
            break;
        }
        if (pid == 0) {
            if (new_session)
                setsid();
            int null = open("/dev/null", O_RDWR);
            if (null >= 0) {
                dup2(null, 0);
                dup2(null, 1);
                dup2(null, 2);
            }
            execv(argv[2], argv + 2);
            _exit(127);
        }
        started++;
    }
    long maxrss = 0;
    long long cpu_us = 0;
    while (started > 0) {
        int st;
        struct rusage ru;
        pid_t pid = wait4(-1, &st, 0, &ru);
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            perror("bench_spawn: wait4");
            return 1;
        }
        started--;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failed++;
        if (ru.ru_maxrss > maxrss)
            maxrss = ru.ru_maxrss;
        cpu_us += (long long)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000LL +
                  ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    long long us =
        (long long)(t1.tv_sec - t0.tv_sec) * 1000000LL + (t1.tv_nsec - t0.tv_nsec) / 1000;
    printf("%lld %ld %lld %ld\n", us, maxrss, cpu_us, failed);
    return failed ? 1 : 0;
}
