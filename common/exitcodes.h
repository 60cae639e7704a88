/*
 * exitcodes.h: every exit status a cddp program gives or interprets, in one
 * place. docs/reliability.md documents them for users.
 */
#ifndef CDDP_COMMON_EXITCODES_H
#define CDDP_COMMON_EXITCODES_H

enum cddp_exit {
    CDDP_EXIT_OK = 0,
    /* The job failed (workers exhausted --max_restarts, rendezvous failed). Same as torchrun. */
    CDDP_EXIT_FAILURE = 1,
    /* Bad command line: one line on stderr names the flag and the problem. */
    CDDP_EXIT_USAGE = 2,
    /* A worker's collective (allreduce, broadcast, ...) did not finish within
     * --collective-timeout, or a peer failed during it. sysexits.h EX_TEMPFAIL:
     * retrying is expected to help, so the agent restarts the group. */
    CDDP_EXIT_COLLECTIVE_TIMEOUT = 75,
    /* A worker stopped by the agent's progress watchdog (no progress for too long). */
    CDDP_EXIT_WATCHDOG = 76,
    /* Test harness convention (meson, automake): the test was skipped. */
    CDDP_EXIT_SKIP = 77,
    /* An agent stopped by signal N exits 128+N (torchrun exits 1). */
    CDDP_EXIT_SIGNAL_BASE = 128,
};

#endif
