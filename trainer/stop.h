/*
 * stop.h: SIGTERM / SIGINT with --checkpoint: stop at the step's end.
 *
 * The launcher stops a worker group with SIGTERM (a restart, the job's
 * end, a preemption: Slurm and Kubernetes send it before SIGKILL). With
 * --checkpoint, the rank finishes the step it is in (every rank gets the
 * signal, so the step's collectives complete), rank 0 writes the
 * checkpoint at that step, and the rank then dies by the signal as it
 * would have at once: the restarted group resumes from the last step, not
 * from the last --ckpt-every. Bounded: a step that does not end within
 * its grace (three times the longest step so far plus the last checkpoint
 * write, plus 2 s; at most 30 s) is abandoned, as is a signal before the
 * first step ends (nothing newer to save); a second signal ends it at once.
 *
 * Process-wide: a signal handler reaches only static state, so the grace
 * period's state lives in stop.c, one per process (cddp-train runs one
 * training). Everything here runs on the main thread; the loader thread
 * blocks these signals (prefetch.h).
 */
#ifndef CDDP_TRAINER_STOP_H
#define CDDP_TRAINER_STOP_H

#include <stddef.h>

#include "trainer/resume.h" /* struct trn_resume */

/* Installs the SIGTERM, SIGINT and SIGALRM handlers. Without --checkpoint
 * there is nothing to save, and the caller leaves the default actions. */
void trn_stop_install(void);

/* After each step: the step's and its checkpoint write's seconds, which
 * bound how long the next step may take to finish once signalled; from
 * the first call on a signal waits for the step's end. */
void trn_stop_note_step(double step_s, double ckpt_s);

/*
 * At a step's end: when a stop signal came during the step, rank 0 writes
 * the checkpoint (ckpt, its model pulled to the host first) as at `step`
 * steps, in `epoch` with rank_offset of this rank's samples of it done, as
 * trn_resume_save; every rank then dies by the signal (no return). Without
 * a signal: nothing.
 */
void trn_stop_if_signalled(struct trn_resume *ckpt, int rank, int epoch, long step,
                           size_t rank_offset);

#endif
