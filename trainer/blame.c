/* blame.c: naming a hung rank to the agent; see blame.h. */
#include "trainer/blame.h"

#include <stdio.h>

#include "common/errors.h"        /* CDDP_ETIMEOUT */
#include "common/log.h"           /* log_warn */
#include "proto/progress.h"       /* PROGRESS_BLAMES_KEPT */
#include "trainer/comm/comm.h"    /* trn_comm_missing */
#include "trainer/comm/failure.h" /* trn_comm_failure_message */
#include "trainer/progress_fd.h"  /* trn_progress_fd_blame */
#include "trainer/run.h"          /* struct run */

/* How long the store is asked (the agent's own store, on this node or
 * near it: an answer takes milliseconds). */
#define BLAME_ASK_S 1.0
/* (at most what the agent keeps of one read: proto/progress.h) */
#define BLAME_MAX PROGRESS_BLAMES_KEPT

bool trn_blame_missing(struct run *r, const struct trn_comm_error *e)
{
    if (e->code != CDDP_ETIMEOUT || r->dist.comm == NULL || r->progress.fd < 0)
        return false;
    int missing[BLAME_MAX];
    int n = trn_comm_missing(r->dist.comm, BLAME_ASK_S, missing, BLAME_MAX);
    if (n <= 0)
        return false;
    if (n > BLAME_MAX)
        n = BLAME_MAX;
    char who[BLAME_MAX * 12] = "";
    size_t at = 0;
    for (int i = 0; i < n && at < sizeof(who); i++)
        at += (size_t)snprintf(who + at, sizeof(who) - at, "%s%d", i ? ", " : "", missing[i]);
    if (trn_progress_fd_blame(&r->progress, missing, n, r->generation) != 0)
        return false;
    char msg[1024];
    trn_comm_failure_message(e, r->in_step, r->rank, msg, sizeof(msg));
    log_warn("T6214",
             "%s; rank%s %s never reached it: named to the agent, which replaces %s in place "
             "(--restart_scope=worker, generation %ld)",
             msg, n == 1 ? "" : "s", who, n == 1 ? "it" : "them", r->generation);
    return true;
}
