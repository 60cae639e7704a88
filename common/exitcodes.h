/*
 * exitcodes.h: every exit status a cddp program gives or interprets, in one
 * place. docs/cli.md ("Exit status") documents cddprun's for users.
 */
#ifndef CDDP_COMMON_EXITCODES_H
#define CDDP_COMMON_EXITCODES_H

enum cddp_exit {
    CDDP_EXIT_OK = 0,
    /* The job failed (workers exhausted --max_restarts, rendezvous failed). Same as torchrun. */
    CDDP_EXIT_FAILURE = 1,
    /* Bad command line: one line on stderr names the flag and the problem. */
    CDDP_EXIT_USAGE = 2,
    /* cddprun: the restarts are used up and the last failure was a worker the
     * progress watchdog found hung (docs/cli.md, "Exit codes"). 3, 4 and 5
     * are below sysexits' 64..78 (the workers' 75 and 76), far from the
     * shell's 126, 127 and 128+N, and distinct from torchrun's 1 and 2. */
    CDDP_EXIT_HUNG = 3,
    /* cddprun: --max_no_progress_restarts restarts in a row made no progress. */
    CDDP_EXIT_NO_PROGRESS = 4,
    /* cddprun: the rendezvous was lost or closed under this node (its server
     * gone past join_timeout, the node removed from the run, no round
     * within join_timeout): the job itself did not fail here. */
    CDDP_EXIT_INFRA = 5,
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

/* cddprun's exit code as /status and its log name it (docs/cli.md, "Exit
 * codes"): "success", "failure", "usage", "hung", "no_progress",
 * "infrastructure", "signal" (128+N), "other". */
static inline const char *cddp_exit_name(int code)
{
    switch (code) {
    case CDDP_EXIT_OK:
        return "success";
    case CDDP_EXIT_FAILURE:
        return "failure";
    case CDDP_EXIT_USAGE:
        return "usage";
    case CDDP_EXIT_HUNG:
        return "hung";
    case CDDP_EXIT_NO_PROGRESS:
        return "no_progress";
    case CDDP_EXIT_INFRA:
        return "infrastructure";
    default:
        return code > CDDP_EXIT_SIGNAL_BASE && code < CDDP_EXIT_SIGNAL_BASE + 65 ? "signal"
                                                                                 : "other";
    }
}

#endif
