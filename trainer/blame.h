/*
 * blame.h: a hung rank under --restart_scope=worker (docs/distributed.md,
 * "Recovering in place"). A survivor whose collective timed out asks the
 * store which ranks never reached it (trn_comm_missing) and tells its own
 * agent through the progress channel (CDDP_PROGRESS_FD: one line
 * {"blame":R,"blame_gen":N} per rank); the agent that runs rank R kills it
 * and replaces it in place, as after a crash, and the survivors re-form.
 */
#ifndef CDDP_TRAINER_BLAME_H
#define CDDP_TRAINER_BLAME_H

#include <stdbool.h>

struct run;
struct trn_comm_error;

/* e timed out (CDDP_ETIMEOUT): names the ranks that never reached it to
 * the agent (log T6214). True when at least one was named and the agent
 * was told; false (nothing told) when they are not known, none is
 * missing, or there is no progress channel: the caller exits 75. */
bool trn_blame_missing(struct run *r, const struct trn_comm_error *e);

#endif
