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

/* The progress line of step `step` of epoch `epoch`. */
void trn_progress_fd_report(struct trn_progress_fd *p, long step, int epoch, double loss,
                            double samples_per_s);

#endif
