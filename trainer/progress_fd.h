/*
 * progress_fd.h: the worker's end of cddprun's progress channel
 * (CDDP_PROGRESS_FD, docs/status.md): one JSON line per training step
 * (proto/progress.h writes it) to the pipe the agent named.
 *
 * A line the pipe has no room for is dropped, never waited for, so a slow
 * or stuck agent never slows training; once the agent is gone (a write
 * fails otherwise), reporting stops. Without CDDP_PROGRESS_FD, or with a
 * value that is not an open file descriptor, nothing is written. One
 * thread (the step loop's) calls these.
 */
#ifndef CDDP_TRAINER_PROGRESS_FD_H
#define CDDP_TRAINER_PROGRESS_FD_H

struct trn_progress_fd {
    int fd; /* CDDP_PROGRESS_FD, non-blocking; -1: none */
};

/* Takes the descriptor CDDP_PROGRESS_FD names, if it is open, and makes it
 * non-blocking. */
void trn_progress_fd_open(struct trn_progress_fd *p);

struct progress_line;

/* One step's progress line (proto/progress.h): the step and epoch, the
 * loss, the throughput, and the step's time split into compute (outside
 * collective waits) and wait. */
void trn_progress_fd_report(struct trn_progress_fd *p, const struct progress_line *l);

/* --restart_scope=worker (blame.h): ranks[0..n) never reached a
 * collective of generation gen, a line {"blame":rank,"blame_gen":gen}
 * each, all in one write (at most PROGRESS_BLAMES_KEPT, what the agent
 * keeps of one read; under PIPE_BUF, so the agent reads them together and
 * kills them all before it sees one exit). 0, or -1
 * when they were not written (no channel, the pipe full or gone, n out
 * of range). */
int trn_progress_fd_blame(struct trn_progress_fd *p, const int *ranks, int n, long gen);

#endif
