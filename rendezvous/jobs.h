/*
 * jobs.h: cddp-rdzv's job-wide statistics (rendezvous/jobstats.h) as the
 * daemon runs them: fed from the server's hooks on its loop, read by the
 * status page on the loop (/status, /metrics) and by GET /history?run= on
 * the status port's thread, under a lock held only to copy.
 *
 *     struct rdzv_jobs *jobs = rdzv_jobs_new();
 *     o.on_heartbeat = rdzv_jobs_on_heartbeat;
 *     o.on_action = rdzv_jobs_on_action;
 *     o.jobs_arg = jobs;
 *     ... (the status port's on_history: rdzv_jobs_history, jobs)
 *     rdzv_jobs_free(jobs);  // after the server and the status port stopped
 *
 * An agent hosting the server (agent/rdzv_c10d.c) feeds one the same way;
 * its status port (agent/status.c) owns it and reads it as cddp-rdzv's.
 */
#ifndef CDDP_RENDEZVOUS_JOBS_H
#define CDDP_RENDEZVOUS_JOBS_H

#include <stdint.h>

#include "common/strutil.h"
#include "proto/msg.h"
#include "rendezvous/jobstats.h"
#include "rendezvous/state.h"

struct rdzv_jobs;

/* NULL when out of memory. */
struct rdzv_jobs *rdzv_jobs_new(void);
void rdzv_jobs_free(struct rdzv_jobs *j);

/* rdzv_server_options hooks (arg: the jobs). */
void rdzv_jobs_on_heartbeat(void *arg, const char *run_id, const char *node_id,
                            const struct proto_msg *m);
void rdzv_jobs_on_action(void *arg, const char *run_id, const struct rdzv_action *a);

/* On the loop's thread only (the one that feeds it): read without the lock. */
const struct jobstats *rdzv_jobs_stats(const struct rdzv_jobs *j);

struct rdzv_view_builder; /* rendezvous/view.h */
/* Each run of a view just built (rdzv_view_build) gains its job-wide
 * goodput. On the loop's thread only, like rdzv_jobs_stats. */
void rdzv_jobs_add_goodput(const struct rdzv_jobs *j, struct rdzv_view_builder *b, double now);

/* status_server_options.on_history (any thread): the history of run
 * (?run=) newer than since. CDDP_EPARSE when run is NULL or empty,
 * CDDP_ENOTFOUND when the run is not known, -ENOMEM, or 0. */
int rdzv_jobs_history(void *arg, const char *run, uint64_t since, struct cddp_buf *out);

#endif
