/*
 * spare.h: cddp-train as a warm spare (cddprun --spare_workers; the
 * protocol in docs/distributed.md, "Warm spares"). Started with
 * CDDP_SPARE=1 and CDDP_SPARE_FD, it makes everything that does not
 * depend on its rank (the device, the datasets, the model's memory), then
 * waits for the agent's assignment: a failed worker's whole environment
 * and its fds. From there it is that rank's replacement (CDDP_GENERATION
 * > 0) and joins the survivors as one (trainer/inplace.c). The log lines
 * are T6220-T6222.
 */
#ifndef CDDP_TRAINER_SPARE_H
#define CDDP_TRAINER_SPARE_H

#include <stdbool.h>

struct run;

/* CDDP_SPARE=1: true, with what setup needs before the assignment set in
 * r (the world from WORLD_SIZE, re-forming in place, no initialisation of
 * the weights: a replacement takes them from a peer). */
bool trn_spare_begin(struct run *r);

/* What a first step pays once, paid while the spare waits: one training
 * forward and backward of a batch of zeros, on the CPU backend (the
 * activations' and gradients' memory touched, the kernels' workspaces
 * made). The weights, buffers and counters it moves are all overwritten
 * by the peers' state when the spare joins; the momentum is not touched. */
void trn_spare_warm_up(struct run *r);

/* Blocks until the agent's assignment: the environment replaced by it,
 * the fds it passes placed (stdout, stderr, the progress channel). Exits
 * 0 when the agent closes the socket without one; refuses (exit 2) an
 * assignment it cannot use. */
void trn_spare_wait(struct run *r);

/* After the assignment's environment is read: refuses (exit 2) one that
 * is not a replacement re-forming in place. */
void trn_spare_check(const struct run *r);

#endif
