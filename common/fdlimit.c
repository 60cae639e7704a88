/* fdlimit.c: see fdlimit.h. */
#include "common/fdlimit.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "common/log.h"

/* What cddp_fdlimit_raise found, for cddp_fdlimit_restore in a child. */
static struct rlimit found;
static bool raised;

static uint64_t as_u64(rlim_t v)
{
    return v == RLIM_INFINITY ? UINT64_MAX : (uint64_t)v;
}

/* fs.nr_open: the most any process may have, whatever its hard limit. */
static rlim_t nr_open(void)
{
    rlim_t n = 1048576; /* the kernel's default */
    FILE *f = fopen("/proc/sys/fs/nr_open", "re");
    if (f) {
        unsigned long long v;
        if (fscanf(f, "%llu", &v) == 1 && v > 0)
            n = (rlim_t)v;
        fclose(f);
    }
    return n;
}

uint64_t cddp_fdlimit_soft(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0;
    return as_u64(rl.rlim_cur);
}

void cddp_fdlimit_raise(struct cddp_fdlimit *out)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        if (out)
            memset(out, 0, sizeof(*out));
        return;
    }
    found = rl;
    rlim_t target = rl.rlim_max;
    if (target == RLIM_INFINITY || target > nr_open())
        target = nr_open();
    int err = 0;
    rlim_t got = rl.rlim_cur;
    /* redis steps down by 16 from what it wants until the kernel agrees; a
     * hard limit the kernel refuses is rare, so bigger steps (1/16) find
     * the highest allowed value in few tries. */
    while (rl.rlim_cur != RLIM_INFINITY && target > rl.rlim_cur) {
        struct rlimit want = {.rlim_cur = target, .rlim_max = rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &want) == 0) {
            got = target;
            break;
        }
        err = errno;
        rlim_t step = target / 16 > 16 ? target / 16 : 16;
        if (target - rl.rlim_cur <= step)
            break;
        target -= step;
    }
    raised = got != rl.rlim_cur;
    if (raised)
        log_info("C0002", "open files: raised the soft limit from %llu to %llu (hard limit %s%llu)",
                 (unsigned long long)rl.rlim_cur, (unsigned long long)got,
                 rl.rlim_max == RLIM_INFINITY ? "unlimited, kernel's " : "",
                 (unsigned long long)(rl.rlim_max == RLIM_INFINITY ? nr_open() : rl.rlim_max));
    else if (err)
        log_warn("C0003", "open files: could not raise the soft limit above %llu (hard %llu): %s",
                 (unsigned long long)rl.rlim_cur, (unsigned long long)as_u64(rl.rlim_max),
                 strerror(err));
    else
        log_debug("C0002", "open files: the soft limit is %llu (hard limit %llu)",
                  (unsigned long long)as_u64(rl.rlim_cur), (unsigned long long)as_u64(rl.rlim_max));
    if (out) {
        out->soft_before = as_u64(rl.rlim_cur);
        out->soft = as_u64(got);
        out->hard = as_u64(rl.rlim_max);
    }
}

void cddp_fdlimit_restore(void)
{
    if (raised)
        setrlimit(RLIMIT_NOFILE, &found);
}
