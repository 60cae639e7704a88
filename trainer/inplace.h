/*
 * inplace.h: recovering in place (cddprun --restart_scope=worker, which
 * sets CDDP_RESTART_SCOPE=worker and CDDP_GENERATION; docs/distributed.md,
 * "Recovering in place"), on gloo and nccl (nccl: written to the same
 * contract, never run on a GPU yet). On nccl the communicator's waits are
 * stream-ordered, so the step's params and momentum are kept too and the
 * step ends with trn_comm_sync; a failed communicator is aborted
 * (trn_comm_abort) and its watchdog does not end the rank
 * (trn_comm_options.recoverable).
 *
 * A failed collective in the training loop (a peer gone) jumps back to
 * main()'s recovery point instead of exiting 75 (train.c's
 * run_collective_failed; the setjmp stays in main's frame, which a longjmp
 * needs alive). From there trn_inplace_recover waits for the agent's next
 * generation, re-forms the group and every rank takes the state of the
 * lowest rank that was not replaced; the step that failed is run again.
 * A replacement (CDDP_GENERATION > 0) joins the survivors through
 * trn_inplace_rejoin instead of the start-up checks. Anything failing
 * while re-forming exits 75, and the agent restarts the whole group.
 *
 * The state is struct run's in_place, generation, recover and redo
 * (trainer/run.h); the log lines are T6210-T6213.
 */
#ifndef CDDP_TRAINER_INPLACE_H
#define CDDP_TRAINER_INPLACE_H

#include <stdbool.h>

struct run;
struct trn_comm_error;

/* Reads CDDP_RESTART_SCOPE and CDDP_GENERATION (after the flags: rank and
 * world known); a bad generation refuses (exit 2). */
void trn_inplace_setup(struct run *r);

/* True for a replacement that takes its weights from a peer: setup skips
 * the initialisation and --init. */
bool trn_inplace_replacement(const struct run *r);

/* Before connecting: off, with a warning (T6213), on a backend other than
 * gloo and nccl. */
void trn_inplace_check_backend(struct run *r);

/* After resume: the redo buffers, and the step to redo set to the start. */
void trn_inplace_start(struct run *r);

/* Around each optimizer step over batches [b0, b1) of epoch: where to
 * come back to if one of its collectives fails, and the BN buffers from
 * before it; then the step after it. No-ops unless in place. */
void trn_inplace_before_step(struct run *r, int epoch, long b0);
void trn_inplace_after_step(struct run *r, int epoch, long b1);

/* A collective failed (run_collective_failed): under --restart_scope=worker,
 * a peer gone while the recovery point is armed (main's setjmp, around the
 * training loop) logs T6210 and jumps back to it (no return); otherwise
 * returns, and the caller exits 75. */
void trn_inplace_failed(struct run *r, const struct trn_comm_error *e);

/* Connects a replacement (generation > 0) to the re-formed group: DDP
 * over it, and the state from a peer. */
void trn_inplace_rejoin(struct run *r);

/* A survivor back at main()'s recovery point: re-forms, takes the state. */
void trn_inplace_recover(struct run *r);

/* What trn_inplace_start allocated (none: nothing). */
void trn_inplace_free(struct run *r);

#endif
