/*
 * fdlimit.h: the open-file limit (RLIMIT_NOFILE) of cddprun and cddp-rdzv.
 *
 * cddp-rdzv holds a socket per agent; cddprun holds pipes and log files per
 * worker and a socket per status-port client. Most shells give a soft limit
 * of 1024 under a hard limit many times that (systemd: 524288), so both
 * raise the soft limit toward the hard one at start, as redis's
 * adjustOpenFilesLimit does, and log what they got (C0002; C0003 when
 * nothing could be raised). Workers are not daemons: cddprun gives them the
 * soft limit back between fork and exec (cddp_fdlimit_restore), so a worker
 * sees the limit it would see under torchrun (programs that still use
 * select(2) break past fd 1023).
 *
 * Not thread-safe: call cddp_fdlimit_raise once, at start, before threads.
 */
#ifndef CDDP_COMMON_FDLIMIT_H
#define CDDP_COMMON_FDLIMIT_H

#include <stdint.h>

struct cddp_fdlimit {
    uint64_t soft_before; /* the soft limit found at start */
    uint64_t soft;        /* the soft limit now */
    uint64_t hard;        /* the hard limit (UINT64_MAX: unlimited) */
};

/* Raises the soft limit as far toward the hard limit as the kernel allows
 * (an unlimited hard limit is fs.nr_open's), stepping down as redis does
 * when a value is refused; never lowers it. Logs the outcome once and
 * fills *out (may be NULL). */
void cddp_fdlimit_raise(struct cddp_fdlimit *out);

/* The soft limit in effect now (getrlimit; UINT64_MAX: unlimited). */
uint64_t cddp_fdlimit_soft(void);

/* Puts back the soft limit cddp_fdlimit_raise found (a no-op when it
 * raised nothing). Async-signal-safe: for a child between fork and exec. */
void cddp_fdlimit_restore(void);

#endif
